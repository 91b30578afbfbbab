#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The slow-link benchmark: DiLoCo against data parallel when the workers are
# joined by a slow network. Needs root (it makes network namespaces), `ip`
# and `tc` (Debian's iproute2) and a build of bench/wan/wan_worker.
#
# Each worker runs in a network namespace of its own, pinned to one core,
# with one veth pair to a switch namespace that holds a bridge; both ends of
# every veth pair are shaped with tc's token bucket filter (tbf) to the link
# rate, so each worker has a full-duplex link of that rate to the switch.
# (netem is not available in this kernel, so there is no added latency.)
# The addresses (10.213.0.0/24) exist only inside the namespaces this script
# makes, which have no other interfaces and no routes: no traffic leaves
# them. The workers meet through a file store in a temporary directory.
# Everything is removed at exit, whatever happens (and namespaces left by a
# run that was killed with SIGKILL are removed by the next run).
#
# For every rate, every method trains the same model on the same data
# (docs/performance.md, "Slow links"). Data parallel runs first, at the first rate, uncapped:
# its final loss sets the target (1.02 x) that every run's
# time_to_target_seconds refers to. Data parallel at the rates of
# --dp-capped-rates stops after --dp-max-seconds of training (its loss curve
# is the same at every rate, only time differs, so the capped run still
# gives its time per step).
#
#   bench/wan/run.sh [options] [-- extra wan_worker options]
#
#   --worker PATH        the worker program (default: build/bench/wan/wan_worker)
#   --out DIR            where the raw outputs go, one file per run (default: a new temporary directory)
#   --rates LIST         link rates for tc, comma-separated (default: 1gbit,100mbit,10mbit)
#   --methods LIST       of ddp,diloco_fp32,diloco_int4,streaming_int4,delay_int4,eager_int4 (default: all)
#   --workers N          workers (default: 2; more than the cores are oversubscribed and marked so)
#   --dp-capped-rates L  rates at which data parallel is capped (default: 10mbit)
#   --dp-max-seconds S   the cap: training seconds (default: 150)
#   --target LOSS        the target loss itself: no data-parallel reference run
#                        (to rerun some methods against an earlier reference)
#   --tiny               a smoke run: tiny model, few steps, one rate (what CTest runs)
#
# Exit status: 0 when every run finished, 77 (CTest's skip) with a message
# when namespaces cannot be made here, 1 otherwise.
set -euo pipefail

usage() {  # usage STATUS: the header above
  sed -n '2,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&"$(( $1 == 0 ? 1 : 2 ))"
  exit "$1"
}

root=$(cd "$(dirname "$0")/../.." && pwd)
worker=build/bench/wan/wan_worker out="" rates=1gbit,100mbit,10mbit dp_capped=10mbit workers=2 dp_max_seconds=150 tiny=0
target=""
methods=ddp,diloco_fp32,diloco_int4,streaming_int4,delay_int4,eager_int4
while (($#)); do
  case "$1" in
    --) shift; break ;;
    --worker) worker=${2:?--worker needs a value}; shift 2 ;;
    --dp-capped-rates) dp_capped=${2?--dp-capped-rates needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --rates) rates=${2:?--rates needs a value}; shift 2 ;;
    --methods) methods=${2:?--methods needs a value}; shift 2 ;;
    --workers) workers=${2:?--workers needs a value}; shift 2 ;;
    --dp-max-seconds) dp_max_seconds=${2:?--dp-max-seconds needs a value}; shift 2 ;;
    --target) target=${2:?--target needs a value}; shift 2 ;;
    --tiny) tiny=1; shift ;;
    -h | --help) usage 0 ;;
    *) echo "run.sh: unknown option '$1' (worker options go after --)" >&2; exit 2 ;;
  esac
done
extra=("$@")
[[ $workers =~ ^[1-9][0-9]*$ ]] && ((workers <= 200)) ||
  { echo "run.sh: --workers must be an integer in [1, 200], got '$workers'" >&2; exit 2; }
