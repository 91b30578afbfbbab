// SPDX-License-Identifier: Apache-2.0
// Two-level meshes (comm/mesh.hpp) and replicated groups with sharded outer
// state (replicated.hpp), on comm::threads. The reference is flat DiLoCo
// with R workers over the same data: an R x G mesh whose groups average
// identical gradients must give exactly (memcmp) its theta_global and its
// replicas, for sync::blocking and one_step_delay, with compress::none and
// int4 + error feedback; the shard cut must fall on codec blocks and
// balance; bad meshes are the same config_error on every rank.
#include <doctest/doctest.h>

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <cmath>
#include <cstring>
#include <diloco/diloco.hpp>
#include <diloco/replicated.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

#include "mesh_problem.hpp"
#include "same_bits.hpp"

namespace dc = diloco;
namespace cp = diloco::compress;

using namespace mesh_problem;

namespace {

struct mesh_result {
  std::vector<std::vector<float>> replica;       // per world rank
  std::vector<std::vector<float>> global;        // per world rank: copy_global_to (full)
  std::vector<std::vector<float>> shard_global;  // per world rank: the shard's theta_global
  std::vector<std::vector<dc::shard_piece>> pieces;
  std::vector<int> group;
};

template <class C, class Sync>
mesh_result run_mesh(int R, int G) {
  const int W = R * G;
  mesh_result out;
  out.replica.resize(static_cast<std::size_t>(W));
  out.global.resize(static_cast<std::size_t>(W));
  out.shard_global.resize(static_cast<std::size_t>(W));
  out.pieces.resize(static_cast<std::size_t>(W));
  out.group.resize(static_cast<std::size_t>(W));
  dc::comm::threads::world world(W);
  world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
    train_on_mesh<C, Sync>(m, [&](auto& a, std::vector<float> replica, std::vector<float> global) {
      const auto w = static_cast<std::size_t>(comm.rank());
      out.replica[w] = std::move(replica);
      out.global[w] = std::move(global);
      const auto sg = a.global_parameters();
      out.shard_global[w].assign(sg.data(), sg.data() + sg.size());
      out.pieces[w] = a.shard(m.position());
      out.group[w] = m.group();
      CHECK(a.shard_algorithm().parameter_count() == a.shard_elements(m.position()));
      CHECK(a.shard_algorithm().world_size() == R);
    });
  });
  return out;
}

std::size_t offset_of(std::size_t k) {
  std::size_t o = 0;
  for (std::size_t j = 0; j < k; ++j) o += sizes[j];
  return o;
}

template <class C, class Sync>
void check_mesh_equals_flat() {
  const int R = 2, G = 2;
  const flat_result flat = run_flat<C, Sync>(R);
  const mesh_result mesh = run_mesh<C, Sync>(R, G);
  // The reference moved: training happened and the groups differ.
  const auto init = concat_all(initial_params());
  CHECK_FALSE(same_bits(flat.global[0], init));
  INFO(std::string(Sync::name));
  if constexpr (std::is_same_v<Sync, dc::sync::delayed>)
    CHECK(same_bits(flat.replica[0], flat.global[0]));  // finish(): the replica becomes theta_global
  else
    CHECK_FALSE(same_bits(flat.replica[0], flat.replica[1]));
  for (int w = 0; w < R * G; ++w) {
    const auto r = static_cast<std::size_t>(mesh.group[static_cast<std::size_t>(w)]);
    CHECK(r == static_cast<std::size_t>(w / G));
    CHECK(same_bits(mesh.replica[static_cast<std::size_t>(w)], flat.replica[r]));
    CHECK(same_bits(mesh.global[static_cast<std::size_t>(w)], flat.global[r]));
    // The shard's own theta_global is the flat one's at the pieces' places.
    std::vector<float> expected;
    for (const auto& pc : mesh.pieces[static_cast<std::size_t>(w)])
      expected.insert(expected.end(), flat.global[r].begin() + static_cast<std::ptrdiff_t>(offset_of(pc.tensor) + pc.start),
                      flat.global[r].begin() + static_cast<std::ptrdiff_t>(offset_of(pc.tensor) + pc.start + pc.size));
    CHECK(same_bits(mesh.shard_global[static_cast<std::size_t>(w)], expected));
  }
}

}  // namespace

