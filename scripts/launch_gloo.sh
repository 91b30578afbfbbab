#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# usage: diloco-launch N [options] -- program [args...]
# (installed as bin/diloco-launch; scripts/launch_gloo.sh in a source tree)
#
# Starts N local processes of a program as the ranks of a comm::gloo world,
# like torchrun does for PyTorch: each gets DILOCO_RANK, DILOCO_WORLD_SIZE,
# DILOCO_STORE, DILOCO_RUN_ID (and DILOCO_HOSTNAME / DILOCO_IFACE /
# DILOCO_TIMEOUT_MS when given), which diloco::comm::gloo::from_env() reads,
# and LOCAL_RANK (0 to N-1 on this host), LOCAL_WORLD_SIZE (N) and
# GROUP_RANK (this launch's host index, first rank / N), as torchrun sets
# them, for a GPU program to pick its device and for diloco::mesh_shape::
# from_env() to make one replica group per host.
# Output lines are prefixed with the rank. If a rank fails (a non-zero exit
# or a death by a signal, reported as "rank 1 killed by SIGSEGV"), the
# others are stopped and the launcher exits with the first failed rank's
# status (128 + N for signal N, as a shell reports it).
#
# Elastic runs (comm::gloo with options.elastic, see docs/guide.md "Surviving
# failures"): with --elastic every rank gets DILOCO_ELASTIC=1 and a failed
# rank does not stop the others, who go on as a smaller group. With
# --max-restarts K (which implies --elastic) a rank that fails is started
# again with the same rank, up to K times, with DILOCO_RESTART_COUNT set to
# how many times it was restarted; the restarted process finds that its
# rank ran before and joins the running group as a new worker, receiving
# the state from a live member. The launcher then exits 0 when every rank's
# last run succeeded, else with the status of the first rank that failed
# for good.
#
#   --store URL      file:///shared/dir or redis://host:port
#                    (default: a fresh temporary directory, removed at exit)
#   --run-id ID      keys of this run in the store (default: a new one per launch)
#   --hostname H     address each rank listens on (default: 127.0.0.1)
#   --iface IF       network interface to listen on instead of an address
#   --timeout-ms MS  bound on every wait, rendezvous included (default: 30000;
#                    at most 31536000000, one year; "none" for no bound)
#   --first-rank R   start ranks R..R+N-1 of a world of --world-size ranks,
#   --world-size W   to spread one world over several machines
#   --elastic        DILOCO_ELASTIC=1; a failed rank leaves the others running
#   --max-restarts K restart a failed rank up to K times (default 0)
#   --group-size G   replica groups of G ranks (diloco::mesh): every rank gets
#                    DILOCO_GROUP_SIZE=G, DILOCO_GROUP_RANK=rank/G and
#                    DILOCO_LOCAL_RANK=rank%G (default: one group per host)
set -euo pipefail

prog=${0##*/}    # diloco-launch installed, launch_gloo.sh in the tree
launcher=$BASHPID  # subshells that inherit the traps below must not run them

usage() {  # usage STATUS: the header above from its usage line, to stdout for --help
  if (($1 == 0)); then
    sed -n '/^# usage:/,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  else
    sed -n '/^# usage:/,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  fi
  exit "$1"
}

(($# >= 1)) || usage 2
case "$1" in -h | --help) usage 0 ;; esac
nprocs=$1
shift
[[ $nprocs =~ ^[1-9][0-9]*$ ]] || { echo "$prog: N must be a positive integer, got '$nprocs'" >&2; exit 2; }

store="" run_id="" hostname="" iface="" timeout_ms="" first_rank=0 world_size="" elastic=0 max_restarts=0 group_size=""
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
    --elastic) elastic=1; shift ;;
    --max-restarts) max_restarts=${2:?--max-restarts needs a value}; shift 2 ;;
    --group-size) group_size=${2:?--group-size needs a value}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "$prog: unknown option '$1' (the program goes after --)" >&2; exit 2 ;;
  esac
