// SPDX-License-Identifier: Apache-2.0
// comm::nccl without a GPU: the unique-id record and its exchange through a
// real Gloo store, option validation, and clean failure where no device
// exists. Runs in every build with NCCL; the device tests are in
// test_comm_nccl_gpu.cpp and test_comm_nccl_mpi.cpp.
#include <doctest/doctest.h>
#include <gloo/rendezvous/hash_store.h>

#include <chrono>
#include <cstring>
#include <diloco/comm/elastic_nccl.hpp>
#include <diloco/comm/nccl_gloo.hpp>
#include <diloco/core/concepts.hpp>
#include <exception>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "process_harness.hpp"
#include "rank_threads.hpp"

namespace dc = diloco;
using dc::comm::nccl;
namespace detail = dc::comm::detail_nccl;

static_assert(dc::device_communicator<nccl>);
// Host spans are deleted overloads, so nccl is not a host communicator: an
// algorithm over host tensors cannot pick it by mistake.
static_assert(!dc::communicator<nccl>);
static_assert(dc::comm_request<nccl::request>);
static_assert(dc::comm::unique_id_store<gloo::rendezvous::Store>);

// The elastic NCCL communicator (comm::regrouped over the NCCL factory):
// every member compiles in every build with NCCL; its logic runs without a
// GPU in test_elastic_regrouped (a Gloo data communicator stands in for
// NCCL), and on GPUs in test_comm_nccl_gpu.
template class dc::comm::regrouped<dc::comm::nccl_factory>;
static_assert(dc::device_communicator<dc::comm::elastic_nccl> && dc::async_device_communicator<dc::comm::elastic_nccl>);
static_assert(dc::elastic_communicator<dc::comm::elastic_nccl> && !dc::communicator<dc::comm::elastic_nccl>);

namespace {

ncclUniqueId random_id(unsigned seed) {
  std::mt19937 rng(seed);
  ncclUniqueId id;
  for (char& c : id.internal) c = static_cast<char>(rng() & 0xff);
  return id;
}

bool same_id(const ncclUniqueId& a, const ncclUniqueId& b) {
  return std::memcmp(a.internal, b.internal, sizeof a.internal) == 0;
}

bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

}  // namespace

TEST_CASE("a unique-id record carries the id's 128 bytes unchanged") {
  for (unsigned seed : {1u, 2u, 3u}) {
    const ncclUniqueId id = random_id(seed);
    const std::vector<char> record = detail::encode_unique_id(id);
    CHECK(record.size() == 20 + sizeof(ncclUniqueId) + 4);
    CHECK(std::memcmp(record.data(), "DLNCCLID", 8) == 0);
    CHECK(same_id(detail::decode_unique_id(record, "test"), id));
    // Trailing bytes (MPI broadcasts a fixed-size buffer) are ignored.
    std::vector<char> padded = record;
    padded.resize(detail::record_capacity, '\x7f');
    CHECK(same_id(detail::decode_unique_id(padded, "test"), id));
  }
}

TEST_CASE("every corrupted or truncated record is a format_error") {
  const std::vector<char> record = detail::encode_unique_id(random_id(7));
  for (std::size_t i = 0; i < record.size(); ++i) {
    CAPTURE(i);
    std::vector<char> bad = record;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    CHECK_THROWS_AS(detail::decode_unique_id(bad, "test"), dc::format_error);
  }
  for (std::size_t n = 0; n < record.size(); ++n) {
    CAPTURE(n);
    CHECK_THROWS_AS(detail::decode_unique_id(std::span<const char>(record.data(), n), "test"), dc::format_error);
  }
  const std::string foreign = "not a record, just a value someone else left in the store";
  CHECK_THROWS_WITH_AS(detail::decode_unique_id(std::span<const char>(foreign.data(), foreign.size()), "key 'k'"),
                       doctest::Contains("bad magic"), dc::format_error);
}