TEST_CASE("comm::threads::split: groups by color, ranked by key, each its own communicator") {
  dc::comm::threads::world world(5);
  std::mutex mu;
  std::vector<std::pair<int, int>> seen(5);
  world.run([&](dc::comm::threads& comm) {
    const int color = comm.rank() % 2;        // {0, 2, 4} and {1, 3}
    auto sub = comm.split(color, -comm.rank());  // reversed order
    std::vector<float> v{static_cast<float>(comm.rank())};
    sub->all_reduce(v, dc::reduce_op::sum);
    std::lock_guard lock(mu);
    seen[static_cast<std::size_t>(comm.rank())] = {sub->rank(), static_cast<int>(v[0])};
    CHECK(sub->size() == (color == 0 ? 3 : 2));
  });
  // Color 0: ranks 4, 2, 0 become 0, 1, 2; sum 6. Color 1: 3, 1 -> 0, 1; sum 4.
  CHECK(seen[0] == std::pair{2, 6});
  CHECK(seen[2] == std::pair{1, 6});
  CHECK(seen[4] == std::pair{0, 6});
  CHECK(seen[1] == std::pair{1, 4});
  CHECK(seen[3] == std::pair{0, 4});
}

TEST_CASE("comm::threads::split: a rank that fails or returns fails its split groups too, without a timeout") {
  // A 20 s timeout: if the failure did not reach the split groups, their
  // other ranks would wait for it that long; they must fail at once.
  dc::comm::threads::world world(4, std::chrono::seconds(20));
  std::atomic<int> echoes{0};
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = 2});
    if (comm.rank() == 3) throw std::runtime_error("rank 3 stops here");
    std::vector<float> v{1.0f};
    try {
      m.intra().all_reduce(v, dc::reduce_op::mean);  // group 1 (ranks 2, 3) fails
      m.inter().all_reduce(v, dc::reduce_op::mean);  // positions 0 and 1 fail (ranks 2 and 3 are gone)
    } catch (const dc::comm_error&) {
      ++echoes;
      throw;
    }
  }),
                       "rank 3 stops here", std::runtime_error);
  CHECK(echoes.load() == 3);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("mesh: group r = w / G, position g = w % G; intra holds the group, inter the position") {
  dc::comm::threads::world world(6);
  world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = 3});
    const int w = comm.rank();
    CHECK(m.groups() == 2);
    CHECK(m.group() == w / 3);
    CHECK(m.position() == w % 3);
    CHECK(m.intra().size() == 3);
    CHECK(m.intra().rank() == w % 3);
    CHECK(m.inter().size() == 2);
    CHECK(m.inter().rank() == w / 3);
    // Sum of the world ranks over intra: 0+1+2 or 3+4+5; over inter: g + (g+3).
    std::vector<float> a{static_cast<float>(w)}, b{static_cast<float>(w)};
    m.intra().all_reduce(a, dc::reduce_op::sum);
    m.inter().all_reduce(b, dc::reduce_op::sum);
    CHECK(a[0] == (w < 3 ? 3.0f : 12.0f));
    CHECK(b[0] == static_cast<float>(2 * (w % 3) + 3));
  });
}

TEST_CASE("mesh: explicit group and position") {
  dc::comm::threads::world world(4);
  world.run([&](dc::comm::threads& comm) {
    const int w = comm.rank();
    // Column-major: w = g * R + r.
    dc::mesh<dc::comm::threads> m(comm, {.group_size = 2, .group = w % 2, .position = w / 2});
    std::vector<float> a{static_cast<float>(w)};
    m.intra().all_reduce(a, dc::reduce_op::sum);
    CHECK(a[0] == static_cast<float>((w % 2) + (w % 2 + 2)));
  });
}

TEST_CASE("mesh: bad meshes are the same config_error on every rank") {
  auto expect_everywhere = [](int W, auto shape_of, const std::string& needle) {
    dc::comm::threads::world world(W);
    std::atomic<int> caught{0};
    world.run([&](dc::comm::threads& comm) {
      try {
        dc::mesh<dc::comm::threads> m(comm, shape_of(comm.rank()));
      } catch (const dc::config_error& e) {
        const std::string what = e.what();
        INFO(what);
        CHECK(what.find(needle) != std::string::npos);
        ++caught;
      }
    });
    CHECK(caught.load() == W);
  };
  expect_everywhere(4, [](int) { return dc::mesh_shape{.group_size = 3}; },
                    "the world has 4 ranks, which is not a multiple of the group size G = 3");
  expect_everywhere(4, [](int r) { return dc::mesh_shape{.group_size = r == 2 ? 4 : 2}; },
                    "the ranks disagree on the group size G: rank 0 passed 2, rank 2 passed 4");
  expect_everywhere(2, [](int) { return dc::mesh_shape{.group_size = 0}; }, "must be >= 1, got 0");
  expect_everywhere(4, [](int) { return dc::mesh_shape{.group_size = 2, .group = 0, .position = 1}; },
                    "ranks 0 and 1 both claim group 0 position 1");
  expect_everywhere(4, [](int r) { return dc::mesh_shape{.group_size = 2, .group = r / 2 + 1, .position = r % 2}; },
                    "expected a group in [0, 2)");
  expect_everywhere(4, [](int) { return dc::mesh_shape{.group_size = 2, .group = 1}; },
                    "but not both");
}

