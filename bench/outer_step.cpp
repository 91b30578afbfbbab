// SPDX-License-Identifier: Apache-2.0
// The DiLoCo outer step on the host: the library's two fused passes against
// the same math done one operation per pass (as a PyTorch foreach
// implementation runs it) and against STREAM copy and triad on buffers of
// the same size, all in one run. Communication is excluded.
//
//   bench_outer_step [--min-log2 16] [--max-log2 26] [--reps 7]
//                    [--tensors 1,64,1024,4096,mixed] [--layout-log2 24]
//
// Per size 2^k it prints `name[2^k]: value` lines: minimal bytes moved per
// parameter, seconds (median), effective GB/s, fused_vs_unfused (time
// ratio) and fused_vs_triad (bandwidth ratio).
//
// Then the same 2^layout-log2 parameters laid out as T equal tensors, or
// "mixed" (a transformer-like list: per layer large matrices and many small
// vectors), through the library's own passes: the outer round of a world of
// 4 (reduce::fp32_mean: pseudo-gradient pass, outer Nesterov + copy-back;
// the all-reduce left out) and an AdamW inner step (diloco::optimizer).
// `outer_round.layout_vs_flat[T]` and `inner_adamw.layout_vs_flat[T]` are
// the time ratios to one flat tensor, measured in alternation in the same
// run. Last, the apply pass of the flat layout with each schedule's merge
// (`apply_<merge>_gbps`, `apply_<merge>_vs_overwrite`: time ratios).
//
//   bench_outer_step --processes 10 [--round-log2 24] [--round-tensors 1]
//                    [--replica buffer|vector] [--reps 9]
//
// runs only the outer round of a world of one (diloco::algorithm, AdamW +
// Nesterov over comm::local, an untimed inner step before each round) in N
// separate processes, one after another: this program re-executes itself,
// each child prints the median of --reps rounds, and the parent prints
// each process's median (`outer_round_seconds.process[i]`), their median
// and `outer_round.process_spread: max/min` (and the same of the rounds'
// process CPU time, `outer_round.process_cpu_spread`, which the other
// jobs on a shared machine disturb less). Placement fixed for a
// process's life (which pages it got) is invisible to in-process
// alternation; docs/performance.md, "Page size and the outer round".
// Each child also times STREAM triad over arrays of the same size after
// each round: `triad.process_spread` is the machine's memory-speed drift
// over the batch, `outer_round.process_spread_vs_triad` the spread of the
// round/triad ratio, the part of the round's spread the process causes.
// --replica: the model's tensors in a diloco::host_buffer (2 MiB pages,
// advised huge, as the library's own state) or a std::vector (small pages).
//
//   bench_outer_step --groups 1,2,4 [--groups-log2 26] [--reps 5]
//
// runs only the outer round of diloco::replicated (inner::external,
// Nesterov, compress::none, H = 1) over a threads mesh of 2 groups of G
// ranks in this process, for each G: the round (pseudo-gradient and outer
// step on the shard, the mean across the groups, the replica's gather
// inside the group), median of --reps after an untimed one, as
// `groups.outer_round_seconds[G]` and `groups.outer_round_vs_first[G]` (to
// the first G listed). The 2G ranks share this machine's cores, so the
// figure shows what sharding costs in work and copies, not the G-fold
// parallelism of G devices.

#include <diloco/diloco.hpp>
#include <diloco/replicated.hpp>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "layouts.hpp"

namespace dc = diloco;

