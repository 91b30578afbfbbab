// SPDX-License-Identifier: Apache-2.0
// Checkpoints: visit_options lists every option by name with its value and
// agreement; save/load resumes bit for bit (the reference is the same run
// continued without the interruption) for every schedule and for fp32,
// int4 + error feedback and stochastic rounding; every corruption, every
// truncation and every mismatch of policies, options or sizes is a
// format_error naming what was wrong, with the live state unchanged; a
// crash between writing and renaming leaves the previous checkpoint.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <diloco/diloco.hpp>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "resume_check.hpp"
#include "same_bits.hpp"

namespace dc = diloco;
namespace fs = std::filesystem;

namespace {

// ------------------------------------------------------------ a problem
// Worker m's loss: 1/2 ||w - c_m||^2, so its gradient is w - c_m.
float target(int m, std::size_t tensor, std::size_t i) {
  return 0.5f + 0.25f * static_cast<float>(m) - 0.125f * static_cast<float>(tensor) + 0.03125f * static_cast<float>(i % 17);
}

struct model {
  std::vector<std::vector<float>> w;
  model(const std::vector<std::size_t>& sizes, int seed) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      w.emplace_back(sizes[k]);
      for (std::size_t i = 0; i < sizes[k]; ++i)
        w[k][i] = 0.1f * static_cast<float>(k + 1) - 0.01f * static_cast<float>(i % 23) + 0.5f * static_cast<float>(seed);
    }
  }
  std::vector<std::vector<float>> grads(int m) const {
    auto g = w;
    for (std::size_t k = 0; k < w.size(); ++k)
      for (std::size_t i = 0; i < w[k].size(); ++i) g[k][i] = w[k][i] - target(m, k, i);
    return g;
  }
};

const std::vector<std::size_t> sizes{3, 130, 7, 64};

template <class Sync, class Compressor = dc::compress::none>
using trainer = dc::algorithm<dc::inner::adamw, dc::outer::nesterov, Compressor, dc::comm::threads, Sync>;

template <class Sync>
typename Sync::options sync_options() {
  if constexpr (std::is_same_v<Sync, dc::sync::streaming>)
    return {.fragments = 2, .delay = 1, .alpha = 0.25f};
  else
    return {};
}

template <class Sync, class Compressor>
typename trainer<Sync, Compressor>::options options_for(std::size_t h = 4) {
  typename trainer<Sync, Compressor>::options o;
  o.inner_steps = h;
  o.inner.lr = 0.05f;
  o.sync = sync_options<Sync>();
  if constexpr (requires { o.compress.seed; }) o.compress.seed = 20250611;
  return o;
}

// Every state entry's bytes and the replica's, by name.
using snapshot_t = std::vector<std::pair<std::string, std::vector<unsigned char>>>;

template <class T>
snapshot_t snapshot(const T& t, const model& mdl) {
  snapshot_t out;
  auto bytes = [](const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    return std::vector<unsigned char>(c, c + n);
  };
  for (const auto& e : t.state())
    out.emplace_back(e.name, e.is_scalar ? bytes(&e.value, sizeof e.value) : bytes(e.data, e.size * sizeof(float)));
  for (std::size_t k = 0; k < mdl.w.size(); ++k)
    out.emplace_back("replica." + std::to_string(k), bytes(mdl.w[k].data(), mdl.w[k].size() * sizeof(float)));
  return out;
}

// "" when equal; otherwise the first entry that differs.
std::string difference(const snapshot_t& a, const snapshot_t& b) {
  if (a.size() != b.size()) return "entry count " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return a[i].first;
  return "";
}