[[ -z $target || $target =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "run.sh: --target must be a positive number, got '$target'" >&2; exit 2; }
[[ $dp_max_seconds =~ ^[0-9]+$ ]] || { echo "run.sh: --dp-max-seconds must be a whole number, got '$dp_max_seconds'" >&2; exit 2; }
[[ $worker = /* ]] || worker=$root/$worker
[[ -x $worker ]] || { echo "run.sh: $worker not found: build the target wan_worker first" >&2; exit 2; }
IFS=, read -r -a rate_list <<<"$rates"
IFS=, read -r -a method_list <<<"$methods"
for r in "${rate_list[@]}"; do
  [[ $r =~ ^[0-9]+(\.[0-9]+)?[kmg]?bit$ ]] || { echo "run.sh: rate '$r' is not a tc rate like 100mbit" >&2; exit 2; }
done
declare -A method_args=(
  [ddp]="--method ddp"
  [diloco_fp32]="--method diloco --compress none --sync blocking"
  [diloco_int4]="--method diloco --compress int4 --sync blocking"
  [streaming_int4]="--method diloco --compress int4 --sync streaming"
  [delay_int4]="--method diloco --compress int4 --sync delay"
  [eager_int4]="--method diloco --compress int4 --sync eager"
)
for m in "${method_list[@]}"; do
  [[ -n ${method_args[$m]:-} ]] || { echo "run.sh: unknown method '$m' (see --help)" >&2; exit 2; }
done
tiny_args=()
((tiny)) && tiny_args=(--hidden 32 --steps 40 --inner-steps 10 --eval-every 20 --eval-windows 256 --warmup 5)

# ------------------------------------------------------------ can we?
skip() { echo "run.sh: SKIP: $*" >&2; exit 77; }
(($(id -u) == 0)) || skip "network namespaces need root (run it as root, or with sudo)"
command -v ip >/dev/null || skip "no 'ip' command (Debian: iproute2)"
command -v tc >/dev/null || skip "no 'tc' command (Debian: iproute2)"
command -v taskset >/dev/null || skip "no 'taskset' command (Debian: util-linux)"

# ------------------------------------------------- namespaces, and cleanup
# Every namespace of a run is named dlwan-<pid of its run.sh>-<role>, so a
# run can tell its own from those of a run still going, and remove those of
# a run that is gone.
prefix=dlwan-$$-
switch=${prefix}sw
work=$(mktemp -d "${TMPDIR:-/tmp}/dlwan.XXXXXX")
pids=()
remove_namespace() {  # what runs in it (workers this script started) first
  local pid
  for pid in $(ip netns pids "$1" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  ip netns del "$1" 2>/dev/null || true
}
cleanup() {
  local pid ns
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $ns == "$prefix"* ]] && remove_namespace "$ns"
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
  if [[ $ns =~ ^dlwan-([0-9]+)- ]] && ! kill -0 "${BASH_REMATCH[1]}" 2>/dev/null; then
    echo "run.sh: removing namespace $ns, left by a run that is gone"
    remove_namespace "$ns"
  fi
done

# What needs privileges or kernel support (namespaces, veth, bridge, tbf)
# skips the run with the reason where it fails.
or_skip() { "$@" 2>"$work/err" || skip "cannot set up the network ('$*' failed: $(tr '\n' ' ' <"$work/err"))"; }
or_skip ip netns add "$switch"
or_skip ip netns exec "$switch" true
or_skip ip -n "$switch" link set lo up
or_skip ip -n "$switch" link add br0 type bridge
# The bridge forwards frames, nothing else: where br_netfilter is loaded,
# its hooks (iptables on bridged frames, per network namespace since Linux
# 5.3) would run on every packet, on the workers' own cores.
for f in iptables ip6tables arptables; do
  ip netns exec "$switch" sysctl -qw "net.bridge.bridge-nf-call-$f=0" 2>/dev/null || true
done
or_skip ip -n "$switch" link set br0 up
for ((i = 0; i < workers; i++)); do
  ns=${prefix}w$i
  or_skip ip netns add "$ns"
  # Both ends are made inside the namespaces: nothing appears in the host's.
  or_skip ip link add name eth0 netns "$ns" type veth peer name "p$i" netns "$switch"
  or_skip ip -n "$switch" link set "p$i" master br0
  or_skip ip -n "$switch" link set "p$i" up
  or_skip ip -n "$ns" addr add "10.213.0.$((i + 1))/24" dev eth0
  or_skip ip -n "$ns" link set eth0 up
  or_skip ip -n "$ns" link set lo up
done

# Every link at `rate`, both directions: tbf on the worker's end (what it
# sends) and on the switch's end (what it receives). The bucket holds 2 ms
# of traffic at the rate (at least 16 KiB, so a full-size frame always
# fits; bench/wan/report.py --check assumes this size) and the queue up to
# 50 ms.
shape() {
  local rate=$1 bits burst i
  bits=$(awk -v r="$rate" 'BEGIN { n = r + 0; u = substr(r, length(r) - 3, 1);
    if (u == "k") n *= 1e3; else if (u == "m") n *= 1e6; else if (u == "g") n *= 1e9; print n }')
  burst=$(awk -v b="$bits" 'BEGIN { x = int(b / 8 * 0.002); if (x < 16384) x = 16384; print x }')
  for ((i = 0; i < workers; i++)); do
    ip netns exec "${prefix}w$i" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms || return 1
    ip netns exec "$switch" tc qdisc replace dev "p$i" root tbf rate "$rate" burst "$burst" latency 50ms || return 1
  done
}
or_skip shape "${rate_list[0]}"  # tbf is there

# ------------------------------------------------------------------- runs
cores=$(nproc)
oversubscribed=$((workers > cores))
# run_one NAME RATE ARGS...: all workers of one run; rank 0's output to
# $out/NAME.txt after a header. Returns non-zero if a worker failed (the
# others are then stopped).
run_one() {
  local name=$1 rate=$2 i status=0 failed="" store
  shift 2
  store=$(mktemp -d "$work/store.XXXXXX")
  pids=()
  for ((i = 0; i < workers; i++)); do
    ip netns exec "${prefix}w$i" env DILOCO_RANK=$i DILOCO_WORLD_SIZE="$workers" DILOCO_STORE="file://$store" \
      DILOCO_RUN_ID="$name" DILOCO_HOSTNAME="10.213.0.$((i + 1))" DILOCO_TIMEOUT_MS=300000 \
      DILOCO_LOCAL_WORLD_SIZE=1 OMP_NUM_THREADS=1 \
      taskset -c $((i % cores)) "$worker" "$@" >"$work/out.$i" 2>&1 </dev/null &
    pids+=($!)
  done
  # Wait for all; the first failure stops the others (a failure never
  # waits for the peers' timeouts).
  local remaining=$workers
  declare -A done_=()
  while ((remaining > 0)); do
    for ((i = 0; i < workers; i++)); do
      [[ -n ${done_[$i]:-} ]] && continue
      kill -0 "${pids[$i]}" 2>/dev/null && continue
      local rc=0
      wait "${pids[$i]}" || rc=$?
      done_[$i]=1
      remaining=$((remaining - 1))
      if ((rc != 0)) && [[ -z $failed ]]; then
        failed=$i status=$rc
        for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
      fi
    done
    ((remaining > 0)) && sleep 0.1
  done
  pids=()
  rm -rf "$store"
  if [[ -n $failed ]]; then
    echo "run.sh: $name: worker $failed exited with status $status:" >&2
    sed 's/^/  /' "$work/out.$failed" >&2
    return 1
  fi
  {
    echo "run: $name"
    echo "rate: $rate"
    echo "oversubscribed: $oversubscribed"
    echo "load_average: $(cut -d' ' -f1-3 /proc/loadavg)"
    cat "$work/out.0"
  } >"$out/$name.txt"
  grep -E '^(method|wall_seconds|compute_utilisation|bytes_per_worker|final_loss|time_to_target_seconds):' \
    "$out/$name.txt" | tr '\n' ' ' | sed "s/^/$name: /"
  echo
}

if [[ -z $out ]]; then out=$(mktemp -d "${TMPDIR:-/tmp}/wan-results.XXXXXX"); fi
mkdir -p "$out"
echo "run.sh: $workers workers on $cores cores$( ((oversubscribed)) && echo ' (OVERSUBSCRIBED: reference only)'), rates ${rate_list[*]}, results in $out"
echo "run.sh: $(uptime)"

# The reference: data parallel at the first rate, uncapped (unless --target).
first=${rate_list[0]}
if [[ -z $target ]]; then
  shape "$first"
  run_one "$first-ddp" "$first" ${method_args[ddp]} "${tiny_args[@]}" "${extra[@]}"
  target=$(awk '/^final_loss:/ { printf "%.6f", 1.02 * $2 }' "$out/$first-ddp.txt")
  echo "run.sh: target loss $target (1.02 x data parallel's final loss)"
  reference=1
else
  echo "run.sh: target loss $target (given)"
  reference=0
fi
for rate in "${rate_list[@]}"; do
  shape "$rate"
  for m in "${method_list[@]}"; do
    ((reference)) && [[ $rate == "$first" && $m == ddp ]] && continue
    cap=()
    [[ $m == ddp && ,$dp_capped, == *,$rate,* ]] && cap=(--max-seconds "$dp_max_seconds")
    # shellcheck disable=SC2086  # method_args holds several words
    run_one "$rate-$m" "$rate" ${method_args[$m]} --target-loss "$target" "${cap[@]}" "${tiny_args[@]}" "${extra[@]}"
  done
done
echo "run.sh: $(uptime)"
echo "run.sh: done; results in $out (bench/wan/report.py $out draws the table and plots)"
