# SPDX-License-Identifier: Apache-2.0
# Conan's test of the package: a consumer built with CMake against what
# `conan create` packaged, found through diloco's own CMake package, asking
# for the components the package's options put in it (openmp, mpi, json);
# then the packaged launcher, bin/diloco-launch, runs it as two processes,
# and with the mpi option an MPI program runs under mpiexec -n 2 (as a
# singleton MPI process where no mpiexec is on the PATH).
import os
import re
import shutil
from io import StringIO

from conan import ConanFile
from conan.errors import ConanException
from conan.tools.build import can_run
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout


class DilocoTestPackage(ConanFile):
    settings = "os", "arch", "compiler", "build_type"

    def requirements(self):
        self.requires(self.tested_reference_str)

    def layout(self):
        cmake_layout(self)

    def generate(self):
        toolchain = CMakeToolchain(self)
        toolchain.user_presets_path = False  # write nothing into the source tree
        options = self.dependencies["diloco"].options
        for component in ("openmp", "mpi", "json"):
            toolchain.cache_variables[f"DILOCO_TEST_{component.upper()}"] = bool(options.get_safe(component))
        toolchain.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def _run_checked(self, command, expected):
        out = StringIO()
        self.run(command, env="conanrun", stdout=out)
        self.output.info(out.getvalue())
        for pattern in expected:
            if not re.search(pattern, out.getvalue(), re.MULTILINE):
                raise ConanException(f"'{command}' printed no line matching '{pattern}':\n{out.getvalue()}")

    def test(self):
        if not can_run(self):
            return
        program = os.path.join(self.cpp.build.bindir, "test_package")
        self.run(program, env="conanrun")
        launcher = os.path.join(self.dependencies["diloco"].package_folder, "bin", "diloco-launch")
        if not os.path.isfile(launcher):
            raise ConanException(f"the package has no bin/diloco-launch ({launcher})")
        self._run_checked(f"{launcher} 2 -- {program}",
                          [rf"^\[rank {rank}\] diloco .* process rank {rank}: " for rank in (0, 1)])
        if self.dependencies["diloco"].options.mpi:
            mpi_program = os.path.join(self.cpp.build.bindir, "test_package_mpi")
            mpiexec = shutil.which("mpiexec")
            if mpiexec is None:
                self._run_checked(mpi_program, [r"rank 0 of 1 holds 2 "])
                return
            version = StringIO()
            self.run(f"{mpiexec} --version", stdout=version, ignore_errors=True)
            # Open MPI: more ranks than cores, and root in a container.
            extra, env = "", ""
            if re.search("Open MPI|OpenRTE", version.getvalue()):
                extra, env = "--oversubscribe", "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
            self._run_checked(f"{env}{mpiexec} -n 2 {extra} {mpi_program}",
                              [rf"rank {rank} of 2 holds 3 " for rank in (0, 1)])