// A directory of its own, removed afterwards.
struct scratch_dir {
  fs::path path;
  explicit scratch_dir(const std::string& name)
      : path(fs::temp_directory_path() / ("diloco_ckpt_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};


}  // namespace

// ---------------------------------------------------------- visit_options

TEST_CASE("visit_options lists every option of algorithm_options by name, with its value and agreement") {
  using opts_t = dc::algorithm_options<dc::inner::adamw, dc::outer::nesterov,
                                       dc::compress::error_feedback<dc::compress::blockwise<dc::int4, 64>>,
                                       dc::sync::streaming>;
  const opts_t o{.inner_steps = 12,
                 .inner = {.lr = 0.25f, .beta2 = 0.5f, .max_grad_norm = 2.0f},
                 .outer = {.lr = 0.5f, .momentum = 0.75f},
                 .compress = {.seed = 77},
                 .sync = {.fragments = 3, .delay = 2, .alpha = 0.125f, .assignment = dc::sync::fragment_assignment::strided},
                 .broadcast_initial = false,
                 .host_threads = 3};
  struct row {
    std::string name;
    std::string value;
    dc::agreement agree;
  };
  const auto A = dc::agreement::across_ranks, P = dc::agreement::per_rank;
  // Values as written above (and the defaults of the fields not set), each
  // float exactly representable.
  const std::vector<row> want{{"inner_steps", "12", A},          {"inner.lr", "0.25", P},
                              {"inner.beta1", "0.899999976", P}, {"inner.beta2", "0.5", P},
                              {"inner.eps", "9.99999994e-09", P}, {"inner.weight_decay", "0.100000001", P},
                              {"inner.max_grad_norm", "2", P},   {"outer.lr", "0.5", A},
                              {"outer.momentum", "0.75", A},     {"compress.seed", "77", A},
                              {"sync.fragments", "3", A},        {"sync.delay", "2", A},
                              {"sync.alpha", "0.125", A},        {"sync.assignment", "\"strided\"", A},
                              {"broadcast_initial", "false", A}, {"host_threads", "3", P}};
  const auto got = dc::option_fields(o);
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(want[i].name);
    CHECK(got[i].name == want[i].name);
    CHECK(got[i].value.to_string() == want[i].value);
    CHECK(got[i].agree == want[i].agree);
  }
  // Kinds: the float is stored exactly, the count unsigned, host_threads signed.
  CHECK(got[1].value == dc::option_value::of_double(0.25));
  CHECK(got[0].value.type == dc::option_value::kind::unsigned_integer);
  CHECK(got.back().value.type == dc::option_value::kind::signed_integer);

  // Policies with no options (compress::none) list nothing; each policy's
  // own fields, eager's two (outer_lr, 0: its stable default; fresh_weight,
  // 0: 1/M) among them.
  const dc::algorithm_options<dc::inner::sgd, dc::outer::sgd, dc::compress::none, dc::sync::eager> plain{};
  std::vector<std::string> names;
  for (const auto& f : dc::option_fields(plain)) names.push_back(f.name);
  CHECK(names == std::vector<std::string>{"inner_steps", "inner.lr", "inner.momentum", "inner.dampening",
                                          "inner.weight_decay", "inner.nesterov", "inner.max_grad_norm", "outer.lr",
                                          "outer.momentum", "outer.dampening", "outer.weight_decay",
                                          "outer.nesterov", "sync.outer_lr", "sync.fresh_weight", "broadcast_initial",
                                          "host_threads"});
  const auto topk = dc::option_fields(dc::compress::topk_options{.fraction = 0.5f});
  REQUIRE(topk.size() == 1);
  CHECK(topk[0].name == "fraction");
  CHECK(topk[0].value.to_string() == "0.5");
}

// ---------------------------------------------------------- round trips

namespace {

// Per rank: train `before` steps, save, train `after` more (the reference).
// A fresh instance over other parameters loads the file and trains the same
// `after` steps: every state entry and the replica must equal the
// reference's bit for bit, before and after.
template <class Sync, class Compressor>
void round_trip(int workers, int before, int after) {
  scratch_dir dir(std::string("rt_") + Sync::name + "_" + std::to_string(Compressor::lossless));
  std::mutex mu;
  int compared = 0;
  dc::comm::threads::world world(workers);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    const auto opts = options_for<Sync, Compressor>();
    model a(sizes, 0), b(sizes, 7);
    trainer<Sync, Compressor> t(a.w, comm, opts);
    trainer<Sync, Compressor> u(b.w, comm, opts);  // fresh: loads below
    const std::string path = dir.file("rank" + std::to_string(m) + ".ckpt");
    for (int s = 0; s < before; ++s) t.step(a.grads(m));
    t.save(path);
    const snapshot_t saved = snapshot(t, a);
    for (int s = 0; s < after; ++s) t.step(a.grads(m));
    const snapshot_t reference = snapshot(t, a);
    t.finish();

    u.load(path);
    CHECK(difference(snapshot(u, b), saved) == "");
    for (int s = 0; s < after; ++s) u.step(b.grads(m));
    CHECK(difference(snapshot(u, b), reference) == "");
    // The run went on after the save: the comparison is not of a still state.
    CHECK(difference(reference, saved) != "");
    u.finish();
    std::lock_guard lock(mu);
    ++compared;
  });
  CHECK(compared == workers);
}

