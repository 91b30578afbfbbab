#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A compiler launcher (CMake's <LANG>_COMPILER_LAUNCHER) for test programs
# whose tests another build tree runs: it compiles the source with
# -fsyntax-only (parsing, template instantiation and the front end's
# diagnostics, -Werror included; no code generation) and writes, in place of
# the object, a stub whose program says so and exits 1 if run. ./test.sh's
# release stage gives it the unit tests its ASan + UBSan stage builds and runs
# (test/CMakeLists.txt, DILOCO_COMPILE_ONLY_TARGETS; test/README.md says which).
#   syntax-only.sh COMPILER ARGS... -o OBJECT -c SOURCE
set -euo pipefail
args=()
out=
while (($#)); do
  case $1 in
    -o) out=$2; shift 2 ;;
    -c) shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$out" ] || [ ${#args[@]} -eq 0 ]; then
  echo "syntax-only.sh: expected COMPILER ARGS... -o OBJECT -c SOURCE" >&2
  exit 2
fi
"${args[@]}" -fsyntax-only
name=$(basename "$out")
# The stub's main is weak: the program's own main (doctest's, or the
# test's), when another object has one, is the one linked.
printf '%s\n' '#include <cstdio>' '#include <cstdlib>' \
  "namespace { const int compiled_only = (std::fputs(\"${name//\"/}: compiled with -fsyntax-only (DILOCO_COMPILE_ONLY_TARGETS); its tests run in another build tree\\n\", stderr), std::exit(1), 0); }" \
  '__attribute__((weak)) int main() { return 1; }' |
  "${args[0]}" -x c++ -c - -o "$out"
