# SPDX-License-Identifier: Apache-2.0
# cmake -DDILOCO_SOURCE_DIR=.. -DWORK_DIR=.. -DVENV=.. -DPYTHON=.. -DPIP_REQUIREMENTS=conan,...
#       [-DWITH_OPENMP=ON] [-DWITH_MPI=ON] [-DWITH_JSON=ON] -P run_conan_create.cmake
# `conan create` of the recipe in the source tree, with Conan from pip in a
# private virtual environment and a private, remote-less Conan home (the
# header-only recipe has no requirements: nothing is downloaded). Prints
# "SKIPPED: ..." (the test's skip expression) when PyPI is out of reach.
# Two packages: the default options (OpenMP where the build has it), whose
# package must hold no diloco::json even where nlohmann-json is installed
# (the options, not the machine, decide what is packaged); then mpi and json
# on where the build has them, whose test_package runs an MPI program under
# mpiexec -n 2 and prints statistics as JSON. Each test_package also runs
# under the packaged launcher, bin/diloco-launch, as two processes.
include(${CMAKE_CURRENT_LIST_DIR}/run_common.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/pip_venv.cmake)
diloco_pip_venv_or_skip()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(ENV{CONAN_HOME} ${WORK_DIR}/conan_home)
set(conan ${VENV}/bin/conan)
run(${conan} --version)
run(${conan} profile detect)
run(${conan} remote remove conancenter)
# A copy of what the recipe needs: test_package's build folder is made next
# to it, and the source tree stays clean.
set(recipe ${WORK_DIR}/recipe)
file(COPY ${DILOCO_SOURCE_DIR}/conanfile.py ${DILOCO_SOURCE_DIR}/CMakeLists.txt ${DILOCO_SOURCE_DIR}/LICENSE
          ${DILOCO_SOURCE_DIR}/cmake ${DILOCO_SOURCE_DIR}/include ${DILOCO_SOURCE_DIR}/test_package
     DESTINATION ${recipe})
file(COPY ${DILOCO_SOURCE_DIR}/scripts/launch_gloo.sh DESTINATION ${recipe}/scripts)

# A C++17 profile is refused before anything is built, naming the rule.
execute_process(COMMAND ${conan} create ${recipe} -s compiler.cppstd=17
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "diloco needs C\\+\\+20[^\n]*compiler.cppstd=20")
  message(FATAL_ERROR "conan create with compiler.cppstd=17 must fail naming C++20 (rc ${rc}):\n${out}\n${err}")
endif()

# conan_create(<out-folder-var> <options>...): `conan create` with these
# options; test_package (one round of model averaging, checked against its
# closed form, directly and as two processes under bin/diloco-launch) exits
# non-zero unless its checks hold, and the output shows it ran. Sets
# <out-folder-var> to the package's folder in the cache.
function(conan_create folder_var)
  set(create ${conan} create ${recipe} -s compiler.cppstd=20 -s build_type=Release)
  foreach(option IN LISTS ARGN)
    list(APPEND create -o "diloco/*:${option}")
  endforeach()
  execute_process(COMMAND ${create} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "conan create ${ARGN} failed (${rc})")
  endif()
  foreach(expect "diloco [0-9]+\\.[0-9]+\\.[0-9]+ from Conan: "
                 "\\[rank 0\\] diloco [^\n]* process rank 0: " "\\[rank 1\\] diloco [^\n]* process rank 1: ")
    if(NOT "${out}${err}" MATCHES "${expect}")
      message(FATAL_ERROR "conan create ${ARGN}: no output matches '${expect}'")
    endif()
  endforeach()
  if(NOT "${out}${err}" MATCHES "Package '([0-9a-f]+)' created")
    message(FATAL_ERROR "conan create ${ARGN}: no package id in its output")
  endif()
  execute_process(COMMAND ${conan} cache path "diloco/${version}:${CMAKE_MATCH_1}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE folder OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT IS_DIRECTORY "${folder}")
    message(FATAL_ERROR "conan cache path diloco/${version}:${CMAKE_MATCH_1} gave no folder (${rc}): ${folder}")
  endif()
  set(${folder_var} ${folder} PARENT_SCOPE)
endfunction()

# package_components(<out-var> <folder>): the component targets the package's
# CMake files define.
function(package_components out folder)
  file(READ ${folder}/share/cmake/diloco/dilocoTargets.cmake targets)
  string(REGEX MATCHALL "add_library\\(diloco::[a-z]+ " found "${targets}")
  string(REGEX REPLACE "add_library\\(diloco::([a-z]+) " "\\1" found "${found}")
  list(REMOVE_ITEM found diloco)
  set(${out} ${found} PARENT_SCOPE)
endfunction()

file(STRINGS ${DILOCO_SOURCE_DIR}/include/diloco/version.hpp version_lines REGEX "^#define DILOCO_VERSION_[A-Z]+ [0-9]+$")
string(REGEX REPLACE "[^;]*MAJOR ([0-9]+);[^;]*MINOR ([0-9]+);[^;]*PATCH ([0-9]+)" "\\1.\\2.\\3" version
       "${version_lines}")

# The default options (OpenMP where the build has it): every component not
# asked for is left out, JSON included, whatever this machine has installed.
set(options "")
set(expected "")
if(WITH_OPENMP)
  set(options openmp=True)
  set(expected openmp)
endif()
conan_create(folder ${options})
package_components(components ${folder})
if(NOT components STREQUAL expected)
  message(FATAL_ERROR "options '${options}' packaged the components '${components}', expected '${expected}'")
endif()
if(NOT EXISTS ${folder}/bin/diloco-launch)
  message(FATAL_ERROR "the package has no bin/diloco-launch: ${folder}")
endif()

# mpi and json on, where the build has them (test_package asks for both and
# runs the MPI program).
set(options "")
set(expected "")
if(WITH_MPI)
  set(options mpi=True)
  set(expected mpi)
endif()
if(WITH_JSON)
  list(APPEND options json=True)
  list(APPEND expected json)
endif()
if(expected)
  conan_create(folder ${options})
  package_components(components ${folder})
  if(NOT components STREQUAL expected)
    message(FATAL_ERROR "options '${options}' packaged the components '${components}', expected '${expected}'")
  endif()
endif()