template <class Sync>
void round_trips() {
  const int h = 4;
  // Saved mid-round (after 2 rounds and one step), 3 more rounds after.
  SUBCASE("fp32") { round_trip<Sync, dc::compress::none>(2, 2 * h + 1, 3 * h); }
  SUBCASE("int4 + error feedback") {
    round_trip<Sync, dc::compress::error_feedback<dc::compress::blockwise<dc::int4, 32>>>(2, 2 * h + 1, 3 * h);
  }
  SUBCASE("stochastic rounding (int8) + error feedback") {
    round_trip<Sync, dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 32, dc::compress::stochastic_rounding>>>(
        2, 2 * h + 1, 3 * h);
  }
  SUBCASE("stochastic rounding (bf16), 3 workers, saved at a round boundary") {
    round_trip<Sync, dc::compress::cast<dc::bf16, dc::compress::stochastic_rounding>>(3, 2 * h, 3 * h);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("save, train on; load into a fresh instance, train on: the same bits", Sync, dc::sync::blocking,
                   dc::sync::streaming, dc::sync::one_step_delay, dc::sync::eager) {
  round_trips<Sync>();
}

// ---------------------------------------------------------- corruption

namespace {

// One worker, the schedule and compressor with the most state (eager's
// anchor and own progress, an error-feedback residual, stochastic rounding).
using rich_compressor = dc::compress::error_feedback<dc::compress::blockwise<dc::int4, 32, dc::compress::stochastic_rounding>>;
using rich = trainer<dc::sync::eager, rich_compressor>;

// A file with every section re-sealed (fresh checksums) from an image whose
// header fields and section names a test changed: a forged but consistent
// checkpoint, so the semantic checks (not the checksums) must catch it.
std::vector<std::byte> reseal(const dc::checkpoint::image& img, const std::vector<dc::checkpoint::field>& header,
                              std::size_t rename_section = 0, const std::string& new_name = {}) {
  dc::checkpoint::writer w(header);
  for (std::size_t i = 1; i < img.sections.size(); ++i) {
    const auto& s = img.sections[i];
    const std::string name = i == rename_section ? new_name : s.name;
    if (s.kind == dc::checkpoint::section_kind::scalar) {
      w.scalar(name, img.scalar(s));
    } else if (s.kind == dc::checkpoint::section_kind::bytes) {
      std::vector<std::byte> v(s.elements());
      img.raw(s, v.data());
      w.bytes(name, v.data(), v.size());
    } else {
      std::vector<float> v(s.elements());
      img.floats(s, v.data());
      w.buffer(name, v.data(), v.size());
    }
  }
  return std::move(w).finish();
}

}  // namespace

TEST_CASE("a damaged checkpoint is a format_error naming what is wrong, and the live state is unchanged") {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    const auto opts = options_for<dc::sync::eager, rich_compressor>();
    model a(sizes, 0), b(sizes, 3);
    rich t(a.w, comm, opts);
    for (int s = 0; s < 10; ++s) t.step(a.grads(0));
    const std::vector<std::byte> good = t.save_bytes();
    // The victim: another instance with a state of its own (3 steps from
    // other parameters, nothing in flight), which no bad file may change.
    rich v(b.w, comm, opts);
    for (int s = 0; s < 3; ++s) v.step(b.grads(0));
    const snapshot_t before = snapshot(v, b);
    REQUIRE(difference(before, snapshot(t, a)) != "");

    const auto img = dc::checkpoint::parse(good);
    const auto& secs = img.sections;
    REQUIRE(secs.size() > 10);
    int refused = 0;

    SUBCASE("every byte flipped, each in turn") {
      for (std::size_t i = 0; i < good.size(); ++i) {
        auto bad = good;
        bad[i] ^= std::byte{0x10};
        const std::string msg = load_error(v, bad);
        CAPTURE(i);
        CHECK(contains(msg, "checkpoint"));
        if (msg != "(no format_error)") ++refused;
      }
      CHECK(refused == static_cast<int>(good.size()));
    }
    SUBCASE("each checksum: every section's and the whole file's") {
      for (const auto& s : secs) {
        auto bad = good;
        bad[s.end - 1] ^= std::byte{0x01};
        const std::string msg = load_error(v, bad);
        CAPTURE(s.name);
        CHECK(contains(msg, "section"));
        CHECK(contains(msg, "\"" + s.name + "\""));
        CHECK(contains(msg, "checksum"));
      }
      auto bad = good;
      bad[good.size() - 3] ^= std::byte{0x40};
      CHECK(contains(load_error(v, bad), "whole-file checksum"));
    }
    SUBCASE("magic, version, section count and size fields") {
      auto bad = good;
      bad[0] = std::byte{'X'};
      CHECK(contains(load_error(v, bad), "magic is \"XILOCOCK\", expected \"DILOCOCK\""));
      bad = good;
      bad[8] = std::byte{3};
      CHECK(contains(load_error(v, bad), "format version is 3; this library reads versions 1 to 2"));
      bad = good;
      bad[12] = static_cast<std::byte>(static_cast<unsigned>(bad[12]) + 1);
      CHECK(contains(load_error(v, bad), "section"));
      bad = good;
      bad[16] = static_cast<std::byte>(static_cast<unsigned>(bad[16]) + 8);
      CHECK(contains(load_error(v, bad), "its preamble says " + std::to_string(good.size() + 8) + ": the file is truncated"));
    }
    SUBCASE("truncated at every section boundary, and at every length") {
      std::vector<std::size_t> cuts{0, 8, dc::checkpoint::preamble_bytes, good.size() - 8, good.size() - 1};
      for (const auto& s : secs) {
        cuts.push_back(s.offset);
        cuts.push_back(s.payload_offset);
        cuts.push_back(s.end - 8);
        cuts.push_back(s.end);
      }
      for (std::size_t n : cuts) {
        CAPTURE(n);
        const std::string msg = load_error(v, std::span<const std::byte>(good.data(), n));
        CHECK(contains(msg, n < 32 ? "truncated or not a checkpoint" : "the file is truncated"));
      }
      for (std::size_t n = 0; n < good.size(); ++n) {
        CAPTURE(n);
        CHECK(contains(load_error(v, std::span<const std::byte>(good.data(), n)), "diloco: checkpoint"));
      }
    }
    SUBCASE("each header field altered, checksums re-sealed: the field and both values are named") {
      REQUIRE(difference(snapshot(v, b), before) == "");
      for (std::size_t i = 0; i < img.header.size(); ++i) {
        auto header = img.header;
        auto& f = header[i];
        const std::string was = f.value.to_string();
        switch (f.value.type) {
          case dc::option_value::kind::boolean: f.value.bits ^= 1; break;
          case dc::option_value::kind::floating:
            f.value = dc::option_value::of_double(std::bit_cast<double>(f.value.bits) * 2 + 1);
            break;
          case dc::option_value::kind::text: f.value.str += "x"; break;
          default: f.value.bits += 1;
        }
        const auto forged = reseal(img, header);
        CAPTURE(f.name);
        const bool per_rank = f.name.starts_with("options.inner.") || f.name == "options.host_threads";
        if (per_rank) {
          // Per-rank options are recorded, not enforced: the file loads.
          model c(sizes, 5);
          rich w(c.w, comm, opts);
          CHECK_NOTHROW(w.load(forged));
          CHECK(difference(snapshot(w, c), snapshot(t, a)) == "");
          continue;
        }
        const std::string msg = load_error(v, forged);
        CHECK(contains(msg, "field \"" + f.name + "\" is " + f.value.to_string() + " in the file; this instance has " +
                                was + " and they must match"));
      }
    }
    SUBCASE("an option newer than the file (its field absent) loads at its default, and is refused otherwise") {
      // sync::eager's fresh_weight came after files like this one: without
      // its field the file ran at the default (0: 1/M), so it loads there.
      auto header = img.header;
      std::erase_if(header, [](const dc::checkpoint::field& f) { return f.name == "options.sync.fresh_weight"; });
      REQUIRE(header.size() + 1 == img.header.size());
      const auto older = reseal(img, header);
      model c(sizes, 5);
      rich w(c.w, comm, opts);
      CHECK_NOTHROW(w.load(older));
      CHECK(difference(snapshot(w, c), snapshot(t, a)) == "");
      auto other = opts;
      other.sync.fresh_weight = 0.5f;
      model d(sizes, 6);
      rich u(d.w, comm, other);
      CHECK(contains(load_error(u, older), "has no field \"options.sync.fresh_weight\"; expected it"));
      // An option away from its default is never spared: H (4 here, 500 by default).
      header = img.header;
      std::erase_if(header, [](const dc::checkpoint::field& f) { return f.name == "options.inner_steps"; });
      CHECK(contains(load_error(v, reseal(img, header)), "has no field \"options.inner_steps\"; expected it"));
    }
    SUBCASE("a field missing, an unexpected field, a section renamed") {
      auto header = img.header;
      header.erase(header.begin() + 3);
      CHECK(contains(load_error(v, reseal(img, header)), "has no field \"" + img.header[3].name + "\""));
      header = img.header;
      header.push_back({"extra", dc::option_value::of_unsigned(1)});
      CHECK(contains(load_error(v, reseal(img, header)), "a field \"extra\" (1) that this instance does not expect"));
      const std::size_t k = 3;
      CHECK(contains(load_error(v, reseal(img, img.header, k, "renamed")),
                     "state section " + std::to_string(k) + " is " + dc::checkpoint::to_string(secs[k].kind) +
                         " \"renamed\""));
    }
    CHECK(difference(snapshot(v, b), before) == "");
  });
}