namespace {

// A communicator whose collectives move nothing: the layout benchmark times
// the passes, not the link.
struct no_link {
  int rank() const { return 0; }
  int size() const { return 4; }
  dc::traffic_counters traffic() const { return {}; }
  void all_reduce(std::span<float>, dc::reduce_op) {}
  void broadcast(std::span<float>, int) {}
  void all_to_all(std::span<const std::byte>, std::span<std::byte>) {}
  void all_gather(std::span<const std::byte>, std::span<std::byte>) {}
};

// The model: tensors over one allocation (each tensor's own range), its
// gradients, and the library's state for both passes.
struct model {
  std::vector<float> storage, grad_storage;
  std::vector<std::span<float>> params, grads;
  model(const std::vector<std::size_t>& sizes, std::size_t n) : storage(n), grad_storage(n) {
    bench::fill(storage, 0.5f);
    bench::fill(grad_storage, 0.01f);
    std::size_t off = 0;
    for (std::size_t s : sizes) {
      params.emplace_back(storage.data() + off, s);
      grads.emplace_back(grad_storage.data() + off, s);
      off += s;
    }
  }
};

void layouts(const std::string& list, long log2, int reps) {
  const std::size_t n = std::size_t{1} << log2;
  const std::string size_tag = "2^" + std::to_string(log2);
  dc::exec::host ex(bench::threads());
  const auto nesterov = dc::outer::nesterov::make_update({}, 2);

  // One layout's passes, ready to time.
  struct timed_layout {
    model m;
    dc::parameter_set<float, dc::host_space> set;
    dc::tensor_list<dc::host_space> tensors;
    dc::reduce::fp32_mean<no_link, dc::host_space, dc::exec::host> mean;
    dc::optimizer<dc::inner::adamw> adamw;
    std::vector<float> global, momentum;
    timed_layout(const std::vector<std::size_t>& sizes, std::size_t n, dc::exec::host& ex)
        : m(sizes, n),
          set(m.params),
          tensors(set, ex),
          mean(set, tensors, 4, 0, false),
          adamw(m.params, {.lr = 1e-4f}),
          global(set.total(), 0.5f),
          momentum(set.total(), 0.0f) {}
  };
  auto outer_round = [&](timed_layout& l) {
    no_link link;
    dc::detail::wire_transport<no_link, dc::host_space, dc::exec::host> transport(0);
    return [&l, &ex, &nesterov, link, transport]() mutable {
      l.mean.begin(ex, link, transport, l.global.data(), false);
      l.mean.wait(ex);
      l.mean.apply(ex, nesterov, l.global.data(), l.momentum.data(), l.global.size(), dc::kernels::merge::overwrite{});
    };
  };
  auto inner_step = [](timed_layout& l) { return [&l] { l.adamw.step(l.m.grads); }; };

  timed_layout flat(bench::layout_sizes("1", n), n, ex);
  for (const std::string& layout : bench::layout_names(list)) {
    const auto sizes = bench::layout_sizes(layout, n);
    timed_layout other(sizes, n, ex);
    const std::string tag = "[" + layout + "]";
    bench::print("layout_tensors" + tag, static_cast<double>(sizes.size()));
    const auto outer = bench::interleaved_medians(reps, outer_round(flat), outer_round(other));
    const auto inner = bench::interleaved_medians(reps, inner_step(flat), inner_step(other));
    bench::print("outer_round_seconds" + tag, outer[1]);
    bench::print("inner_adamw_seconds" + tag, inner[1]);
    bench::print("outer_round.layout_vs_flat" + tag, outer[1] / outer[0]);
    bench::print("inner_adamw.layout_vs_flat" + tag, inner[1] / inner[0]);
  }
  bench::print("layout_parameters", size_tag);

  // The apply pass (outer Nesterov + merge) of the flat layout with each
  // schedule's merge, in alternation: overwrite (blocking), mix (streaming,
  // alpha > 0), rebase (one-step delay) and eager (the worker's own outer
  // step first). Bytes per parameter: 24, + 4 (the replica read), + 8 (and
  // the phase's start read and written), + 28 (the replica, anchor, own and
  // the worker's slot read and written).
  namespace km = dc::kernels::merge;
  std::vector<float> start(n, 0.45f), anchor(n, 0.5f), own(n, 0.001f), slots(n, 0.0f);
  auto apply = [&](auto merge) {
    return [&flat, &ex, &nesterov, merge] {
      flat.mean.apply(ex, nesterov, flat.global.data(), flat.momentum.data(), flat.global.size(), merge);
    };
  };
  const auto t = bench::interleaved_medians(
      reps, apply(km::overwrite{}), apply(km::mix{{}, 0.5f}), apply(km::rebase{{}, start.data()}),
      apply(km::eager<dc::kernels::sgd_update>{{}, nesterov, anchor.data(), own.data(), slots.data(), n, 0.25f}));
  const char* names[] = {"overwrite", "mix", "rebase", "eager"};
  const double bytes[] = {24, 28, 32, 52};
  for (std::size_t k = 0; k < 4; ++k) {
    const std::string m = std::string("apply_") + names[k];
    bench::print(m + "_gbps[" + size_tag + "]", bytes[k] * static_cast<double>(n) / t[k] * 1e-9);
    bench::print(m + "_vs_overwrite[" + size_tag + "]", t[k] / t[0]);
  }
}

// Transparent huge pages this process holds (kB; -1 where unknown): each
// child prints it, so a slow process can be told from a fast one by it.
long anon_huge_kb() {
  std::ifstream in("/proc/self/smaps_rollup");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("AnonHugePages:", 0) == 0) return std::stol(line.substr(14));
  return -1;
}

