# SPDX-License-Identifier: Apache-2.0
# Conan 2 recipe for diloco, a header-only library. The optional components
# (CMake targets diloco::openmp, diloco::mpi, diloco::gloo, diloco::cuda,
# diloco::nccl, diloco::torch, diloco::json) are options, so what the package
# holds follows from its package id and not from what the build machine has;
# their dependencies come from the system (Debian packages, the CUDA
# toolkit, LibTorch, nlohmann-json), not from Conan, so the recipe has no
# requirements and `conan create` needs no remote. The package also holds
# the launcher, bin/diloco-launch (scripts/launch_gloo.sh).
#
#   conan create . -s compiler.cppstd=20 [-o "diloco/*:mpi=True" ...]
#
# Consumers use diloco's own CMake package (its component targets and the
# C++20 flag for nvcc): find_package(diloco CONFIG REQUIRED [COMPONENTS ...])
# with Conan's CMakeToolchain, as test_package/ does.
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load

# The same list as DILOCO_COMPONENTS in cmake/diloco_install.cmake.
COMPONENTS = ("openmp", "mpi", "gloo", "cuda", "nccl", "torch", "json")


class DilocoConan(ConanFile):
    name = "diloco"
    description = "Header-only C++20 DiLoCo: low-communication distributed training as composable policies"
    license = "Apache-2.0"
    topics = ("distributed-training", "diloco", "header-only", "mpi", "cuda", "nccl", "gloo")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {component: [True, False] for component in COMPONENTS}
    default_options = {component: False for component in COMPONENTS}
    exports_sources = "CMakeLists.txt", "LICENSE", "cmake/*", "include/*", "scripts/launch_gloo.sh"
    no_copy_source = True

    def set_version(self):
        # The version is defined once, in include/diloco/version.hpp.
        header = load(self, os.path.join(self.recipe_folder, "include", "diloco", "version.hpp"))
        parts = []
        for part in ("MAJOR", "MINOR", "PATCH"):
            found = re.search(rf"^#define DILOCO_VERSION_{part} (\d+)$", header, re.MULTILINE)
            if not found:
                raise ConanInvalidConfiguration(f"include/diloco/version.hpp defines no DILOCO_VERSION_{part}")
            parts.append(found.group(1))
        self.version = ".".join(parts)

    def layout(self):
        cmake_layout(self)

    def package_id(self):
        # Headers and CMake files only: the compiler and build type do not
        # change the package; the components do.
        self.info.settings.clear()

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            try:
                check_min_cppstd(self, 20)
            except ConanInvalidConfiguration:
                raise ConanInvalidConfiguration(
                    f"diloco needs C++20, the profile has compiler.cppstd={self.settings.compiler.cppstd}: "
                    "use -s compiler.cppstd=20 (or gnu20)")
        if self.options.nccl and not self.options.cuda:
            raise ConanInvalidConfiguration("diloco/*:nccl=True needs diloco/*:cuda=True (NCCL is a CUDA library)")

    def generate(self):
        toolchain = CMakeToolchain(self)
        for what in ("TESTS", "EXAMPLES", "BENCHMARKS", "DOCS"):
            toolchain.cache_variables[f"DILOCO_BUILD_{what}"] = False
        toolchain.cache_variables["DILOCO_INSTALL"] = True
        # ON: required (a missing dependency stops the build, naming it); OFF: left out.
        for component in COMPONENTS:
            toolchain.cache_variables[f"DILOCO_ENABLE_{component.upper()}"] = \
                "ON" if self.options.get_safe(component) else "OFF"
        toolchain.generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        cmake = CMake(self)
        cmake.install()

    def package_info(self):
        # diloco's own CMake package, found in share/cmake/diloco under the
        # package folder; Conan generates none in its place.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.builddirs = ["."]
        self.cpp_info.bindirs = ["bin"]  # diloco-launch
        self.cpp_info.libdirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