TEST_CASE("a checkpoint of other policies, options, sizes, rank or scope is refused, naming the field") {
  scratch_dir dir("mismatch");
  dc::comm::threads::world world(2);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    const std::string path = dir.file("rank" + std::to_string(m) + ".ckpt");
    const std::string other_rank = dir.file("rank" + std::to_string(1 - m) + ".ckpt");
    const auto opts = options_for<dc::sync::eager, rich_compressor>();
    model a(sizes, 0);
    rich t(a.w, comm, opts);
    for (int s = 0; s < 5; ++s) t.step(a.grads(m));
    t.save(path);
    t.save_global(dir.file("global.ckpt"));
    comm.barrier();

    auto refused = [&]<class T>(T& u, const model& mu, const std::string& file, const std::string& want) {
      const snapshot_t before = snapshot(u, mu);
      std::string msg = "(no format_error)";
      try {
        u.load(file);
      } catch (const dc::format_error& e) {
        msg = e.what();
      }
      CHECK_MESSAGE(contains(msg, want), msg);
      CHECK(contains(msg, "[" + file + "]"));
      CHECK(difference(snapshot(u, mu), before) == "");
    };
    {  // another schedule
      model c(sizes, 1);
      trainer<dc::sync::one_step_delay, rich_compressor> u(c.w, comm, options_for<dc::sync::one_step_delay, rich_compressor>());
      refused(u, c, path, "field \"policy.sync\" is \"eager\" in the file; this instance has \"one_step_delay\"");
    }
    {  // another compressor: int8 instead of int4 (same name family, other block)
      using int8_ef = dc::compress::error_feedback<dc::compress::blockwise<dc::int8, 32, dc::compress::stochastic_rounding>>;
      model c(sizes, 1);
      trainer<dc::sync::eager, int8_ef> u(c.w, comm, options_for<dc::sync::eager, int8_ef>());
      refused(u, c, path, "field \"policy.compressor\" is \"blockwise int4, block 32, stochastic rounding, error feedback\"");
    }
    {  // another inner optimizer
      model c(sizes, 1);
      dc::algorithm<dc::inner::sgd, dc::outer::nesterov, rich_compressor, dc::comm::threads, dc::sync::eager> u(
          c.w, comm, {.inner_steps = 4, .sync = {}});
      refused(u, c, path, "field \"policy.inner\" is \"adamw\" in the file; this instance has \"sgd\"");
    }
    {  // another outer learning rate (must agree across ranks)
      auto o = opts;
      o.outer.lr = 0.5f;
      model c(sizes, 1);
      rich u(c.w, comm, o);
      refused(u, c, path, "field \"options.outer.lr\" is 0.699999988 in the file; this instance has 0.5 and they must match");
    }
    {  // another H
      auto o = options_for<dc::sync::eager, rich_compressor>(5);
      model c(sizes, 1);
      rich u(c.w, comm, o);
      refused(u, c, path, "field \"options.inner_steps\" is 4 in the file; this instance has 5");
    }
    {  // other sizes
      const std::vector<std::size_t> other{3, 131, 7, 64};
      model c(other, 1);
      rich u(c.w, comm, opts);
      refused(u, c, path, "field \"tensor.1.elements\" is 130 in the file; this instance has 131");
    }
    {  // another rank's file
      model c(sizes, 1);
      rich u(c.w, comm, opts);
      refused(u, c, other_rank,
              "field \"rank\" is " + std::to_string(1 - m) + " in the file; this instance has " + std::to_string(m));
    }
    {  // the global file is not a worker checkpoint
      model c(sizes, 1);
      rich u(c.w, comm, opts);
      refused(u, c, dir.file("global.ckpt"), "field \"scope\" is \"global\" in the file; this instance has \"worker\"");
    }
    {  // not a file at all
      model c(sizes, 1);
      rich u(c.w, comm, opts);
      CHECK_THROWS_WITH_AS(u.load(dir.file("missing.ckpt")), doctest::Contains("cannot open"), dc::error);
    }
    comm.barrier();
  });
}

