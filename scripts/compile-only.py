#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Which test programs of one build tree need only be compiled, because
another tree builds and runs their tests.

    scripts/compile-only.py TREE KEEP_REGEX OTHER_TREE [ctest selection...] [-- OTHER_TREE [selection...]]...

./test.sh's release tree (g++) and its ASan + UBSan tree (clang++) both built
and ran the unit tests; code generation was about three quarters of g++'s
time on them. This picks the tests that an OTHER_TREE's selection runs and
that TREE has too (same name), for each OTHER_TREE given, less those whose
names match KEEP_REGEX (tests TREE must still run itself), and prints two
lines, CMake lists:

    targets: the programs of TREE that only those tests run (a program that
             any other test of TREE runs is left out: it is built and run);
    tests:   those of the picked tests whose programs are all in `targets`
             (a test that is a script alone keeps running in TREE).

test/CMakeLists.txt compiles the `targets` with -fsyntax-only
(DILOCO_COMPILE_ONLY_TARGETS) and disables the `tests`
(DILOCO_COMPILE_ONLY_TESTS). If a tree's tests cannot be listed, it prints two
empty lines: everything is built and run, never less.
"""
import importlib.util
import os
import re
import subprocess
import sys


def load_build_tested():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build-tested.py")
    spec = importlib.util.spec_from_file_location("build_tested", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: compile-only.py TREE KEEP_REGEX OTHER_TREE [ctest selection...] [-- OTHER_TREE [selection...]]...")
    tree, keep = sys.argv[1], re.compile(sys.argv[2])
    others = [[]]
    for arg in sys.argv[3:]:
        if arg == "--":
            others.append([])
        else:
            others[-1].append(arg)
    bt = load_build_tested()
    try:
        ours = bt.targets_of_tests(tree, [])
        theirs = set()
        for other in others:
            if not other:
                sys.exit("compile-only: '--' must be followed by a build tree")
            theirs |= set(bt.targets_of_tests(other[0], other[1:]))
    except (subprocess.CalledProcessError, ValueError, KeyError) as e:
        print(f"compile-only: cannot list the tests ({e}); every test is built and run", file=sys.stderr)
        print()
        print()
        return
    picked = {t for t in theirs if t in ours and not keep.search(t)}
    elsewhere = set().union(*(ours[t] for t in ours if t not in picked))
    targets = set().union(*(ours[t] for t in picked)) - elsewhere
    tests = {t for t in picked if ours[t] and ours[t] <= targets}
    print(";".join(sorted(targets)))
    print(";".join(sorted(tests)))
    trees = ", ".join(other[0] for other in others)
    print(f"compile-only: {len(targets)} programs compiled only, {len(tests)} tests run by {trees} alone",
          file=sys.stderr)


if __name__ == "__main__":
    main()
