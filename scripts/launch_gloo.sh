#!/usr/bin/env bash
# Starts N local processes of a program as the ranks of a comm::gloo world,
# like torchrun does for PyTorch: each gets DILOCO_RANK, DILOCO_WORLD_SIZE,
# DILOCO_STORE, DILOCO_RUN_ID (and DILOCO_HOSTNAME / DILOCO_IFACE /
# DILOCO_TIMEOUT_MS when given), which diloco::comm::gloo::from_env() reads.
# Output lines are prefixed with the rank. If a rank fails, the others are
# stopped and the launcher exits with that rank's status.
#
#   scripts/launch_gloo.sh N [options] -- program [args...]
#
#   --store URL      file:///shared/dir or redis://host:port
#                    (default: a fresh temporary directory, removed at exit)
#   --run-id ID      keys of this run in the store (default: a new one per launch)
#   --hostname H     address each rank listens on (default: 127.0.0.1)
#   --iface IF       network interface to listen on instead of an address
#   --timeout-ms MS  bound on every wait, rendezvous included (default: 30000)
#   --first-rank R   start ranks R..R+N-1 of a world of --world-size ranks,
#   --world-size W   to spread one world over several machines
set -euo pipefail

usage() {  # usage STATUS: the header above, to stdout for --help
  if (($1 == 0)); then
    sed -n '2,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  else
    sed -n '2,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  fi
  exit "$1"
}

(($# >= 1)) || usage 2
case "$1" in -h | --help) usage 0 ;; esac
nprocs=$1
shift
[[ $nprocs =~ ^[1-9][0-9]*$ ]] || { echo "launch_gloo.sh: N must be a positive integer, got '$nprocs'" >&2; exit 2; }

store="" run_id="" hostname="" iface="" timeout_ms="" first_rank=0 world_size=""
while (($#)); do
  case "$1" in
    --) shift; break ;;
    --store) store=${2:?--store needs a value}; shift 2 ;;
    --run-id) run_id=${2:?--run-id needs a value}; shift 2 ;;
    --hostname) hostname=${2:?--hostname needs a value}; shift 2 ;;
    --iface) iface=${2:?--iface needs a value}; shift 2 ;;
    --timeout-ms) timeout_ms=${2:?--timeout-ms needs a value}; shift 2 ;;
    --first-rank) first_rank=${2:?--first-rank needs a value}; shift 2 ;;
    --world-size) world_size=${2:?--world-size needs a value}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "launch_gloo.sh: unknown option '$1' (the program goes after --)" >&2; exit 2 ;;
  esac
done
(($# >= 1)) || { echo "launch_gloo.sh: no program given after --" >&2; exit 2; }
world_size=${world_size:-$nprocs}

work=$(mktemp -d "${TMPDIR:-/tmp}/launch_gloo.XXXXXX")
if [[ -z $store ]]; then
  mkdir "$work/store"
  store="file://$work/store"
fi
run_id=${run_id:-run-$(date +%s)-$$}

pids=()
watchdog=""
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  [[ -n $watchdog ]] && kill "$watchdog" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Each rank runs in a pipeline through a prefixing sed; the rank's own pid
# is written to a file so that it, not the pipeline, can be signalled.
set -o pipefail
jobs_pids=()
for ((i = 0; i < nprocs; i++)); do
  rank=$((first_rank + i))
  (
    echo "$BASHPID" >"$work/pid.$rank"
    export DILOCO_RANK=$rank DILOCO_WORLD_SIZE=$world_size DILOCO_STORE=$store DILOCO_RUN_ID=$run_id
    export DILOCO_LOCAL_WORLD_SIZE=$nprocs  # the ranks this launcher starts share this host
    [[ -n $hostname ]] && export DILOCO_HOSTNAME=$hostname
    [[ -n $iface ]] && export DILOCO_IFACE=$iface
    [[ -n $timeout_ms ]] && export DILOCO_TIMEOUT_MS=$timeout_ms
    exec "$@"
  ) 2>&1 | sed -u "s/^/[rank $rank] /" &
  jobs_pids+=($!)
done
for ((i = 0; i < nprocs; i++)); do
  rank=$((first_rank + i))
  while [[ ! -s $work/pid.$rank ]]; do sleep 0.01; done
  pids+=("$(cat "$work/pid.$rank")")
done

# Wait for all; on the first failure stop the others (TERM, then KILL).
status=0
remaining=$nprocs
declare -A finished=()
while ((remaining > 0)); do
  for ((i = 0; i < nprocs; i++)); do
    [[ -n ${finished[$i]:-} ]] && continue
    if ! kill -0 "${jobs_pids[$i]}" 2>/dev/null; then
      rc=0
      wait "${jobs_pids[$i]}" || rc=$?
      finished[$i]=1
      remaining=$((remaining - 1))
      if ((rc != 0 && status == 0)); then
        status=$rc
        echo "launch_gloo.sh: rank $((first_rank + i)) exited with status $rc; stopping the others" >&2
        for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
        # Detached from our output, so that nothing waits on it.
        (
          sleep 5
          for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
        ) </dev/null >/dev/null 2>&1 &
        watchdog=$!
      fi
    fi
  done
  ((remaining > 0)) && sleep 0.05
done
exit "$status"