TEST_CASE("a crash between writing and renaming leaves the previous checkpoint loadable") {
  scratch_dir dir("crash");
  const std::string path = dir.file("worker.ckpt");
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    const auto opts = options_for<dc::sync::eager, rich_compressor>();
    model a(sizes, 0);
    rich t(a.w, comm, opts);
    for (int s = 0; s < 6; ++s) t.step(a.grads(0));
    t.save(path);
    const snapshot_t first = snapshot(t, a);
    // A successful save leaves exactly the file: no temporary behind.
    CHECK(dir.entries() == std::vector<std::string>{"worker.ckpt"});

    for (int s = 0; s < 5; ++s) t.step(a.grads(0));
    const auto second_bytes = t.save_bytes();
    const snapshot_t second = snapshot(t, a);
    REQUIRE(difference(first, second) != "");
    // The crash: the new bytes written and fsynced to a temporary, never
    // renamed; and an earlier attempt that died half-way through writing.
    const std::string staged = dc::checkpoint::stage_file(path, second_bytes);
    {
      std::ofstream partial(path + ".tmp.99999.0", std::ios::binary);
      partial.write(reinterpret_cast<const char*>(second_bytes.data()), static_cast<std::streamsize>(second_bytes.size() / 2));
    }
    CHECK(dir.entries().size() == 3);
    {
      model c(sizes, 2);
      rich u(c.w, comm, opts);
      u.load(path);
      CHECK(difference(snapshot(u, c), first) == "");
    }
    // Had the rename happened, the new checkpoint would be in place.
    dc::checkpoint::commit_file(staged, path);
    {
      model c(sizes, 2);
      rich u(c.w, comm, opts);
      u.load(path);
      CHECK(difference(snapshot(u, c), second) == "");
    }
    // A later save over the path replaces it whole.
    t.save(path);
    CHECK(dc::checkpoint::read_file(path) == second_bytes);
  });
}

TEST_CASE("stream and memory forms; load while a reduction is in flight is a state_error") {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    const auto opts = options_for<dc::sync::one_step_delay, dc::compress::none>();
    using T = trainer<dc::sync::one_step_delay, dc::compress::none>;
    model a(sizes, 0), b(sizes, 4);
    T t(a.w, comm, opts);
    for (int s = 0; s < 6; ++s) t.step(a.grads(0));  // round 1's reduction is in flight after step 4
    std::ostringstream out;
    t.save(out);  // waits for it, leaves it in flight (ready) and stores it
    const snapshot_t saved = snapshot(t, a);
    T u(b.w, comm, opts);
    for (int s = 0; s < 4; ++s) u.step(b.grads(0));
    const snapshot_t busy = snapshot(u, b);
    std::istringstream in(out.str());
    CHECK_THROWS_WITH_AS(u.load(in), doctest::Contains("a reduction is in flight"), dc::state_error);
    CHECK(difference(snapshot(u, b), busy) == "");
    u.finish();
    std::istringstream again(out.str());
    u.load(again);
    CHECK(difference(snapshot(u, b), saved) == "");
    const auto bytes = t.save_bytes();
    CHECK(bytes.size() == out.str().size());
    CHECK(std::memcmp(bytes.data(), out.str().data(), bytes.size()) == 0);
  });
}

