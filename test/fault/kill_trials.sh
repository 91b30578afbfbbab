#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Randomized kill trials over comm::gloo (issue 11's acceptance check):
#
#   test/fault/kill_trials.sh N [path/to/test_elastic_gloo] [--seed S] [--sync NAME] [--kill fault|external]
#                             [--fault STAGE:ROUND] [--victim R] [--at MS]
#
# Each trial starts 4 elastic Gloo workers over loopback TCP (the rank
# program of test_elastic_gloo, built with the test-only fault hook) on a
# random schedule (blocking, streaming, one-step delay, eager) and kills one
# random worker with SIGKILL: half the trials at a random fault point (a
# stage of start-up or of a random round: inner steps, pseudo-gradient, each
# collective, apply), the others from outside at a random moment of the run.
# A trial is judged by what the workers wrote (each writes theta.<pid>:
# theta_global's hash, group size, rounds, membership changes, when it
# finished; a .tmp file renamed into place, so a leftover .tmp is no
# report), not by the victim's exit status, which says only that it was
# killed, not when:
#   finished  when the 3 survivors exit 0 with bitwise equal, finite
#             theta_global after all their rounds, in a group of 3 (the
#             victim died during the run), or of 4 with the same bits as
#             the victim's own report (it was killed after writing it) or
#             without one (killed after the last collective, before writing:
#             the survivors never needed it again);
#   hang      when any worker is still running after the bound (60 s),
#   corrupt   when the survivors finished but disagree, theta is not finite,
#             or their group sizes do not fit one of those stories,
#   failed    otherwise (a survivor raised; its error is printed).
# Trials whose victim finished (wrote its report) before the kill, and
# those killed after the last collective, kill nobody the others needed:
# they are counted apart. --fault, --victim and --at fix the fault point,
# the victim and the outside kill's time (ms) instead of drawing them.
# Prints one line per trial and a summary "trials: N finished: F hangs: H
# corrupt: C failed: X"; exits non-zero unless every trial finished.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
trials=${1:?usage: kill_trials.sh N [path/to/test_elastic_gloo] [--seed S]}
shift
program="$here/../../build/test/test_elastic_gloo"
seed=$$ only_sync="" only_kill="" only_fault="" only_victim="" only_at=""
while (($#)); do
  case "$1" in
    --seed) seed=${2:?--seed needs a value}; shift 2 ;;
    --sync) only_sync=${2:?--sync needs a value}; shift 2 ;;
    --kill) only_kill=${2:?--kill needs fault or external}; shift 2 ;;
    --fault) only_fault=${2:?--fault needs STAGE:ROUND}; only_kill=fault; shift 2 ;;
    --victim) only_victim=${2:?--victim needs a rank}; shift 2 ;;
    --at) only_at=${2:?--at needs milliseconds}; only_kill=external; shift 2 ;;
    *) program=$1; shift ;;
  esac
done
[[ $trials =~ ^[1-9][0-9]*$ ]] || { echo "kill_trials.sh: N must be a positive integer, got '$trials'" >&2; exit 2; }
[[ -x $program ]] || { echo "kill_trials.sh: no rank program at $program (build test_elastic_gloo, or pass its path)" >&2; exit 2; }
RANDOM=$seed
echo "kill_trials.sh: $trials trials, seed $seed, program $program"