TEST_CASE("replicated: shards are balanced and cut only at codec blocks of the tensor being cut") {
  dc::comm::threads::world world(4);
  world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = 2});
    auto p = initial_params();
    dc::replicated<dc::inner::sgd, dc::outer::nesterov, int4_ef, dc::comm::threads> a(p, m, {.inner_steps = H});
    static_assert(decltype(a)::block == 64);
    // 967 elements in blocks of 64 per tensor: tensor 0 has blocks at 0..640
    // (the last 60 long), so the even split (483.5) falls in the block at
    // 448; that block's first element is below it: shard 0 ends at 512.
    REQUIRE(a.shard(0).size() == 1);
    CHECK(a.shard(0)[0].tensor == 0);
    CHECK(a.shard(0)[0].start == 0);
    CHECK(a.shard(0)[0].size == 512);
    REQUIRE(a.shard(1).size() == 3);
    CHECK(a.shard(1)[0].tensor == 0);
    CHECK(a.shard(1)[0].start == 512);
    CHECK(a.shard(1)[0].size == 188);
    CHECK(a.shard(1)[1].tensor == 1);
    CHECK(a.shard(1)[1].size == 77);
    CHECK(a.shard(1)[2].size == 190);
    CHECK(a.shard_elements(0) + a.shard_elements(1) == 967);
    // Balanced within one block.
    const auto d = static_cast<long>(a.shard_elements(0)) - static_cast<long>(a.shard_elements(1));
    CHECK(std::abs(d) <= 64);
  });
}

TEST_CASE("replicated 2 x 2 equals flat DiLoCo with 2 workers: blocking, compress::none") {
  check_mesh_equals_flat<cp::none, dc::sync::blocking>();
}

TEST_CASE("replicated 2 x 2 equals flat DiLoCo with 2 workers: blocking, int4 + error feedback") {
  check_mesh_equals_flat<int4_ef, dc::sync::blocking>();
}

TEST_CASE("replicated 2 x 2 equals flat DiLoCo with 2 workers: one_step_delay, compress::none") {
  check_mesh_equals_flat<cp::none, dc::sync::one_step_delay>();
}

TEST_CASE("replicated 2 x 2 equals flat DiLoCo with 2 workers: one_step_delay, int4 + error feedback") {
  check_mesh_equals_flat<int4_ef, dc::sync::one_step_delay>();
}

TEST_CASE("replicated: a 1 x 4 mesh (one group) equals one worker; a 4 x 1 mesh equals flat with 4") {
  {
    const flat_result flat = run_flat<int4_ef, dc::sync::blocking>(4);
    const mesh_result mesh = run_mesh<int4_ef, dc::sync::blocking>(4, 1);
    for (std::size_t w = 0; w < 4; ++w) {
      CHECK(same_bits(mesh.replica[w], flat.replica[w]));
      CHECK(same_bits(mesh.global[w], flat.global[w]));
    }
  }
  {
    const flat_result flat = run_flat<cp::none, dc::sync::blocking>(1);
    const mesh_result mesh = run_mesh<cp::none, dc::sync::blocking>(1, 4);
    for (std::size_t w = 0; w < 4; ++w) {
      CHECK(same_bits(mesh.replica[w], flat.replica[0]));
      CHECK(same_bits(mesh.global[w], flat.global[0]));
    }
  }
}