// One process's outer round: the median of `reps` rounds of a world of
// one over 2^log2 parameters in `tensors` equal tensors.
template <class Storage>
void round_in_this_process(long log2, long tensors, int reps) {
  const std::size_t n = std::size_t{1} << log2;
  Storage storage(n), grad_storage(n);
  const std::span<float> all(storage.data(), n), grads_all(grad_storage.data(), n);
  bench::fill(all, 0.5f);
  bench::fill(grads_all, 0.01f);
  std::vector<std::span<float>> params, grads;
  const auto sizes = bench::layout_sizes(std::to_string(tensors), n);
  std::size_t off = 0;
  for (std::size_t s : sizes) {
    params.push_back(all.subspan(off, s));
    grads.push_back(grads_all.subspan(off, s));
    off += s;
  }
  dc::comm::local comm;
  dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local> t(
      params, comm, {.inner_steps = 1000});
  // Wall time, and the process's CPU time: on a shared machine the wall
  // time also counts the time others' jobs held the cores.
  const auto cpu = [] { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; };
  // The machine's memory speed at the time of each round: STREAM triad
  // over three more arrays of n floats (the library's own host buffers,
  // on huge pages), timed right after the round. This machine's memory
  // bandwidth drifts by up to 1.8x within seconds, inside one process
  // (docs/performance.md); a round slower than the triad beside it is
  // slow because of the process, a round as much slower as its triad is
  // slow because of the machine.
  dc::host_buffer<float> ta(n), tb(n), tc(n);
  bench::fill(std::span<float>(tb.data(), n), 1.0f);
  bench::fill(std::span<float>(tc.data(), n), 2.0f);
  const auto sn = static_cast<std::ptrdiff_t>(n);
  const auto triad = [&] {
    float* a = ta.data();
    const float *b = tb.data(), *c = tc.data();
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < sn; ++i) a[i] = b[i] + 0.5f * c[i];
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> times, cpu_times, triads, vs_triad;
  for (int r = 0; r <= reps; ++r) {  // round 0 warms up
    t.inner_step(grads);
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu();
    t.outer_round();
    const double c = cpu() - c0;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double m = triad();
    if (r > 0) times.push_back(s), cpu_times.push_back(c), triads.push_back(m), vs_triad.push_back(s / m);
  }
  const auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  bench::print("outer_round_seconds", median(times));
  bench::print("outer_round_cpu_seconds", median(cpu_times));
  bench::print("triad_seconds", median(triads));
  bench::print("outer_round_vs_triad", median(vs_triad));
  bench::print("anon_huge_kb", static_cast<double>(anon_huge_kb()));
}

