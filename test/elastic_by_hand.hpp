// SPDX-License-Identifier: Apache-2.0
#pragma once

// Blocking DiLoCo rounds over a changing membership, by hand in double (as
// test_elastic_threads.cpp replays them): each member of a round (named by
// its starting rank) runs `steps` SGD steps of lr `inner_lr` from
// theta_global towards its target of the round, `target(rank, round, i)`
// (rounds counted from 1); the mean pseudo-gradient d takes one Nesterov
// step (torch.optim.SGD, nesterov=True: b = d the first round, then
// b = mu b + d; theta -= lr (d + mu b)). Start: every element 0.5.

#include <cstddef>
#include <cstdint>
#include <vector>

template <class Target>
std::vector<double> elastic_by_hand(std::size_t n, std::size_t steps, double inner_lr, double outer_lr, double mu,
                                    const std::vector<std::vector<int>>& members_per_round, Target&& target) {
  std::vector<double> theta(n, 0.5), b(n, 0.0);
  std::uint64_t round = 0;
  for (const auto& members : members_per_round) {
    ++round;
    std::vector<double> d(n, 0.0);
    for (int id : members) {
      std::vector<double> x = theta;
      for (std::size_t s = 0; s < steps; ++s)
        for (std::size_t i = 0; i < n; ++i) x[i] -= inner_lr * (x[i] - target(id, round, i));
      for (std::size_t i = 0; i < n; ++i) d[i] += (theta[i] - x[i]) / static_cast<double>(members.size());
    }
    for (std::size_t i = 0; i < n; ++i) {
      b[i] = round == 1 ? d[i] : mu * b[i] + d[i];
      theta[i] -= outer_lr * (d[i] + mu * b[i]);
    }
  }
  return theta;
}
