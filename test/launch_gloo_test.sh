#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/launch_gloo.sh: every rank gets its variables and a prefixed
# output; the launcher's temporary store goes away; a failing rank stops
# the others and its status is the launcher's; a death by a signal is
# reported by name and gives 128 + N; LOCAL_RANK and LOCAL_WORLD_SIZE reach
# the ranks as torchrun sets them; --help starts with the usage; a failed
# rank leaves no "wait_for: No record of process N" from bash.
set -euo pipefail
launch=${1:?usage: launch_gloo_test.sh path/to/launch_gloo.sh}
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$launch" 3 --timeout-ms 1234 -- bash -c \
  'echo "rank=$DILOCO_RANK size=$DILOCO_WORLD_SIZE timeout=$DILOCO_TIMEOUT_MS store=$DILOCO_STORE run=$DILOCO_RUN_ID"
   echo "local=$LOCAL_RANK/$LOCAL_WORLD_SIZE"')
echo "$out"
for r in 0 1 2; do
  grep -q "^\[rank $r\] rank=$r size=3 timeout=1234 store=file:///" <<<"$out" || fail "rank $r's line is missing or wrong"
  grep -q "^\[rank $r\] local=$r/3$" <<<"$out" || fail "rank $r did not get LOCAL_RANK=$r LOCAL_WORLD_SIZE=3: $out"
done
[[ $(grep -o 'run=[^ ]*' <<<"$out" | sort -u | wc -l) -eq 1 ]] || fail "ranks were given different run ids"
store_dir=$(grep -o 'store=file://[^ ]*' <<<"$out" | head -1 | sed 's|store=file://||')
[[ ! -e $store_dir ]] || fail "the temporary store $store_dir was not removed"

# Replica groups (diloco::mesh_shape::from_env): --group-size G gives each
# rank its group and position; without it GROUP_RANK is the launch's host
# index, so LOCAL_* and GROUP_RANK make one group per host.
out=$("$launch" 4 --group-size 2 -- bash -c 'echo "mesh=$DILOCO_GROUP_SIZE/$DILOCO_GROUP_RANK/$DILOCO_LOCAL_RANK host=$GROUP_RANK"')
for r in 0 1 2 3; do
  grep -q "^\[rank $r\] mesh=2/$((r / 2))/$((r % 2)) host=0$" <<<"$out" || fail "--group-size 2, rank $r: $out"
done
out=$("$launch" 2 --first-rank 2 --world-size 4 -- bash -c 'echo "host=$GROUP_RANK mesh=${DILOCO_GROUP_SIZE:-unset}"')
grep -q "^\[rank 3\] host=1 mesh=unset$" <<<"$out" || fail "GROUP_RANK of the second host's launch: $out"
rc=0
err=$("$launch" 4 --group-size 3 -- true 2>&1) || rc=$?
[[ $rc -eq 2 ]] && grep -q "does not divide the world size 4" <<<"$err" || fail "--group-size 3 of 4 ranks: rc $rc, $err"

# A world spread over two launches (as over two machines).
# LOCAL_RANK counts this launcher's ranks (the host's), from 0.
out=$("$launch" 2 --first-rank 2 --world-size 4 --store redis://10.0.0.1:6379 --run-id job7 -- bash -c \
  'echo "rank=$DILOCO_RANK size=$DILOCO_WORLD_SIZE store=$DILOCO_STORE run=$DILOCO_RUN_ID local=$LOCAL_RANK/$LOCAL_WORLD_SIZE"')
grep -q "^\[rank 2\] rank=2 size=4 store=redis://10.0.0.1:6379 run=job7 local=0/2$" <<<"$out" || fail "--first-rank/--world-size: $out"
grep -q "^\[rank 3\] rank=3 size=4 store=redis://10.0.0.1:6379 run=job7 local=1/2$" <<<"$out" || fail "--first-rank/--world-size: $out"

# --help: the usage first (not the licence line), the options after it.
help=$("$launch" --help)
[[ $(head -n 1 <<<"$help") == "usage: diloco-launch N [options] -- program [args...]" ]] ||
  fail "--help's first line is not the usage: $(head -n 1 <<<"$help")"
grep -q "^  --max-restarts K" <<<"$help" || fail "--help does not list --max-restarts: $help"
! grep -q SPDX <<<"$help" || fail "--help prints the licence line: $help"

start=$(date +%s)
rc=0
"$launch" 3 -- bash -c 'if [ "$DILOCO_RANK" = 1 ]; then exit 7; fi; sleep 60' || rc=$?
elapsed=$(($(date +%s) - start))
[[ $rc -eq 7 ]] || fail "a rank exiting with 7 made the launcher exit with $rc"
((elapsed < 20)) || fail "the other ranks were not stopped (took ${elapsed}s)"

# A rank killed by a signal: reported by name, the launcher exits 128 + N
# and the others are stopped (they would sleep 30 s).
start=$(date +%s)
rc=0
err=$("$launch" 3 -- bash -c 'if [ $DILOCO_RANK = 1 ]; then kill -SEGV $$; fi; sleep 30' 2>&1 >/dev/null) || rc=$?
elapsed=$(($(date +%s) - start))
echo "$err"
[[ $rc -eq 139 ]] || fail "a rank killed by SIGSEGV made the launcher exit with $rc"
grep -q "rank 1 killed by SIGSEGV" <<<"$err" || fail "no 'rank 1 killed by SIGSEGV' in: $err"
((elapsed < 10)) || fail "the other ranks were not stopped after a SIGSEGV (took ${elapsed}s)"