TEST_CASE("a failure record reaches the reader as comm_error with rank 0's reason") {
  const auto record = detail::encode_failure("no network interface found");
  CHECK_THROWS_WITH_AS(detail::decode_unique_id(record, "test"),
                       doctest::Contains("rank 0 could not create the NCCL unique id: no network interface found"),
                       dc::comm_error);
  // Long reasons are cut to fit the fixed-size MPI record.
  const std::string long_reason(5000, 'x');
  const auto cut = detail::encode_failure(long_reason);
  CHECK(cut.size() <= detail::record_capacity);
  CHECK_THROWS_AS(detail::decode_unique_id(cut, "test"), dc::comm_error);
}

TEST_CASE("every rank receives rank 0's id through a Gloo store") {
  constexpr int size = 4;
  gloo::rendezvous::HashStore store;
  ncclUniqueId made{};
  std::vector<ncclUniqueId> got(size);
  const auto errors = run_ranks(size, [&](int r) {
    got[static_cast<std::size_t>(r)] =
        detail::exchange_unique_id(store, r, "job/nccl", std::chrono::seconds(30), [&] {
          made = nccl::make_unique_id();  // a real id: needs no GPU
          return made;
        });
  });
  for (int r = 0; r < size; ++r) {
    CAPTURE(r);
    REQUIRE_FALSE(errors[static_cast<std::size_t>(r)]);
    CHECK(same_id(got[static_cast<std::size_t>(r)], made));
  }
}

TEST_CASE("rank 0's failure to make the id reaches every rank at once") {
  constexpr int size = 3;
  gloo::rendezvous::HashStore store;
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(size, [&](int r) {
    detail::exchange_unique_id(store, r, "job/nccl", std::chrono::seconds(60),
                               []() -> ncclUniqueId { throw std::runtime_error("no usable network interface"); });
  });
  for (int r = 0; r < size; ++r) {
    CAPTURE(r);
    REQUIRE(errors[static_cast<std::size_t>(r)]);
    CHECK(is<dc::comm_error>(errors[static_cast<std::size_t>(r)]));
    CHECK(message_of(errors[static_cast<std::size_t>(r)]).find("no usable network interface") != std::string::npos);
  }
  // Nobody sat out the 60 s store timeout.
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("a rank whose id never comes gets comm_error after the store timeout") {
  gloo::rendezvous::HashStore store;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(detail::exchange_unique_id(store, 1, "job/nccl", std::chrono::milliseconds(200),
                                                  [] { return nccl::make_unique_id(); }),
                       doctest::Contains("waited up to 200 ms for rank 0 to publish the unique id under store key "
                                         "'job/nccl'"),
                       dc::comm_error);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(200));
}

TEST_CASE("a foreign value under the key is a format_error, not a bad id") {
  gloo::rendezvous::HashStore store;
  const std::string junk(200, 'j');
  store.set("job/nccl", std::vector<char>(junk.begin(), junk.end()));
  CHECK_THROWS_WITH_AS(detail::exchange_unique_id(store, 2, "job/nccl", std::chrono::seconds(5),
                                                  [] { return nccl::make_unique_id(); }),
                       doctest::Contains("store key 'job/nccl'"), dc::format_error);
}

TEST_CASE("bad options and ranks are config errors, found before any CUDA call") {
  const ncclUniqueId id = random_id(1);
  CHECK_THROWS_WITH_AS(nccl(id, 2, 2), doctest::Contains("rank 2 is outside [0, 2)"), dc::config_error);
  CHECK_THROWS_WITH_AS(nccl(id, -1, 2), doctest::Contains("rank -1 is outside"), dc::config_error);
  CHECK_THROWS_WITH_AS(nccl(id, 0, 0), doctest::Contains("world size must be at least 1"), dc::config_error);
  CHECK_THROWS_WITH_AS(nccl(id, 0, 1, {.device = -2}), doctest::Contains("options.device"), dc::config_error);
  CHECK_THROWS_WITH_AS(nccl(id, 0, 1, {.timeout = std::chrono::milliseconds(0)}),
                       doctest::Contains("options.timeout must be positive"), dc::config_error);
  CHECK_THROWS_WITH_AS(nccl(id, 0, 1, {.store_timeout = std::chrono::milliseconds(-5)}),
                       doctest::Contains("options.store_timeout must be positive"), dc::config_error);
  CHECK_THROWS_WITH_AS(nccl(id, 0, 1, {.store_key = ""}), doctest::Contains("store_key"), dc::config_error);
}

