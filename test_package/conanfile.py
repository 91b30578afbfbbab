# SPDX-License-Identifier: Apache-2.0
# Conan's test of the package: a consumer built with CMake against what
# `conan create` packaged, found through diloco's own CMake package.
import os

from conan import ConanFile
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
        # Exercise the OpenMP component when the package has it.
        toolchain.cache_variables["DILOCO_TEST_OPENMP"] = bool(self.dependencies["diloco"].options.openmp)
        toolchain.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()
        cmake.build()

    def test(self):
        if can_run(self):
            self.run(os.path.join(self.cpp.build.bindir, "test_package"), env="conanrun")