workers=4 rounds=6 step_us=5000 timeout_ms=1500 bound_s=60
syncs=(blocking streaming delay eager)
round_stages=(inner pseudo_gradient all_reduce apply)  # reached in every round of every schedule
startup_stages=(startup all_gather broadcast)         # start-up: the agreement and the first broadcast
finished=0 hangs=0 corrupt=0 failed=0 unkilled=0 late=0
for ((t = 1; t <= trials; t++)); do
  dir=$(mktemp -d "${TMPDIR:-/tmp}/kill_trial.XXXXXX")
  sync=${syncs[RANDOM % ${#syncs[@]}]}
  [[ -n $only_sync ]] && sync=$only_sync
  victim=$((RANDOM % workers))
  [[ -n $only_victim ]] && victim=$only_victim
  fault="none:0" external=""
  kind=$((RANDOM % 2))
  [[ $only_kill == fault ]] && kind=1
  [[ $only_kill == external ]] && kind=0
  if ((kind)); then
    if ((RANDOM % 5 == 0)); then
      fault="${startup_stages[RANDOM % ${#startup_stages[@]}]}:0"
    else
      fault="${round_stages[RANDOM % ${#round_stages[@]}]}:$((1 + RANDOM % rounds))"
    fi
    [[ -n $only_fault ]] && fault=$only_fault
    how="fault $fault"
  else
    # The inner steps alone last rounds * H * step_us = 6 * 4 * 5 ms.
    external=$((RANDOM % 120))  # ms after the start
    [[ -n $only_at ]] && external=$only_at
    how="kill -9 after ${external} ms"
  fi
  exec 3>&2 2>"$dir/stderr"  # the shell's "Killed" notices, and the workers' own
  pids=()
  for ((r = 0; r < workers; r++)); do
    f=none:0
    ((r == victim)) && f=$fault
    DILOCO_TEST_ROLE=train DILOCO_TEST_DIR=$dir DILOCO_RANK=$r DILOCO_WORLD_SIZE=$workers \
      DILOCO_STORE=file://$dir/store DILOCO_RUN_ID=trial DILOCO_ELASTIC=1 DILOCO_TIMEOUT_MS=$timeout_ms \
      DILOCO_TEST_ROUNDS=$rounds DILOCO_TEST_SYNC=$sync DILOCO_TEST_STEP_US=$step_us DILOCO_FAULT=$f \
      "$program" &
    pids+=($!)
  done
  if [[ -n $external ]]; then
    sleep "$(printf '%d.%03d' $((external / 1000)) $((external % 1000)))"
    kill -KILL "${pids[$victim]}" 2>/dev/null || true
  fi
  # Wait for every worker, up to the bound.
  deadline=$((SECONDS + bound_s))
  hung=0
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.05; done
    if kill -0 "$pid" 2>/dev/null; then hung=1; fi
  done
  codes=()
  for pid in "${pids[@]}"; do
    ((hung)) && kill -KILL "$pid" 2>/dev/null
    rc=0
    wait "$pid" 2>/dev/null || rc=$?
    codes+=("$rc")
  done
  verdict=""
  if ((hung)); then
    verdict=hang
    hangs=$((hangs + 1))
  else
    ok=1
    for ((r = 0; r < workers; r++)); do
      ((r == victim)) && continue
      ((codes[r] == 0)) || ok=0
    done
    # Reports are written to theta.<pid>.tmp and renamed: a victim killed
    # between the two leaves a .tmp, which is no report.
    shopt -s nullglob
    reports=()
    for f in "$dir"/theta.*; do [[ $f == *.tmp ]] || reports+=("$f"); done
    shopt -u nullglob
    # Who was in the group at the end is read from the reports: the victim's
    # exit status (137 for any SIGKILL) cannot tell a kill after it wrote its
    # report, or after the last collective, from one during the run.
    victim_report="$dir/theta.${pids[$victim]}"
    size=""
    for f in "${reports[@]}"; do
      [[ $f == "$victim_report" ]] && continue
      read -r _ s _ <"$f" || true
      size=$s
      break
    done
    if [[ -e $victim_report ]] || ((codes[victim] == 0)); then
      # The victim wrote its result: it finished before the kill came (no
      # death): all 4 must agree, in a group of 4.
      want=4 size=4
      unkilled=$((unkilled + 1))
    elif [[ $size == 4 ]]; then
      # Killed after the last collective, before writing: the survivors
      # finished every round with it (a group of 4) and do not need it.
      want=3
      late=$((late + 1))
    else
      want=3 size=3
    fi
    if ((ok)) && ((${#reports[@]} == want)); then
      distinct=$(cut -d' ' -f1 "${reports[@]}" | sort -u | wc -l)
      bad=0
      for f in "${reports[@]}"; do
        read -r _ s r _ extra <"$f" || true
        [[ $s == "$size" && $r -ge $rounds && -z ${extra:-} ]] || bad=1
      done
      if ((distinct == 1 && bad == 0)); then
        verdict=finished
        finished=$((finished + 1))
      else
        verdict="corrupt ($(cat "${reports[@]}" | tr '\n' '|'))"
        corrupt=$((corrupt + 1))
      fi
    else
      verdict="failed (exit codes ${codes[*]})"
      for f in "$dir"/error.*; do [[ -e $f ]] && verdict+=" [$(cat "$f")]"; done
      failed=$((failed + 1))
    fi
  fi
  exec 2>&3 3>&-
  echo "trial $t: $sync, rank $victim, $how: $verdict"
  [[ $verdict == finished ]] || sed 's/^/    /' "$dir/stderr"
  rm -rf "$dir"
done
echo "trials: $trials finished: $finished hangs: $hangs corrupt: $corrupt failed: $failed (victim done before the kill: $unkilled, killed after the last collective: $late)"
((finished == trials))