// inner::external: the user's SGD on the full replica; the reference is flat
// DiLoCo with inner::external and the same SGD. The replicas are compared
// after every step, so a write of the replica that was not gathered shows.
template <class C, class Sync>
void check_external() {
  auto user_step = [](std::vector<std::vector<float>>& p, int r, int s) {
    for (std::size_t k = 0; k < p.size(); ++k)
      for (std::size_t i = 0; i < p[k].size(); ++i) p[k][i] -= 0.1f * grad_of(r, s, k, i, p[k][i]);
  };
  // [rank][step]: the replica after step s (the last entry after finish()).
  std::vector<std::vector<std::vector<float>>> flat(2), meshed(4);
  {
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      auto p = initial_params();
      dc::algorithm<dc::inner::external, dc::outer::nesterov, C, dc::comm::threads, Sync> a(p, comm,
                                                                                            {.inner_steps = H});
      auto& mine = flat[static_cast<std::size_t>(comm.rank())];
      for (int s = 0; s < steps; ++s) {
        user_step(p, comm.rank(), s);
        a.step();
        mine.push_back(concat_all(p));
      }
      a.finish();
      mine.push_back(concat_all(p));
    });
  }
  {
    dc::comm::threads::world world(4);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = 2});
      auto p = initial_params();
      dc::replicated<dc::inner::external, dc::outer::nesterov, C, dc::comm::threads, Sync> a(p, m,
                                                                                             {.inner_steps = H});
      auto& mine = meshed[static_cast<std::size_t>(comm.rank())];
      for (int s = 0; s < steps; ++s) {
        user_step(p, m.group(), s);
        a.step();
        mine.push_back(concat_all(p));
      }
      a.finish();
      mine.push_back(concat_all(p));
    });
  }
  INFO(std::string(Sync::name));
  CHECK_FALSE(same_bits(flat[0][steps - 1], flat[1][steps - 1]));
  for (std::size_t w = 0; w < 4; ++w)
    for (std::size_t s = 0; s <= static_cast<std::size_t>(steps); ++s) {
      INFO("rank ", w, ", after step ", s);
      CHECK(same_bits(meshed[w][s], flat[w / 2][s]));
    }
}

TEST_CASE("replicated: inner::external steps the full replica; rounds gather the shards, every schedule") {
  check_external<cp::none, dc::sync::blocking>();
  check_external<int4_ef, dc::sync::blocking>();
  check_external<int4_ef, dc::sync::one_step_delay>();
  check_external<int4_ef, dc::sync::eager>();
  check_external<int4_ef, dc::sync::delayed>();
}

TEST_CASE("replicated: inner clipping and too small a model are config_errors") {
  dc::comm::threads::world world(4);
  std::atomic<int> clipping{0}, small{0};
  world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = 2});
    auto p = initial_params();
    try {
      dc::replicated<dc::inner::sgd, dc::outer::nesterov, cp::none, dc::comm::threads> a(
          p, m, {.inner_steps = H, .inner = {.lr = 0.1f, .max_grad_norm = 1.0f}});
    } catch (const dc::config_error& e) {
      if (std::string(e.what()).find("max_grad_norm = 1") != std::string::npos) ++clipping;
    }
    std::vector<float> tiny(40);
    try {
      dc::replicated<dc::inner::sgd, dc::outer::nesterov, int4_ef, dc::comm::threads> a(tiny, m, {.inner_steps = H});
    } catch (const dc::config_error& e) {
      if (std::string(e.what()).find("shard 1 of 2 is empty") != std::string::npos) ++small;
    }
  });
  CHECK(clipping.load() == 4);
  CHECK(small.load() == 4);
}

TEST_CASE("replicated 2 x 2 equals flat DiLoCo with 2 workers: eager and delayed, int4 + error feedback") {
  check_mesh_equals_flat<int4_ef, dc::sync::eager>();
  check_mesh_equals_flat<int4_ef, dc::sync::delayed>();
  check_mesh_equals_flat<cp::none, dc::sync::eager>();
}

TEST_CASE("replicated 2 x 2 equals flat DiLoCo with 2 workers: chunk_topk + error feedback (gathered mean)") {
  using sparse = cp::error_feedback<cp::chunk_topk<128, 8, dc::int4>>;
  static_assert(dc::replicated<dc::inner::sgd, dc::outer::nesterov, sparse, dc::comm::threads>::block == 128);
  check_mesh_equals_flat<sparse, dc::sync::blocking>();
}

