// SPDX-License-Identifier: Apache-2.0
// Ranks of a world as threads of one process, for the communicator tests
// whose ranks need no process of their own, and what each threw.
#pragma once

#include <exception>
#include <string>
#include <thread>
#include <vector>

// Runs fn(rank) on `size` threads and returns what each threw (or null).
template <class F>
std::vector<std::exception_ptr> run_ranks(int size, F fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

inline std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

// Whether `e` holds an exception of type E (or derived from it).
template <class E>
bool is(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}