// Wrapper mode's round against the fused path's (issue 40 item 6): the same
// outer round (world of one, outer Nesterov, fp32 mean) after an inner step
// taken by the library's AdamW (fused) and after one taken by the user's own
// optimizer (inner::external: here a pass written in this file). Rounds
// alternate between the two, so drift of the machine's speed hits both; the
// median of each is printed, and their ratio (target: at most 1.05).
void external_vs_fused(long log2, int reps) {
  const std::size_t n = std::size_t{1} << log2;
  std::vector<float> a(n), b(n), grads(n);
  bench::fill(a, 0.5f);
  bench::fill(b, 0.5f);
  bench::fill(grads, 0.01f);
  dc::comm::local comm;
  dc::algorithm<dc::inner::adamw, dc::outer::nesterov, dc::compress::none, dc::comm::local> fused(
      a, comm, {.inner_steps = 1000});
  dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::local> wrapped(
      b, comm, {.inner_steps = 1000});
  const auto timed = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // A bf16 replica (issue 40 item 6): the same round on the fp32 mirror,
  // with the mirror's read before it and the write-back after it
  // (tensor/low_precision.hpp), timed the same way.
  std::vector<dc::bfloat16> c(n);
  for (std::size_t i = 0; i < n; ++i) c[i] = dc::bfloat16::round(b[i]);
  dc::algorithm<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::local> wrapped16(
      c, comm, {.inner_steps = 1000});
  std::vector<double> t_fused, t_external, t_bf16;
  for (int r = 0; r <= reps; ++r) {  // round 0 warms up
    fused.inner_step(grads);
    const double f = timed([&] { fused.outer_round(); });
    for (std::size_t i = 0; i < n; ++i) b[i] -= 1e-3f * grads[i];  // the user's optimizer's step
    const double e = timed([&] { wrapped.outer_round(); });
    for (std::size_t i = 0; i < n; ++i) c[i] = dc::bfloat16::round(static_cast<float>(c[i]) - 1e-2f * grads[i]);
    const double h = timed([&] { wrapped16.outer_round(); });
    if (r > 0) t_fused.push_back(f), t_external.push_back(e), t_bf16.push_back(h);
  }
  std::sort(t_fused.begin(), t_fused.end());
  std::sort(t_external.begin(), t_external.end());
  std::sort(t_bf16.begin(), t_bf16.end());
  const std::string tag = "[2^" + std::to_string(log2) + "]";
  const double te = t_external[t_external.size() / 2], th = t_bf16[t_bf16.size() / 2];
  bench::print("outer_round_seconds.fused" + tag, t_fused[t_fused.size() / 2]);
  bench::print("outer_round_seconds.external" + tag, te);
  bench::print("outer_round.external_vs_fused" + tag, te / t_fused[t_fused.size() / 2]);
  // The bf16 round runs the fp32 round's passes on the mirror plus the
  // mirror's read (T 2 B, S 4 B read, S 4 B written where T moved) and
  // write-back (S 4 B read, T 2 B written). Two ratios: te / th, the fp32
  // round's share of the bf16 round's time (which the mirror's 16 bytes
  // bound at 32 / 48 when all passes run at one speed), and the bytes per
  // second each round moves, bf16 over fp32 (issue 40 item 6: at least
  // 0.85). A world of one over comm::local keeps no wire: the fp32 round
  // is the norm pass (replica and theta_global read, 8 B) and the apply
  // pass (replica, momentum and theta_global read, the three written,
  // 24 B), 32 B per parameter; the bf16 round moves 48.
  constexpr double fp32_round_bytes = 32, bf16_round_bytes = fp32_round_bytes + 16;
  bench::print("outer_round_seconds.bf16_replica" + tag, th);
  bench::print("outer_round.bf16_fp32_passes_rate" + tag, te / th);
  bench::print("outer_round.bf16_bytes_per_second_vs_fp32" + tag, (bf16_round_bytes / th) / (fp32_round_bytes / te));
}

// The parent of --processes: N children one after another, each's median,
// and the spread between processes.
void round_in_processes(const char* argv0, int processes, const std::vector<std::string>& child_args) {
  std::vector<double> medians, cpu_medians, triads, ratios;
  for (int p = 0; p < processes; ++p) {
    const std::string out = bench::run_self(argv0, child_args);
    const double s = bench::value_of(out, "outer_round_seconds");
    const double c = bench::value_of(out, "outer_round_cpu_seconds");
    const double m = bench::value_of(out, "triad_seconds");
    const double q = bench::value_of(out, "outer_round_vs_triad");
    const std::string tag = "[" + std::to_string(p) + "]";
    bench::print("outer_round_seconds.process" + tag, s);
    bench::print("outer_round_cpu_seconds.process" + tag, c);
    bench::print("triad_seconds.process" + tag, m);
    bench::print("outer_round_vs_triad.process" + tag, q);
    bench::print("anon_huge_kb.process" + tag, bench::value_of(out, "anon_huge_kb"));
    medians.push_back(s);
    cpu_medians.push_back(c);
    triads.push_back(m);
    ratios.push_back(q);
  }
  const auto spread = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v.back() / v.front();
  };
  const double spread_wall = spread(medians), spread_cpu = spread(cpu_medians);
  bench::print("outer_round.process_median_seconds", medians[medians.size() / 2]);
  bench::print("outer_round.process_spread", spread_wall);
  bench::print("outer_round.process_cpu_spread", spread_cpu);
  // The machine's own drift over the same processes, and the part of the
  // round's spread that is the process's: the spread of each process's
  // round-to-triad ratio.
  bench::print("triad.process_spread", spread(triads));
  bench::print("outer_round.process_spread_vs_triad", spread(ratios));
}

}  // namespace