TEST_CASE("mesh_shape::from_env: DILOCO_ variables, torchrun's as fallback, bad values named") {
  const char* names[] = {"DILOCO_GROUP_SIZE", "LOCAL_WORLD_SIZE", "DILOCO_GROUP_RANK", "GROUP_RANK",
                         "DILOCO_LOCAL_RANK", "LOCAL_RANK"};
  for (const char* n : names) unsetenv(n);
  CHECK_THROWS_WITH_AS(dc::mesh_shape::from_env(), doctest::Contains("neither DILOCO_GROUP_SIZE nor LOCAL_WORLD_SIZE"),
                       dc::config_error);
  setenv("LOCAL_WORLD_SIZE", "8", 1);
  auto s = dc::mesh_shape::from_env();
  CHECK(s.group_size == 8);
  CHECK(s.group == -1);
  CHECK(s.position == -1);
  setenv("DILOCO_GROUP_SIZE", "4", 1);
  setenv("GROUP_RANK", "3", 1);
  setenv("LOCAL_RANK", "2", 1);
  s = dc::mesh_shape::from_env();
  CHECK(s.group_size == 4);
  CHECK(s.group == 3);
  CHECK(s.position == 2);
  setenv("DILOCO_LOCAL_RANK", "1", 1);
  CHECK(dc::mesh_shape::from_env().position == 1);
  unsetenv("GROUP_RANK");
  CHECK_THROWS_WITH_AS(dc::mesh_shape::from_env(),
                       doctest::Contains("DILOCO_LOCAL_RANK is set but DILOCO_GROUP_RANK (or GROUP_RANK) is not"),
                       dc::config_error);
  setenv("DILOCO_GROUP_SIZE", "4x", 1);
  CHECK_THROWS_WITH_AS(dc::mesh_shape::from_env(), doctest::Contains("DILOCO_GROUP_SIZE='4x' is not an integer >= 1"),
                       dc::config_error);
  setenv("DILOCO_GROUP_SIZE", "0", 1);
  CHECK_THROWS_AS(dc::mesh_shape::from_env(), dc::config_error);
  for (const char* n : names) unsetenv(n);
}

TEST_CASE("replicated: each rank keeps state for its shard only (1/G of flat DiLoCo's, per element)") {
  // Every state buffer is per element, so a rank's state floats are the
  // flat worker's times shard elements / model elements.
  auto floats_of = [](const std::vector<dc::state_entry>& st) {
    std::size_t n = 0;
    for (const auto& e : st)
      if (!e.is_scalar) n += e.size;
    return n;
  };
  std::size_t flat_floats = 0;
  {
    dc::comm::threads::world world(2);
    world.run([&](dc::comm::threads& comm) {
      auto p = initial_params();
      dc::algorithm<dc::inner::sgd, dc::outer::nesterov, int4_ef, dc::comm::threads> a(
          p, comm, {.inner_steps = H, .inner = {.lr = 0.1f, .momentum = 0.9f}});
      if (comm.rank() == 0) flat_floats = floats_of(a.state());
    });
  }
  const std::size_t total = 967;
  // theta_global, outer momentum, residual, inner momentum: 4 floats a parameter.
  CHECK(flat_floats == 4 * total);
  for (int G : {2, 4}) {
    dc::comm::threads::world world(2 * G);
    std::vector<std::size_t> floats(static_cast<std::size_t>(2 * G)), elements(static_cast<std::size_t>(2 * G));
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
      auto p = initial_params();
      dc::replicated<dc::inner::sgd, dc::outer::nesterov, int4_ef, dc::comm::threads> a(
          p, m, {.inner_steps = H, .inner = {.lr = 0.1f, .momentum = 0.9f}});
      floats[static_cast<std::size_t>(comm.rank())] = floats_of(a.shard_algorithm().state());
      elements[static_cast<std::size_t>(comm.rank())] = a.shard_elements(m.position());
    });
    std::size_t group_elements = 0;
    for (int w = 0; w < 2 * G; ++w) {
      CHECK(floats[static_cast<std::size_t>(w)] * total == flat_floats * elements[static_cast<std::size_t>(w)]);
      if (w < G) group_elements += elements[static_cast<std::size_t>(w)];
    }
    CHECK(group_elements == total);
  }
}