done
(($# >= 1)) || { echo "$prog: no program given after --" >&2; exit 2; }
world_size=${world_size:-$nprocs}
[[ $max_restarts =~ ^[0-9]+$ ]] || { echo "$prog: --max-restarts must be a non-negative integer, got '$max_restarts'" >&2; exit 2; }
((max_restarts > 0)) && elastic=1
if [[ -n $group_size ]]; then
  [[ $group_size =~ ^[1-9][0-9]*$ ]] || { echo "$prog: --group-size must be a positive integer, got '$group_size'" >&2; exit 2; }
  ((world_size % group_size == 0)) ||
    { echo "$prog: --group-size $group_size does not divide the world size $world_size (W = R x G)" >&2; exit 2; }
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/launch_gloo.XXXXXX")
if [[ -z $store ]]; then
  mkdir "$work/store"
  store="file://$work/store"
fi
run_id=${run_id:-run-$(date +%s)-$$}

pids=()      # each rank's wrapper: the leader of the rank's process group
all_pids=()  # every wrapper started, restarted ranks' earlier ones included
sed_pids=()  # the prefixing filters, waited for at the end so no output is lost
kill_at=""   # when (EPOCHREALTIME in microseconds) the stopped ranks get KILL
stop_ranks() {  # stop_ranks SIGNAL: signal every rank's whole process group
  local pid
  for pid in "${all_pids[@]}"; do kill "-$1" -- "-$pid" 2>/dev/null || true; done
}
cleanup() {
  # A subshell forked from the launcher (a rank's wrapper, a command
  # substitution) that is signalled before bash resets its traps runs them:
  # only the launcher cleans up.
  [[ $BASHPID == "$launcher" ]] || return 0
  stop_ranks TERM
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Job control puts each rank in its own process group, so that stopping a
# rank stops what it started too (a shell's children, say). A rank runs
# under a small wrapper that waits for the program and writes its status
# (128 + N for a death by signal N, as the shell reports it) and the time it
# ended: bash forgets the status of a background job killed by a signal
# once it has printed "Segmentation fault" for it, so `wait` cannot be
# trusted with it. Output goes through a FIFO to a prefixing sed outside the
# rank's group. The launcher opens the FIFO's write end itself and the rank
# inherits it when it is forked: a rank stopped before its first
# instruction (TERM sent while the machine is busy) would otherwise never
# open the FIFO, and its sed would wait in open() for a writer forever.
restarts=()  # how many times each rank was restarted
start_rank() {  # start_rank I: (re)start the I-th rank of this launch
  local i=$1 rank=$((first_rank + $1)) n=${restarts[$1]:-0}
  shift
  local fifo="$work/out.$rank.$n"
  mkfifo "$fifo"
  sed -u "s/^/[rank $rank] /" <"$fifo" &
  sed_pids+=($!)
  local out_fd
  exec {out_fd}>"$fifo"  # returns once the sed has opened its end
  rm -f "$work/status.$rank"
  set -m
  (
    exec {out_fd}>&-  # stdout and stderr hold the FIFO; no third copy
    export DILOCO_RANK=$rank DILOCO_WORLD_SIZE=$world_size DILOCO_STORE=$store DILOCO_RUN_ID=$run_id
    export DILOCO_LOCAL_WORLD_SIZE=$nprocs  # the ranks this launcher starts share this host
    export LOCAL_RANK=$i LOCAL_WORLD_SIZE=$nprocs  # torchrun's names: a GPU program's device
    ((first_rank % nprocs == 0)) && export GROUP_RANK=$((first_rank / nprocs))  # torchrun's: this host's index
    if [[ -n $group_size ]]; then
      export DILOCO_GROUP_SIZE=$group_size DILOCO_GROUP_RANK=$((rank / group_size)) DILOCO_LOCAL_RANK=$((rank % group_size))
    fi
    [[ -n $hostname ]] && export DILOCO_HOSTNAME=$hostname
    [[ -n $iface ]] && export DILOCO_IFACE=$iface
    [[ -n $timeout_ms ]] && export DILOCO_TIMEOUT_MS=$timeout_ms
    if ((elastic)); then export DILOCO_ELASTIC=1 DILOCO_RESTART_COUNT=$n; fi
    rc=0
    # The shell's own "Killed" notice for a rank that died by a signal goes
    # nowhere (the launcher reports it by name); the rank's stderr is kept.
    { "$@" 2>&3 || rc=$?; } 3>&2 2>/dev/null
    echo "$rc $EPOCHREALTIME" >"$work/status.$rank.tmp"
    mv "$work/status.$rank.tmp" "$work/status.$rank"
    exit "$rc"
  ) </dev/null >&"$out_fd" 2>&1 &
  pids[$i]=$!
  all_pids+=($!)
  set +m
  exec {out_fd}>&-  # the rank's copies are the only writers left
}
for ((i = 0; i < nprocs; i++)); do start_rank "$i" "$@"; done

describe() {  # describe STATUS: "exited with status S" or "killed by SIGNAME"
  local name
  if (($1 > 128 && $1 < 128 + 65)) && name=$(kill -l "$(($1 - 128))" 2>/dev/null); then
    echo "killed by SIG$name"
  else
    echo "exited with status $1"
  fi
}

# Wait for all. Without --elastic, the first rank to fail (by the time its
# wrapper recorded) sets the launcher's status; the others are then stopped
# (TERM to each rank's process group, KILL 5 s later) and their statuses
# are not reported. With --elastic a failed rank is restarted while it has
# restarts left; one that fails for good is reported and the others go on.
status=0
remaining=$nprocs
declare -A finished=()
while ((remaining > 0)); do
  first="" first_rc=0 first_time=""
  for ((i = 0; i < nprocs; i++)); do
    [[ -n ${finished[$i]:-} ]] && continue
    kill -0 "${pids[$i]}" 2>/dev/null && continue
    rank=$((first_rank + i))
    rc=0
    wait "${pids[$i]}" 2>/dev/null || rc=$?
    when=""
    if [[ -s $work/status.$rank ]]; then
      read -r rc when <"$work/status.$rank"
    elif ((rc == 0)); then
      rc=1  # the wrapper itself was killed before it could write the status
    fi
    if ((rc != 0 && elastic && ${restarts[$i]:-0} < max_restarts)); then
      restarts[$i]=$((${restarts[$i]:-0} + 1))
      echo "$prog: rank $rank $(describe "$rc"); restarting it (restart ${restarts[$i]} of $max_restarts)" >&2
      start_rank "$i" "$@"
      continue
    fi
    finished[$i]=1
    remaining=$((remaining - 1))
    if ((rc != 0 && elastic)); then
      echo "$prog: rank $rank $(describe "$rc")$( ((max_restarts > 0)) && echo ", no restarts left"); the others go on" >&2
      ((status == 0)) && status=$rc
    elif ((rc != 0 && status == 0)); then
      # Several ranks may have ended since the last look: keep the earliest.
      if [[ -z $first ]] || { [[ -n $when && -n $first_time ]] &&
                              (( ${when//[.,]/} < ${first_time//[.,]/} )); }; then
        first=$rank first_rc=$rc first_time=$when
      fi
    fi
  done
  if [[ -n $first ]]; then
    status=$first_rc
    echo "$prog: rank $first $(describe "$first_rc"); stopping the others" >&2
    stop_ranks TERM
    kill_at=$((${EPOCHREALTIME//[.,]/} + 5000000))
  fi
  # KILL what TERM did not stop in 5 s. Here rather than in a background
  # subshell: a subshell is a copy of the launcher, job table included, and
  # when TERM reached it before it had reset the launcher's traps it ran
  # them, printing "wait_for: No record of process N".
  if [[ -n $kill_at ]] && ((${EPOCHREALTIME//[.,]/} >= kill_at)); then
    stop_ranks KILL
    kill_at=""
  fi
  ((remaining > 0)) && sleep 0.05
done
# Whatever a finished rank left behind in its group (a child forked just as
# the rank was stopped, a daemon) would hold its output open: end it.
stop_ranks KILL
wait "${sed_pids[@]}" 2>/dev/null || true
exit "$status"
