#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Builds only the targets a ctest selection runs.

    scripts/build-tested.py BUILD_DIR JOBS [ctest selection arguments...]

e.g. scripts/build-tested.py build-tsan 2 -L "threads|tsan" -LE slow

The sanitizer stages of ./test.sh run a subset of the tests (ASan the unit
tests, TSan the threaded ones); building every target for them cost about
as much as running them. This asks ctest which tests the selection picks
(--show-only=json-v1), reads their command lines from the build tree's
CTestTestfile.cmake files (ctest leaves out the command of a test whose
program is not built yet), takes every executable they name (the test's
own program, and programs passed as arguments, also as NAME=path or as an
item of a CMake list, NAME=path;args), keeps those that are targets of the
build tree, and builds them. A test whose programs are not targets (a
script alone) needs nothing built. If ctest or the target list cannot be read, it builds
everything, so the stage is never weaker than a full build.
"""
import json
import os
import re
import subprocess
import sys


def test_commands(build_dir):
    """{test name: [program, arguments...]} from every CTestTestfile.cmake."""
    commands = {}
    for folder, _, files in os.walk(build_dir):
        if "CTestTestfile.cmake" not in files:
            continue
        with open(os.path.join(folder, "CTestTestfile.cmake"), encoding="utf-8") as f:
            for line in f:
                m = re.match(r'add_test\(\[=\[(.*?)\]=\] (.*)\)\s*$', line)
                if m:
                    commands[m.group(1)] = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2))
    return commands


def build(build_dir, jobs, targets):
    cmd = ["cmake", "--build", build_dir, "-j", jobs]
    if targets is not None:
        cmd += ["--target", *sorted(targets)]
    print("build-tested:", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def targets_of_tests(build_dir, selection):
    """{test name: set of target names} for the tests a ctest selection picks:
    the executables each test's command names that are targets of the tree.
    Raises subprocess.CalledProcessError, ValueError or KeyError when ctest or
    the target list cannot be read."""
    shown = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1", *selection],
                           check=True, capture_output=True, text=True).stdout
    tests = [t["name"] for t in json.loads(shown)["tests"]]
    listing = subprocess.run(["cmake", "--build", build_dir, "--target", "help"],
                             check=True, capture_output=True, text=True).stdout
    # Makefiles and Ninja both list one target per line, as "... name" or "name: phony".
    known = set()
    for line in listing.splitlines():
        line = line.strip()
        if line.startswith("... "):
            known.add(line[4:].split()[0])
        elif line.endswith(": phony"):
            known.add(line[: -len(": phony")])
    root = os.path.realpath(build_dir)
    commands = test_commands(build_dir)
    found = {}
    for test in tests:
        wanted = found.setdefault(test, set())
        for arg in commands.get(test, []):
            # A path alone, NAME=path, or a CMake list (NAME=path;arg;...).
            for path in {arg, *arg.split("=", 1)[-1].split(";")}:
                if os.path.isabs(path) and os.path.realpath(path).startswith(root + os.sep):
                    name = os.path.basename(path)
                    if name in known:
                        wanted.add(name)
    return found


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: build-tested.py BUILD_DIR JOBS [ctest selection arguments...]")
    build_dir, jobs, selection = sys.argv[1], sys.argv[2], sys.argv[3:]
    try:
        found = targets_of_tests(build_dir, selection)
    except (subprocess.CalledProcessError, ValueError, KeyError) as e:
        print(f"build-tested: cannot list the tests or targets ({e}); building everything", flush=True)
        sys.exit(build(build_dir, jobs, None))
    wanted = set().union(*found.values())
    print(f"build-tested: {len(found)} tests need {len(wanted)} of the build's targets", flush=True)
    if not wanted:
        sys.exit(0)
    sys.exit(build(build_dir, jobs, wanted))


if __name__ == "__main__":
    main()