TEST_CASE("replicated: the replica's gather in chunks (set_gather_chunk) keeps the bits of flat DiLoCo") {
  // 2 x 2 mesh over the shared problem (shards of 512 and 455 elements),
  // gathered 100 elements of each shard at a time: 6 all_gathers per
  // gather, chunks that start inside a piece and end across tensors, the
  // shorter shard padded in the last. Reference: flat DiLoCo, 2 workers.
  using algo_mesh = dc::replicated<dc::inner::sgd, dc::outer::nesterov, int4_ef, dc::comm::threads>;
  const flat_result flat = run_flat<int4_ef, dc::sync::blocking>(2);
  std::vector<std::vector<float>> replica(4), global(4);
  dc::comm::threads::world world(4);
  world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = 2});
    train_on_mesh<int4_ef, dc::sync::blocking>(
        m,
        [&](auto& a, std::vector<float> r, std::vector<float> g) {
          const auto w = static_cast<std::size_t>(comm.rank());
          replica[w] = std::move(r);
          global[w] = std::move(g);
          CHECK(a.shard_elements(m.position()) > 4 * a.gather_chunk());
        },
        [](algo_mesh& a) {
          CHECK(a.gather_chunk() == algo_mesh::default_gather_chunk);
          CHECK_THROWS_AS(a.set_gather_chunk(0), dc::config_error);
          a.set_gather_chunk(100);
        });
  });
  REQUIRE_FALSE(same_bits(flat.replica[0], flat.replica[1]));
  for (std::size_t w = 0; w < 4; ++w) {
    CHECK(same_bits(replica[w], flat.replica[w / 2]));
    CHECK(same_bits(global[w], flat.global[w / 2]));
  }
}

TEST_CASE("replicated's cut equals compress::block_layout's partition, without listing the blocks") {
  // The reference lists every block (compress::block_layout, one entry per
  // block) and merges each shard's runs of one tensor into pieces.
  auto by_layout = [](const std::vector<std::size_t>& tensor_sizes, std::size_t block, int g) {
    const cp::block_layout layout(tensor_sizes, block, g);
    std::vector<std::vector<dc::shard_piece>> out(static_cast<std::size_t>(g));
    for (int s = 0; s < g; ++s)
      for (std::size_t b = layout.first_block(s); b < layout.first_block(s) + layout.blocks_in(s); ++b) {
        const auto& r = layout.blocks()[b];
        auto& pieces = out[static_cast<std::size_t>(s)];
        if (!pieces.empty() && pieces.back().tensor == r.tensor && pieces.back().start + pieces.back().size == r.start)
          pieces.back().size += r.len;
        else
          pieces.push_back({r.tensor, r.start, r.len});
      }
    return out;
  };
  const std::vector<std::vector<std::size_t>> lists = {
      {700, 77, 190}, {1}, {64, 64, 64, 64}, {65, 0, 3, 129}, {1000}, {5, 5, 5, 5, 5, 5, 5}, {0, 300, 0, 7}, {4097, 1}};
  int compared = 0;
  for (const auto& tensor_sizes : lists)
    for (std::size_t block : {1, 2, 64, 128})
      for (int g = 1; g <= 5; ++g) {
        const auto reference = by_layout(tensor_sizes, block, g);
        bool any_empty = false;
        for (const auto& sh : reference) any_empty = any_empty || sh.empty();
        INFO("block ", block, ", G = ", g, ", tensors ", tensor_sizes.size());
        if (any_empty) {
          CHECK_THROWS_AS(dc::detail_replicated::cut(tensor_sizes, block, static_cast<std::size_t>(g)), dc::config_error);
          continue;
        }
        const auto mine = dc::detail_replicated::cut(tensor_sizes, block, static_cast<std::size_t>(g));
        REQUIRE(mine.size() == reference.size());
        for (std::size_t s = 0; s < mine.size(); ++s) {
          REQUIRE(mine[s].size() == reference[s].size());
          for (std::size_t k = 0; k < mine[s].size(); ++k) {
            CHECK(mine[s][k].tensor == reference[s][k].tensor);
            CHECK(mine[s][k].start == reference[s][k].start);
            CHECK(mine[s][k].size == reference[s][k].size);
          }
        }
        ++compared;
      }
  CHECK(compared > 100);
}

namespace {

namespace fs = std::filesystem;

using ckpt_mesh =
    dc::replicated<dc::inner::sgd, dc::outer::nesterov, int4_ef, dc::comm::threads, dc::sync::one_step_delay>;
ckpt_mesh::options ckpt_opts() { return {.inner_steps = H, .inner = {.lr = 0.1f, .momentum = 0.9f}}; }

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every rank's state_error message by world rank ("" if none was raised;
// another exception type fails the test there).
struct state_errors {
  std::mutex lock;
  std::vector<std::string> what;
  explicit state_errors(int w) : what(static_cast<std::size_t>(w)) {}
  template <class F>
  void on(int rank, F&& f) {
    try {
      f();
    } catch (const dc::state_error& e) {
      std::lock_guard<std::mutex> g(lock);
      what[static_cast<std::size_t>(rank)] = e.what();
    }
  }
};

}  // namespace