TEST_CASE("rank 0's bad options reach the other ranks through the store") {
  gloo::rendezvous::HashStore store;
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(2, [&](int r) {
    nccl::options opts{.store_timeout = std::chrono::seconds(60)};
    if (r == 0) opts.timeout = std::chrono::milliseconds(0);
    (void)nccl::from_store(store, r, 2, opts);
  });
  REQUIRE(errors[0]);
  REQUIRE(errors[1]);
  CHECK(is<dc::config_error>(errors[0]));
  CHECK(is<dc::comm_error>(errors[1]));
  CHECK(message_of(errors[1]).find("options.timeout must be positive") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("without a GPU, creation fails with an error naming the CUDA call, on every rank, without hanging") {
  if (have_gpu()) {
    MESSAGE("a CUDA device is present: test_comm_nccl_gpu covers creation");
    return;
  }
  CHECK_THROWS_WITH_AS(nccl(nccl::make_unique_id(), 0, 1), doctest::Contains("no usable CUDA device (cudaGetDeviceCount"),
                       dc::error);
  gloo::rendezvous::HashStore store;
  const auto errors = run_ranks(3, [&](int r) { (void)nccl::from_store(store, r, 3, {.timeout = std::chrono::seconds(30)}); });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    REQUIRE(errors[static_cast<std::size_t>(r)]);
    CHECK(is<dc::error>(errors[static_cast<std::size_t>(r)]));
    CHECK(message_of(errors[static_cast<std::size_t>(r)]).find("nccl rank " + std::to_string(r) + ": no usable CUDA device") !=
          std::string::npos);
  }
}

TEST_CASE("elastic_nccl without a GPU: rank 0 publishes generation 0's NCCL id under its key, and every member's "
          "creation fails with the CUDA error, without hanging") {
  if (have_gpu()) {
    MESSAGE("a CUDA device is present: test_comm_nccl_gpu covers elastic_nccl");
    return;
  }
  harness::temp_dir d;
  dc::comm::gloo::options base;
  base.rendezvous = dc::comm::gloo::file_store{d.file("store")};
  base.run_id = "elastic-nccl";
  base.timeout = std::chrono::seconds(10);
  base.elastic = true;
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(3, [&](int r) {
    auto o = base;
    o.rank = r;
    o.size = 3;
    dc::comm::elastic_nccl comm(o);
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    REQUIRE(errors[static_cast<std::size_t>(r)]);
    CHECK(is<dc::error>(errors[static_cast<std::size_t>(r)]));
    CHECK(message_of(errors[static_cast<std::size_t>(r)]).find("nccl rank " + std::to_string(r) +
                                                              ": no usable CUDA device") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
  // The id every member read: generation 0's key holds a real ncclUniqueId.
  dc::comm::detail_gloo::rendezvous_store store(base, "elastic", "test");
  const dc::comm::data_group g0{0, 1, 3, "r1", base.timeout};
  const auto record = store.store().get(dc::comm::detail_regroup::id_key(0, "nccl"));
  CHECK(dc::comm::detail_regroup::decode_group_id(record, g0, "nccl").size() == sizeof(ncclUniqueId));
  CHECK_FALSE(store.has({dc::comm::detail_regroup::id_key(1, "nccl")}));
}

TEST_CASE("the NCCL factory refuses an id that is not an ncclUniqueId, naming the generation's key") {
  const dc::comm::data_group g{3, 1, 2, "r1", std::chrono::seconds(5)};
  const std::vector<char> short_id(10, 'x');
  CHECK_THROWS_WITH_AS(dc::comm::nccl_factory{}.create(short_id, g),
                       doctest::Contains("nccl unique id from store key 'g3/data/nccl': payload of 10 bytes, an "
                                         "ncclUniqueId has 128"),
                       dc::format_error);
}