# The first failure is the launcher's status, not a survivor's: rank 2 is
# killed; rank 0 fails on its own 0.2 s after rank 2 is gone (as survivors
# raise comm_error), deaf to the launcher's TERM so that its failure is
# always there to be mistaken for the first; rank 1 exits 3 when stopped.
# (The order is made by a file, not by a head start: on a loaded machine
# rank 2 may start well after rank 0.)
flag_dir=$(mktemp -d)
trap 'rm -rf "$flag_dir"' EXIT
rc=0
err=$(FLAG="$flag_dir/rank2" "$launch" 3 -- bash -c 'if [ $DILOCO_RANK = 2 ]; then touch "$FLAG"; kill -KILL $$; fi
  if [ $DILOCO_RANK = 0 ]; then trap "" TERM
    while [ ! -e "$FLAG" ]; do sleep 0.01; done; sleep 0.2; exit 1; fi
  trap "exit 3" TERM; sleep 30 & wait' 2>&1 >/dev/null) || rc=$?
echo "$err"
[[ $rc -eq 137 ]] || fail "rank 2 killed by SIGKILL first, yet the launcher exited with $rc"
grep -q "rank 2 killed by SIGKILL" <<<"$err" || fail "no 'rank 2 killed by SIGKILL' in: $err"
rc=0
"$launch" 3 -- bash -c 'if [ $DILOCO_RANK = 1 ]; then exit 7; fi; trap "exit 3" TERM; sleep 30 & wait' 2>/dev/null || rc=$?
[[ $rc -eq 7 ]] || fail "rank 1 exited 7 first, the survivors 3 when stopped; the launcher exited with $rc"

rc=0
"$launch" 0 -- true 2>/dev/null || rc=$?
[[ $rc -eq 2 ]] || fail "N = 0 was accepted"
rc=0
"$launch" 2 --bogus x -- true 2>/dev/null || rc=$?
[[ $rc -eq 2 ]] || fail "an unknown option was accepted"
rc=0
"$launch" 2 --max-restarts -1 -- true 2>/dev/null || rc=$?
[[ $rc -eq 2 ]] || fail "--max-restarts -1 was accepted"

# --max-restarts: rank 1 fails in its first two runs and succeeds in the
# third; each run sees DILOCO_ELASTIC=1 and its DILOCO_RESTART_COUNT; the
# launcher reports both restarts and exits 0.
rc=0
out=$("$launch" 3 --max-restarts 2 -- bash -c 'echo "elastic=$DILOCO_ELASTIC restart=$DILOCO_RESTART_COUNT"
  if [ $DILOCO_RANK = 1 ] && [ $DILOCO_RESTART_COUNT -lt 2 ]; then kill -KILL $$; fi' 2>&1) || rc=$?
echo "$out"
[[ $rc -eq 0 ]] || fail "rank 1 succeeded on its second restart, yet the launcher exited with $rc"
for n in 0 1 2; do
  grep -q "^\[rank 1\] elastic=1 restart=$n$" <<<"$out" || fail "rank 1's run $n did not report itself: $out"
done
grep -q "rank 1 killed by SIGKILL; restarting it (restart 1 of 2)" <<<"$out" || fail "no first restart message"
grep -q "rank 1 killed by SIGKILL; restarting it (restart 2 of 2)" <<<"$out" || fail "no second restart message"
[[ $(grep -c "^\[rank 0\]" <<<"$out") -eq 1 ]] || fail "rank 0 was started more than once"

# Restarts exhausted: the launcher reports it, leaves the others running
# (an elastic group goes on without the rank) and exits with its status.
rc=0
out=$("$launch" 3 --max-restarts 1 -- bash -c 'if [ $DILOCO_RANK = 2 ]; then exit 5; fi; sleep 0.5; echo finished' 2>&1) || rc=$?
echo "$out"
[[ $rc -eq 5 ]] || fail "rank 2 failed for good with 5, yet the launcher exited with $rc"
grep -q "rank 2 exited with status 5, no restarts left; the others go on" <<<"$out" || fail "no 'no restarts left' message"
for r in 0 1; do grep -q "^\[rank $r\] finished" <<<"$out" || fail "rank $r was stopped: $out"; done

# After a rank fails, bash must not report "wait_for: No record of process
# N" (the launcher's KILL watchdog, a background copy of the launcher, ran
# the launcher's traps when TERM reached it early: about one run in three).
for ((n = 0; n < 20; n++)); do
  rc=0
  out=$("$launch" 2 -- bash -c 'exit $DILOCO_RANK' 2>&1) || rc=$?
  [[ $rc -eq 1 ]] || fail "rank 1 exited 1, yet the launcher exited with $rc: $out"
  ! grep -q "No record of process" <<<"$out" || fail "run $n of 20 after a failed rank: $out"
done

echo "launch_gloo.sh: all checks passed"