TEST_CASE("replicated: checkpoints per shard with a mesh manifest resume bitwise on the same mesh") {
  const fs::path dir = fs::temp_directory_path() / ("diloco_test_mesh_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  // Run A: 14 steps, saving at steps 3, 6 and 9 (one-step delay: rounds 0,
  // 1 and 2 applied by then), the replica and theta_global at step 9 and at the end.
  std::vector<std::vector<float>> at9(4), replica_end(4), global_end(4);
  {
    dc::comm::threads::world world(4);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = 2});
      auto p = initial_params();
      ckpt_mesh a(p, m, ckpt_opts());
      train_range(a, m, p, 0, 3);
      a.save_round(dir.string());  // round 0: removed with its manifest by the save of round 2 (keep = 2)
      train_range(a, m, p, 3, 6);
      a.save_round(dir.string());
      train_range(a, m, p, 6, 9);
      const std::string path = a.save_round(dir.string());
      const fs::path folder =
          dir / ("position-" + std::to_string(m.position())) / ("rank-" + std::to_string(m.group()));
      CHECK(path == (folder / "round-2.ckpt").string());
      // The manifest, by hand: 967 elements in tensors of 700, 77, 190, cut
      // at 512 (codec blocks of 64; see the cut's test above).
      const std::string expected =
          std::string("diloco mesh manifest 1\nkind replicated\ngroups 2\ngroup_size 2\n") +
          "group " + std::to_string(m.group()) + "\nposition " + std::to_string(m.position()) +
          "\nmodel_elements 967\nmodel_tensors 700 77 190\ncodec_block 64\ngroup_cut 512 455\n" +
          (m.position() == 0 ? "shard_elements 512\nshard_pieces 0:0+512\n"
                             : "shard_elements 455\nshard_pieces 0:512+188 1:0+77 2:0+190\n");
      CHECK(read_text(folder / "round-2.mesh") == expected);
      CHECK(fs::exists(folder / "round-1.mesh"));
      CHECK_FALSE(fs::exists(folder / "round-0.ckpt"));
      CHECK_FALSE(fs::exists(folder / "round-0.mesh"));
      const auto w = static_cast<std::size_t>(comm.rank());
      at9[w] = concat_all(p);
      train_range(a, m, p, 9, steps);
      a.finish();
      replica_end[w] = concat_all(p);
      global_end[w] = whole_global(a, p);
    });
  }
  REQUIRE_FALSE(same_bits(replica_end[0], replica_end[2]));  // the groups differ
  // Run B: a fresh instance resumes from round 2 and trains steps 9 to 14:
  // the same bits. Right after the load, the whole replica (the other
  // position's shard gathered) is run A's at step 9.
  std::atomic<int> resumed{0};
  {
    dc::comm::threads::world world(4);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = 2});
      auto p = initial_params();
      ckpt_mesh b(p, m, ckpt_opts());
      if (b.load_latest_common(dir.string()) == 2) ++resumed;
      const auto w = static_cast<std::size_t>(comm.rank());
      INFO("world rank ", w);
      CHECK(same_bits(concat_all(p), at9[w]));
      train_range(b, m, p, 9, steps);
      b.finish();
      CHECK(same_bits(concat_all(p), replica_end[w]));
      CHECK(same_bits(whole_global(b, p), global_end[w]));
    });
  }
  CHECK(resumed == 4);
  fs::remove_all(dir);
}

