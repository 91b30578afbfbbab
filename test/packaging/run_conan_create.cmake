# SPDX-License-Identifier: Apache-2.0
# cmake -DDILOCO_SOURCE_DIR=.. -DWORK_DIR=.. -DVENV=.. -DPYTHON=.. -DPIP_REQUIREMENTS=conan,...
#       [-DWITH_OPENMP=ON] -P run_conan_create.cmake
# `conan create` of the recipe in the source tree, with Conan from pip in a
# private virtual environment and a private, remote-less Conan home (the
# header-only recipe has no requirements: nothing is downloaded). Prints
# "SKIPPED: ..." (the test's skip expression) when PyPI is out of reach.
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

# A C++17 profile is refused before anything is built, naming the rule.
execute_process(COMMAND ${conan} create ${recipe} -s compiler.cppstd=17
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "diloco needs C\\+\\+20[^\n]*compiler.cppstd=20")
  message(FATAL_ERROR "conan create with compiler.cppstd=17 must fail naming C++20 (rc ${rc}):\n${out}\n${err}")
endif()

# The package and its test_package (one round of model averaging, checked
# against its closed form).
set(create ${conan} create ${recipe} -s compiler.cppstd=20 -s build_type=Release)
if(WITH_OPENMP)
  list(APPEND create -o "diloco/*:openmp=True")
endif()
# test_package exits non-zero unless its check holds: the output shows it ran.
run_matching("diloco [0-9]+\\.[0-9]+\\.[0-9]+ from Conan: " ${create})