TEST_CASE("save_global: theta_global, outer state and the clock, the same bytes on every rank, written once") {
  scratch_dir dir("global");
  const std::string path = dir.file("global.ckpt");
  std::vector<std::vector<std::byte>> per_rank(3);
  std::vector<float> theta;
  dc::comm::threads::world world(3);
  world.run([&](dc::comm::threads& comm) {
    const int m = comm.rank();
    using T = trainer<dc::sync::streaming, rich_compressor>;
    model a(sizes, 0);
    T t(a.w, comm, options_for<dc::sync::streaming, rich_compressor>());
    for (int s = 0; s < 9; ++s) t.step(a.grads(m));
    per_rank[static_cast<std::size_t>(m)] = t.save_bytes(dc::checkpoint::scope::global);
    t.save_global(path);
    if (m == 0) {
      const auto g = t.global_parameters();
      theta.assign(g.data(), g.data() + g.size());
    }
  });
  CHECK(per_rank[0] == per_rank[1]);
  CHECK(per_rank[0] == per_rank[2]);
  const auto bytes = dc::checkpoint::read_file(path);
  CHECK(bytes == per_rank[0]);
  const auto img = dc::checkpoint::parse(bytes);
  std::vector<std::string> names;
  for (std::size_t i = 1; i < img.sections.size(); ++i) names.push_back(img.sections[i].name);
  CHECK(names == std::vector<std::string>{"theta_global", "outer.slots", "rounds", "schedule.position",
                                          "schedule.steps_in_round", "fragment.0.outer_steps",
                                          "fragment.1.outer_steps"});
  std::vector<float> stored(img.sections[1].elements());
  img.floats(img.sections[1], stored.data());
  CHECK(stored == theta);
  CHECK(img.find("rank") == nullptr);
  CHECK(img.find("options.inner.lr") == nullptr);
  REQUIRE(img.find("options.outer.lr") != nullptr);
  CHECK(img.find("scope")->value.str == "global");
  // H 4, P 2, tau 1: fragment 0 is applied after steps 2 and 6 and begun
  // after step 9 (in flight: the save waits for it but does not apply it,
  // and the global file does not hold it), fragment 1 after steps 4 and 8.
  CHECK(img.scalar(img.sections[3]) == 4);  // rounds
  CHECK(img.scalar(img.sections[4]) == 9);  // schedule.position
  CHECK(img.scalar(img.sections[6]) == 2);  // fragment 0's outer steps
  CHECK(img.scalar(img.sections[7]) == 2);  // fragment 1's
}

// ---------------------------------------------------------- in flight

namespace {

// Saving must not change the run: a checkpoint taken while a reduction is
// in flight holds its completed but unapplied result, so the saver, and a
// fresh instance that loads the file in a new process (here: a new world of
// threads over other parameters), both end with the bits of a run that never
// saved. Two 2-D tensors, so that low_rank factors them.
const std::vector<std::pair<std::size_t, std::size_t>> shapes{{24, 16}, {16, 1}, {7, 1}, {5, 13}};

struct shaped_model {
  std::vector<std::vector<float>> w;
  explicit shaped_model(int seed) {
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      w.emplace_back(shapes[k].first * shapes[k].second);
      for (std::size_t i = 0; i < w[k].size(); ++i)
        w[k][i] = 0.1f * static_cast<float>(k + 1) - 0.01f * static_cast<float>(i % 23) + 0.5f * static_cast<float>(seed);
    }
  }
  std::vector<dc::matrix_view<float>> views() {
    std::vector<dc::matrix_view<float>> out;
    for (std::size_t k = 0; k < shapes.size(); ++k) out.emplace_back(w[k].data(), shapes[k].first, shapes[k].second);
    return out;
  }
  // Worker m's gradient at inner step s (1-based): a function of (m, s) and
  // the replica only.
  std::vector<std::vector<float>> grads(int m, int s) const {
    auto g = w;
    for (std::size_t k = 0; k < w.size(); ++k)
      for (std::size_t i = 0; i < w[k].size(); ++i)
        g[k][i] = w[k][i] - target(m, k, i) +
                  0.01f * static_cast<float>((static_cast<std::size_t>(7 * s + 3 * m) + i) % 5) - 0.02f;
    return g;
  }
};

// H 6. streaming: P 2, tau 2: fragment 0 begins after steps 1, 7, 13, 19 and
// is applied two steps later; fragment 1 begins after 4, 10, 16, 22.
// one_step_delay and eager: a reduction begins after steps 6, 12, 18 and is
// applied 6 steps later. After step 14 fragment 0's (streaming) or round
// 2's (delayed) reduction is in flight.
constexpr int inflight_h = 6, inflight_save_at = 14, inflight_total = 4 * inflight_h;

template <class Sync>
typename Sync::options inflight_sync() {
  if constexpr (std::is_same_v<Sync, dc::sync::streaming>)
    return {.fragments = 2, .delay = 2, .alpha = 0.25f};
  else
    return {};
}

template <class Sync, class Compressor>
typename trainer<Sync, Compressor>::options inflight_options() {
  typename trainer<Sync, Compressor>::options o;
  o.inner_steps = inflight_h;
  o.inner.lr = 0.05f;
  o.sync = inflight_sync<Sync>();
  if constexpr (requires { o.compress.seed; }) o.compress.seed = 20250611;
  if constexpr (requires { o.compress.rank; }) o.compress.rank = 2;
  // adaptive: a budget no rung fits and a loose bound: int8 first, then the
  // most compressed rung (int2) from the second round on; deterministic,
  // since the rule's choice does not depend on the measured times then.
  if constexpr (requires { o.compress.rule; }) o.compress.rule = {.budget_seconds = 1e-12, .error_bound = 0.9};
  return o;
}

// What a run ends with, per rank: the replica and theta_global after the
// last step, and both again after finish().
struct ending {
  std::vector<std::vector<float>> replica, replica_finished;
  std::vector<float> global, global_finished;
};

template <class T>
void record(T& t, const shaped_model& mdl, ending& e) {
  e.replica = mdl.w;
  const auto g = t.global_parameters();
  e.global.assign(g.data(), g.data() + g.size());
  t.finish();
  e.replica_finished = mdl.w;
  const auto f = t.global_parameters();
  e.global_finished.assign(f.data(), f.data() + f.size());
}

// Per tensor; the flat form is same_bits.hpp's (named here: this overload
// would hide it inside the namespace).
using ::same_bits;
bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (!same_bits(a[k], b[k])) return false;
  return true;
}