TEST_CASE("replicated: restoring onto another group size or cut is the same state_error on every rank") {
  const fs::path dir = fs::temp_directory_path() / ("diloco_test_mesh_regroup_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    dc::comm::threads::world world(4);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = 2});
      auto p = initial_params();
      ckpt_mesh a(p, m, ckpt_opts());
      train_range(a, m, p, 0, 3);
      a.save_round(dir.string());
    });
  }
  // A world of W ranks as groups of G over a model of tensors `model`,
  // trained 2 steps, then load_latest_common: every rank must raise the same
  // state_error and keep its replica and theta_global.
  auto refused_on = [&](int W, int G, std::vector<std::size_t> model) {
    state_errors r(W);
    dc::comm::threads::world world(W);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = G});
      std::vector<std::vector<float>> p;
      for (std::size_t n : model) p.emplace_back(n, 0.25f);
      ckpt_mesh c(p, m, ckpt_opts());
      train_range(c, m, p, 0, 2);
      const auto replica = concat_all(p);
      const auto global = whole_global(c, p);
      r.on(comm.rank(), [&] { c.load_latest_common(dir.string()); });
      CHECK(same_bits(concat_all(p), replica));
      CHECK(same_bits(whole_global(c, p), global));
    });
    for (int w = 0; w < W; ++w) CHECK(r.what[static_cast<std::size_t>(w)] == r.what[0]);
    INFO(r.what[0]);
    CHECK(r.what[0].find("diloco::replicated::load_latest_common: the checkpoints under") != std::string::npos);
    CHECK(r.what[0].find("Restoring onto a different group size G") != std::string::npos);
    return r.what[0];
  };
  // 2 groups x 1 rank: position 0 of groups 0 and 1 find round 0 (saved
  // after 3 steps: one-step delay applies the first mean at step 6), saved
  // at G = 2.
  std::string what = refused_on(2, 1, sizes);
  CHECK(what.find("this mesh: 2 groups x 1 ranks") != std::string::npos);
  CHECK(what.find("group 0: position 0: round 0 was saved by a mesh of 2 groups x 2 ranks (group 0, position 0): "
                  "group_size: saved 2, here 1") != std::string::npos);
  // 1 group x 4 ranks: positions 2 and 3 have no files (no common round);
  // positions 0 and 1 name the mesh that saved.
  what = refused_on(4, 4, sizes);
  CHECK(what.find("this mesh: 1 groups x 4 ranks") != std::string::npos);
  CHECK(what.find("position 1: round 0 was saved by a mesh of 2 groups x 2 ranks (group 0, position 1)") !=
        std::string::npos);
  // 1 group x 2 ranks (another R, the same G): the file of group 0 names 2 groups.
  what = refused_on(2, 2, sizes);
  CHECK(what.find("this mesh: 1 groups x 2 ranks") != std::string::npos);
  CHECK(what.find("(group 0, position 1): groups: saved 2, here 1") != std::string::npos);
  // The same mesh over another model of 967 elements: position 0's shard is
  // 512 elements either way, but the cut differs.
  what = refused_on(4, 2, {900, 67});
  CHECK(what.find("this mesh: 2 groups x 2 ranks") != std::string::npos);
  CHECK(what.find("model_tensors: saved 700 77 190, here 900 67") != std::string::npos);

  // The same mesh, and position 1 of group 0 holds a damaged file: world
  // rank 1 raises the load's format_error, rank 3 (its position in group 1)
  // algorithm::load's state_error, ranks 0 and 2 replicated's state_error
  // after putting back what they had (a new instance of the shard's
  // algorithm); every replica and theta_global is as it was.
  {
    const fs::path victim = dir / "position-1" / "rank-0" / "round-0.ckpt";
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(victim) / 2));
    f.put('\x5a');
  }
  std::vector<std::string> kind(4);
  std::vector<std::vector<float>> after(4);
  std::string position_message;
  {
    std::mutex lock;
    dc::comm::threads::world world(4);
    world.run([&](dc::comm::threads& comm) {
      dc::mesh<dc::comm::threads> m(comm, {.group_size = 2});
      auto p = initial_params();
      ckpt_mesh c(p, m, ckpt_opts());
      train_range(c, m, p, 0, 2);
      const auto replica = concat_all(p);
      const auto global = whole_global(c, p);
      const char* k = "none";
      std::string msg;
      try {
        c.load_latest_common(dir.string());
      } catch (const dc::format_error& e) {
        k = "format_error";
        msg = e.what();
      } catch (const dc::state_error& e) {
        k = "state_error";
        msg = e.what();
      }
      INFO("world rank ", comm.rank());
      CHECK(same_bits(concat_all(p), replica));
      CHECK(same_bits(whole_global(c, p), global));
      // The rebuilt instance trains on: one more step leaves the replicas
      // of a group equal (the gather pairs up across positions).
      train_range(c, m, p, 2, 3);
      std::lock_guard<std::mutex> g(lock);
      after[static_cast<std::size_t>(comm.rank())] = concat_all(p);
      kind[static_cast<std::size_t>(comm.rank())] = k;
      if (comm.rank() == 0) position_message = msg;
    });
  }
  CHECK(same_bits(after[0], after[1]));
  CHECK(same_bits(after[2], after[3]));
  CHECK_FALSE(same_bits(after[0], after[2]));
  CHECK(kind[1] == "format_error");
  CHECK(kind[3] == "state_error");
  CHECK(kind[0] == "state_error");
  CHECK(kind[2] == "state_error");
  CHECK(position_message.find("diloco::replicated::load_latest_common: round 0 could not be restored at every "
                              "position of the group (position 1:") != std::string::npos);
  fs::remove_all(dir);
}
