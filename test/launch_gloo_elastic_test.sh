#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/launch_gloo.sh --max-restarts with real elastic Gloo workers: rank
# 1 SIGKILLs itself in the inner steps of round 2 (the test-only fault hook
# of test_elastic_gloo, which is also the rank program), the launcher starts
# it again, the restarted process joins the running group as a new worker
# and receives the state from a live member, and all 4 end with the same
# theta_global in a group of 4.
set -euo pipefail
launch=${1:?usage: launch_gloo_elastic_test.sh path/to/launch_gloo.sh path/to/test_elastic_gloo}
program=${2:?usage: launch_gloo_elastic_test.sh path/to/launch_gloo.sh path/to/test_elastic_gloo}
fail() { echo "FAIL: $*" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/launch_elastic.XXXXXX")
trap 'rm -rf "$dir"' EXIT
rc=0
out=$(DILOCO_TEST_ROLE=train DILOCO_TEST_DIR="$dir" DILOCO_TEST_ROUNDS=6 DILOCO_TEST_WANT_SIZE=4 \
  timeout 120 "$launch" 4 --max-restarts 1 --timeout-ms 1500 -- bash -c '
    if [ "$DILOCO_RANK" = 1 ] && [ "$DILOCO_RESTART_COUNT" = 0 ]; then export DILOCO_FAULT=inner:2; fi
    exec "$0"' "$program" 2>&1) || rc=$?
echo "$out"
for f in "$dir"/error.*; do [[ -e $f ]] && echo "error: $(cat "$f")"; done
[[ $rc -eq 0 ]] || fail "the launcher exited with $rc"
grep -q "rank 1 killed by SIGKILL; restarting it (restart 1 of 1)" <<<"$out" || fail "rank 1 was not restarted"
thetas=("$dir"/theta.*)
[[ ${#thetas[@]} -eq 4 && -e ${thetas[0]} ]] || fail "expected 4 finished workers, found ${#thetas[@]}"
# "hash size rounds changes": the same theta_global bits, a group of 4.
[[ $(cut -d' ' -f1 "${thetas[@]}" | sort -u | wc -l) -eq 1 ]] || fail "theta_global differs: $(cat "${thetas[@]}")"
for f in "${thetas[@]}"; do
  [[ $(cut -d' ' -f2 "$f") == 4 ]] || fail "a worker ended in a group of $(cut -d' ' -f2 "$f"), not 4"
done
echo "launch_gloo.sh --max-restarts: the restarted rank rejoined; 4 identical theta_global"