template <class Sync, class Compressor>
void save_in_flight(int workers) {
  using T = trainer<Sync, Compressor>;
  const auto opts = inflight_options<Sync, Compressor>();
  const auto M = static_cast<std::size_t>(workers);
  std::vector<ending> plain(M), saver(M), restored(M);
  std::vector<std::vector<std::byte>> files(M);
  {  // A: never saves.
    dc::comm::threads::world world(workers);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      shaped_model a(0);
      T t(a.views(), comm, opts);
      for (int s = 1; s <= inflight_total; ++s) t.step(a.grads(m, s));
      record(t, a, plain[static_cast<std::size_t>(m)]);
    });
  }
  {  // B: saves on every rank after step 14, then goes on.
    dc::comm::threads::world world(workers);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      shaped_model a(0);
      T t(a.views(), comm, opts);
      for (int s = 1; s <= inflight_save_at; ++s) t.step(a.grads(m, s));
      files[static_cast<std::size_t>(m)] = t.save_bytes();
      if constexpr (!std::is_same_v<Sync, dc::sync::blocking>) {
        // The save left the reduction in flight (it is applied at its own
        // step): loading into this instance is refused.
        CHECK_THROWS_WITH_AS(t.load(files[static_cast<std::size_t>(m)]), doctest::Contains("a reduction is in flight"),
                             dc::state_error);
      }
      for (int s = inflight_save_at + 1; s <= inflight_total; ++s) t.step(a.grads(m, s));
      record(t, a, saver[static_cast<std::size_t>(m)]);
    });
  }
  {  // C: the process was killed after the save; fresh instances over other
     // parameters load the files and go on.
    dc::comm::threads::world world(workers);
    world.run([&](dc::comm::threads& comm) {
      const int m = comm.rank();
      shaped_model c(7);
      T u(c.views(), comm, opts);
      u.load(files[static_cast<std::size_t>(m)]);
      for (int s = inflight_save_at + 1; s <= inflight_total; ++s) u.step(c.grads(m, s));
      record(u, c, restored[static_cast<std::size_t>(m)]);
    });
  }
  for (std::size_t m = 0; m < M; ++m) {
    CAPTURE(m);
    CHECK(same_bits(saver[m].replica, plain[m].replica));
    CHECK(same_bits(saver[m].global, plain[m].global));
    CHECK(same_bits(restored[m].replica, plain[m].replica));
    CHECK(same_bits(restored[m].global, plain[m].global));
    CHECK(same_bits(saver[m].replica_finished, plain[m].replica_finished));
    CHECK(same_bits(saver[m].global_finished, plain[m].global_finished));
    CHECK(same_bits(restored[m].replica_finished, plain[m].replica_finished));
    CHECK(same_bits(restored[m].global_finished, plain[m].global_finished));
  }
  // The runs trained: theta_global moved from its start.
  shaped_model start(0);
  std::vector<float> flat;
  for (const auto& t : start.w) flat.insert(flat.end(), t.begin(), t.end());
  CHECK(!same_bits(plain[0].global, flat));
}

}  // namespace

TEST_CASE_TEMPLATE("a save while a reduction is in flight changes nothing: saver and restored run end with the bits of "
                   "a run that never saved",
                   Sync, dc::sync::blocking, dc::sync::streaming, dc::sync::one_step_delay, dc::sync::eager,
                   dc::sync::delayed) {
  namespace cp = dc::compress;
  SUBCASE("fp32 mean, 3 workers") { save_in_flight<Sync, cp::none>(3); }
  SUBCASE("blockwise int8 + error feedback, 3 workers") {
    save_in_flight<Sync, cp::error_feedback<cp::blockwise<dc::int8, 32>>>(3);
  }
  SUBCASE("blockwise int4, stochastic rounding + error feedback, 2 workers") {
    save_in_flight<Sync, cp::error_feedback<cp::blockwise<dc::int4, 32, cp::stochastic_rounding>>>(2);
  }
  SUBCASE("bf16 cast, stochastic rounding, 4 workers") {
    save_in_flight<Sync, cp::cast<dc::bf16, cp::stochastic_rounding>>(4);
  }
  SUBCASE("chunk_topk (gathered) + error feedback, 3 workers") {
    save_in_flight<Sync, cp::error_feedback<cp::chunk_topk<64, 8, dc::int4>>>(3);
  }
  SUBCASE("low_rank (factored), 3 workers") { save_in_flight<Sync, cp::low_rank>(3); }
  SUBCASE("adaptive int8 / int4 / int2 + error feedback, switching rungs, 3 workers") {
    using ef8 = cp::error_feedback<cp::blockwise<dc::int8, 32>>;
    using ef4 = cp::error_feedback<cp::blockwise<dc::int4, 32>>;
    using ef2 = cp::error_feedback<cp::blockwise<dc::int2, 32>>;
    save_in_flight<Sync, cp::adaptive<ef8, ef4, ef2>>(3);
  }
}

