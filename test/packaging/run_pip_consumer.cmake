# SPDX-License-Identifier: Apache-2.0
# run_consumer.cmake with the consumer built by a CMake that pip installs
# into a private virtual environment: -DVENV=<dir> -DPYTHON=<python3>
# -DPIP_REQUIREMENTS=cmake,... plus run_consumer.cmake's arguments. Prints
# "SKIPPED: ..." (the test's skip expression) when PyPI is out of reach.
include(${CMAKE_CURRENT_LIST_DIR}/pip_venv.cmake)
diloco_pip_venv_or_skip()
set(CONSUMER_CMAKE ${VENV}/bin/cmake)
execute_process(COMMAND ${CONSUMER_CMAKE} --version OUTPUT_VARIABLE version)
message(STATUS "the consumer is built with ${version}")
include(${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