// One G of --groups: the median seconds of replicated's outer round.
double groups_round(long log2, int g, int reps) {
  const std::size_t n = std::size_t{1} << log2;
  dc::comm::threads::world world(2 * g);
  std::vector<double> seconds;
  world.run([&](dc::comm::threads& comm) {
    dc::mesh<dc::comm::threads> m(comm, {.group_size = g});
    std::vector<float> replica(n);
    bench::fill(replica, 0.5f);
    dc::replicated<dc::inner::external, dc::outer::nesterov, dc::compress::none, dc::comm::threads> t(
        replica, m, {.inner_steps = 1});
    for (int r = 0; r <= reps; ++r) {
      replica[static_cast<std::size_t>(r) % n] += 0.001f;  // the user's optimizer moved the replica
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      t.step();
      comm.barrier();
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      if (comm.rank() == 0 && r > 0) seconds.push_back(dt.count());
    }
  });
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

int main(int argc, char** argv) {
  long lo = 16, hi = 26;
  int reps = 7;
  bench::cli cli("The fused DiLoCo outer step against one pass per operation and STREAM triad");
  cli.option("--min-log2", lo, "smallest size, log2 of the element count", 0L, 30L);
  cli.option("--max-log2", hi, "largest size, log2 of the element count", 0L, 30L);
  cli.option("--reps", reps, "timed repetitions per size (the median is reported)", 1, 1000);
  std::string tensors = "1,64,1024,4096,mixed";
  long layout_log2 = 24;
  cli.app()
      .add_option("--tensors", tensors, "layouts of the same parameters: tensor counts, or mixed (transformer-like)")
      ->capture_default_str()
      ->check(bench::check_layouts);
  cli.option("--layout-log2", layout_log2, "parameters of the layout comparison, log2", 10L, 30L);
  int processes = 0;
  long round_log2 = 24, round_tensors = 1;
  std::string replica = "buffer";
  bool child = false;
  cli.option("--processes", processes,
             "only the outer round of a world of one, in this many separate processes (0: the in-process benchmark)",
             0, 1000);
  cli.option("--round-log2", round_log2, "--processes: parameters, log2", 4L, 30L);
  cli.option("--round-tensors", round_tensors, "--processes: equal tensors they are split into", 1L, 65536L);
  cli.app()
      .add_option("--replica", replica, "--processes: the model's storage (buffer: diloco::host_buffer; vector)")
      ->capture_default_str()
      ->check(CLI::IsMember({"buffer", "vector"}));
  std::string groups;
  long groups_log2 = 26;
  cli.app()
      .add_option("--groups", groups, "only the outer round of diloco::replicated for these group sizes G (e.g. 1,2,4)");
  cli.option("--groups-log2", groups_log2, "--groups: parameters, log2", 4L, 30L);
  cli.app().add_flag("--child-round", child, "(internal) one process of --processes")->group("");
  cli.parse(argc, argv);
  if (round_tensors > (1L << round_log2)) {
    std::fprintf(stderr, "--round-tensors: %ld tensors over 2^%ld parameters, expected at most %ld (one parameter each)\n",
                 round_tensors, round_log2, 1L << round_log2);
    return 2;
  }
  if (child) {
    if (replica == "buffer")
      round_in_this_process<dc::host_buffer<float>>(round_log2, round_tensors, reps);
    else
      round_in_this_process<std::vector<float>>(round_log2, round_tensors, reps);
    return 0;
  }
  bench::print("threads", bench::threads());
  if (!groups.empty()) {
    std::vector<int> sizes;
    std::size_t at = 0;
    while (at <= groups.size()) {
      const std::size_t comma = std::min(groups.find(',', at), groups.size());
      const std::string item = groups.substr(at, comma - at);
      char* end = nullptr;
      const long g = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0' || g < 1 || g > 64 || ((std::size_t{1} << groups_log2) < static_cast<std::size_t>(g))) {
        std::fprintf(stderr, "--groups: '%s' is not a group size in [1, 64] (at most the parameters), expected e.g. 1,2,4\n",
                     item.c_str());
        return 2;
      }
      sizes.push_back(static_cast<int>(g));
      at = comma + 1;
    }
    bench::print("groups.parameters", "2^" + std::to_string(groups_log2));
    double first = 0.0;
    for (const int g : sizes) {
      const double t = groups_round(groups_log2, g, reps);
      const std::string tag = "[" + std::to_string(g) + "]";
      bench::print("groups.outer_round_seconds" + tag, t);
      if (first == 0.0) first = t;
      bench::print("groups.outer_round_vs_first" + tag, t / first);
    }
    return 0;
  }
  if (processes > 0) {
    bench::print("round_parameters", "2^" + std::to_string(round_log2));
    bench::print("round_tensors", static_cast<double>(round_tensors));
    bench::print("replica", replica);
    round_in_processes(argv[0], processes,
                       {"--child-round", "--round-log2", std::to_string(round_log2), "--round-tensors",
                        std::to_string(round_tensors), "--replica", replica, "--reps", std::to_string(reps)});
    return 0;
  }
  constexpr int world = 4;  // the mean's 1/M; any M > 1 runs the same passes

  // Buffers for the largest size, allocated and first touched once; each
  // size uses their prefixes (no allocation churn between sizes).
  const std::size_t largest = std::size_t{1} << hi;
  std::vector<float> global(largest), local(largest), momentum(largest), wire(largest), delta(largest), update(largest);
  bench::fill(global, 1.0f);
  bench::fill(local, 0.99f);
  bench::fill(momentum, 0.0f);
  bench::fill(wire, 0.0f);
  bench::fill(delta, 0.0f);
  bench::fill(update, 0.0f);
  for (long k = lo; k <= hi; ++k) {
    const std::size_t n = std::size_t{1} << k;
    const std::string tag = "[2^" + std::to_string(k) + "]";
    dc::exec::host ex(bench::threads());
    const dc::outer::nesterov::options opt{};
    const auto nesterov = dc::outer::nesterov::make_update(opt, 2);
    const float mu = opt.momentum, lr = opt.lr, inv_m = 1.0f / world;

    // (a) fused: pseudo-gradient into the wire (12 B), then outer Nesterov +
    // copy-back (24 B). The same kernels the engine runs.
    auto fused = [&] {
      ex.transform_reduce(n, dc::kernels::pseudo_gradient{global.data(), local.data(), wire.data()});
      ex.for_each(n, dc::kernels::outer_apply<dc::kernels::sgd_update>{nesterov, wire.data(), inv_m, global.data(),
                                                                        momentum.data(), n, local.data()});
    };

    // (b) unfused, one pass per operation (72 B):
    //   delta = global - local; wire = delta; wire /= M; b = mu b + wire;
    //   upd = wire + mu b; global -= lr upd; local = global
    const auto sn = static_cast<std::ptrdiff_t>(n);
    float* g = global.data();
    float* l = local.data();
    float* b = momentum.data();
    float* w = wire.data();
    float* d = delta.data();
    float* u = update.data();
    auto unfused = [&] {
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < sn; ++i) d[i] = g[i] - l[i];
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < sn; ++i) w[i] = d[i];
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < sn; ++i) w[i] = w[i] * inv_m;
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < sn; ++i) b[i] = mu * b[i] + w[i];
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < sn; ++i) u[i] = w[i] + mu * b[i];
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < sn; ++i) g[i] = g[i] - lr * u[i];
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < sn; ++i) l[i] = g[i];
    };

    // (c) STREAM copy (8 B) and triad (12 B) on the same buffers.
    auto copy = [&] {
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < sn; ++i) d[i] = g[i];
    };
    auto triad = [&] {
#pragma omp parallel for schedule(static)
      for (std::ptrdiff_t i = 0; i < sn; ++i) d[i] = g[i] + 0.5f * l[i];
    };
    // In alternation, so that noise falls on all four alike.
    const auto t = bench::interleaved_medians(reps, fused, unfused, copy, triad);
    const double t_fused = t[0], t_unfused = t[1], t_copy = t[2], t_triad = t[3];

    const double gb = static_cast<double>(n) / 1e9;
    const double fused_gbps = 36 * gb / t_fused, unfused_gbps = 72 * gb / t_unfused;
    const double copy_gbps = 8 * gb / t_copy, triad_gbps = 12 * gb / t_triad;
    bench::print("fused_bytes_per_param" + tag, 36);
    bench::print("unfused_bytes_per_param" + tag, 72);
    bench::print("fused_seconds" + tag, t_fused);
    bench::print("unfused_seconds" + tag, t_unfused);
    bench::print("fused_gbps" + tag, fused_gbps);
    bench::print("unfused_gbps" + tag, unfused_gbps);
    bench::print("copy_gbps" + tag, copy_gbps);
    bench::print("triad_gbps" + tag, triad_gbps);
    bench::print("fused_vs_unfused" + tag, t_unfused / t_fused);
    bench::print("fused_vs_triad" + tag, fused_gbps / triad_gbps);
  }
  if (!tensors.empty()) layouts(tensors, layout_log2, reps);
  external_vs_fused(layout_log2, reps);
  return 0;
}