TEST_CASE("format version 2: the in-flight part is checked before anything is written; version-1 files still load") {
  dc::comm::threads::world world(1);
  world.run([&](dc::comm::threads& comm) {
    using T = trainer<dc::sync::one_step_delay, dc::compress::none>;
    const auto opts = options_for<dc::sync::one_step_delay, dc::compress::none>();
    model a(sizes, 0), b(sizes, 3);
    T t(a.w, comm, opts);
    for (int s = 0; s < 6; ++s) t.step(a.grads(0));  // round 1's reduction is in flight after step 4
    const auto good = t.save_bytes();
    const auto img = dc::checkpoint::parse(good);
    CHECK(img.version == 2);
    // After the visited state and the replica: the marker naming fragment
    // 0, then its verdict and the fp32 wire (the sum and one norm).
    std::size_t marker = 0;
    for (std::size_t i = 1; i < img.sections.size(); ++i)
      if (img.sections[i].name == "in_flight") marker = i;
    REQUIRE(marker > 0);
    CHECK(img.sections[marker - 1].name == "replica.3");
    CHECK(img.scalar(img.sections[marker]) == 0);
    std::vector<std::string> names;
    for (std::size_t i = marker + 1; i < img.sections.size(); ++i) names.push_back(img.sections[i].name);
    CHECK(names == std::vector<std::string>{"fragment.0.ready.accepted", "fragment.0.ready.corrupt",
                                            "fragment.0.ready.delta_norm", "fragment.0.ready.error_norm",
                                            "fragment.0.ready.encoded_bytes", "fragment.0.ready.problem",
                                            "fragment.0.ready.wire"});
    CHECK(img.sections.back().elements() == 3 + 130 + 7 + 64 + 1);
    CHECK(img.sections[marker + 6].kind == dc::checkpoint::section_kind::bytes);

    // Forged files (sections re-sealed): refused naming what is wrong, the
    // victim (nothing in flight) unchanged and still nothing in flight.
    T v(b.w, comm, opts);
    const snapshot_t before = snapshot(v, b);
    auto forge = [&](auto&& edit) {
      dc::checkpoint::writer w(img.header);
      for (std::size_t i = 1; i < img.sections.size(); ++i) {
        const auto& s = img.sections[i];
        if (!edit(w, i, s)) continue;
        if (s.kind == dc::checkpoint::section_kind::scalar) {
          w.scalar(s.name, img.scalar(s));
        } else if (s.kind == dc::checkpoint::section_kind::bytes) {
          std::vector<std::byte> x(s.elements());
          img.raw(s, x.data());
          w.bytes(s.name, x.data(), x.size());
        } else {
          std::vector<float> x(s.elements());
          img.floats(s, x.data());
          w.buffer(s.name, x.data(), x.size());
        }
      }
      return std::move(w).finish();
    };
    auto refused = [&](const std::vector<std::byte>& bytes, const std::string& want) {
      std::string msg = "(no format_error)";
      try {
        v.load(std::span<const std::byte>(bytes));
      } catch (const dc::format_error& e) {
        msg = e.what();
      }
      CHECK_MESSAGE(contains(msg, want), msg);
      CHECK(difference(snapshot(v, b), before) == "");
    };
    // A marker naming a fragment this instance does not have.
    refused(forge([&](auto& w, std::size_t i, const auto&) {
              if (i != marker) return true;
              w.scalar("in_flight", 1);
              return false;
            }),
            "names fragment 1's reduction in flight; this instance has 1 fragment");
    // The in-flight part cut short, and a wire of the wrong size.
    refused(forge([&](auto&, std::size_t i, const auto&) { return i + 1 != img.sections.size(); }),
            "checkpoint ends in fragment 0's reduction in flight; this instance expects buffer \"fragment.0.ready.wire\"");
    refused(forge([&](auto& w, std::size_t i, const auto& s) {
              if (i + 1 != img.sections.size()) return true;
              std::vector<float> x(s.elements() + 1, 0.0f);
              w.buffer(s.name, x.data(), x.size());
              return false;
            }),
            "is buffer \"fragment.0.ready.wire\" of 206 floats; this instance expects buffer \"fragment.0.ready.wire\" of "
            "205 floats (fragment 0's reduction in flight)");
    // Nothing was left in flight by the refusals: v finishes and loads the good file.
    v.finish();
    v.load(std::span<const std::byte>(good));
    CHECK(difference(snapshot(v, b), snapshot(t, a)) == "");
    for (int s = 0; s < 6; ++s) {
      t.step(a.grads(0));
      v.step(b.grads(0));
    }
    CHECK(difference(snapshot(v, b), snapshot(t, a)) == "");

    // A version-1 file (what this library wrote before version 2: no bytes
    // sections, nothing in flight) still loads.
    using B = trainer<dc::sync::blocking, dc::compress::none>;
    const auto bopts = options_for<dc::sync::blocking, dc::compress::none>();
    model c(sizes, 0), d(sizes, 5);
    B x(c.w, comm, bopts);
    for (int s = 0; s < 5; ++s) x.step(c.grads(0));
    auto v1 = x.save_bytes();
    v1[8] = std::byte{1};
    dc::checkpoint::detail::set_u64(v1, v1.size() - 8, dc::checkpoint::detail::checksum(v1.data(), v1.size() - 8));
    B y(d.w, comm, bopts);
    y.load(std::span<const std::byte>(v1));
    CHECK(difference(snapshot(y, d), snapshot(x, c)) == "");
    // A version-1 file has no bytes sections.
    auto forged = good;
    forged[8] = std::byte{1};
    dc::checkpoint::detail::set_u64(forged, forged.size() - 8,
                                    dc::checkpoint::detail::checksum(forged.data(), forged.size() - 8));
    CHECK_THROWS_WITH_AS(dc::checkpoint::parse(forged), doctest::Contains("or 3 (scalar) in a version-1 file"),
                         dc::format_error);
  });
}
