# SPDX-License-Identifier: Apache-2.0
# cmake -DMODE=find_package|add_subdirectory -DDILOCO_SOURCE_DIR=.. -DDILOCO_BINARY_DIR=..
#       -DWORK_DIR=.. -DCXX=.. -DGENERATOR=.. -P run_consumer.cmake
# Lists given on the command line are comma-separated (a ';' does not survive
# add_test's arguments). Optional:
#   -DCONSUMER=<dir under this one>   the consumer project (default: consumer)
#   -DCONSUMER_ARGS=<-D...,...>       more arguments for the consumer's configure
#   -DCONSUMER_EXTRA_ARGS=<...>       and more (for a wrapper that adds its own)
#   -DCONSUMER_CMAKE=<cmake>          the CMake that builds the consumer (default: this one)
#   -DFRESH_CONFIGURE=<-D...,...>     find_package mode: install from a fresh configure of the
#                                     source tree with these arguments instead of DILOCO_BINARY_DIR
#   -DFRESH_EXPECT=<regex>            ... whose output must match this
#   -DINSTALLED_PREFIX=<dir>          find_package mode: diloco is installed there already
#   -DONE_STD=<regex>                 every compile command of the consumer has exactly one -std
#                                     flag, matching this (read from compile_commands.json)
#   -DEXPECT_OUTPUT=<regex>           the consumer's output must match this
#   -DLAUNCHER=<path>                 find_package mode: where the launcher is installed under the
#                                     prefix (default bin/diloco-launch)
#   -DLAUNCH_EXPECT=<regex>           each rank's output under the launcher must match this, with
#                                     @RANK@ standing for the rank (default: EXPECT_OUTPUT)
foreach(list_var CONSUMER_ARGS CONSUMER_EXTRA_ARGS FRESH_CONFIGURE)
  string(REPLACE "," ";" ${list_var} "${${list_var}}")
endforeach()
if(NOT DEFINED CONSUMER)
  set(CONSUMER consumer)
endif()
if(NOT DEFINED CONSUMER_CMAKE)
  set(CONSUMER_CMAKE ${CMAKE_COMMAND})
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

include(${CMAKE_CURRENT_LIST_DIR}/run_common.cmake)

set(consumer_args -DCMAKE_CXX_COMPILER=${CXX} ${consumer_build_type} -DCONSUMER_MODE=${MODE} ${CONSUMER_ARGS}
                  ${CONSUMER_EXTRA_ARGS})
if(MODE STREQUAL "find_package" AND DEFINED INSTALLED_PREFIX)
  list(APPEND consumer_args -DCMAKE_PREFIX_PATH=${INSTALLED_PREFIX})
elseif(MODE STREQUAL "find_package")
  set(installed_tree ${DILOCO_BINARY_DIR})
  # (Not DEFINED: the comma split above defines it, empty, for every test.)
  if(NOT FRESH_CONFIGURE STREQUAL "")
    # What an installer does: configure and install, no build step.
    set(installed_tree ${WORK_DIR}/diloco-build)
    run_matching("${FRESH_EXPECT}" ${CMAKE_COMMAND} -S ${DILOCO_SOURCE_DIR} -B ${installed_tree} -G ${GENERATOR}
                 -DCMAKE_CXX_COMPILER=${CXX} ${FRESH_CONFIGURE})
  endif()
  # Install exactly what that build tree would install, into a private prefix.
  run(${CMAKE_COMMAND} --install ${installed_tree} --prefix ${WORK_DIR}/prefix)
  list(APPEND consumer_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  if(NOT EXISTS ${WORK_DIR}/prefix/include/diloco/diloco.hpp)
    message(FATAL_ERROR "install did not put diloco/diloco.hpp under include/")
  endif()
else()
  list(APPEND consumer_args -DDILOCO_SOURCE_DIR=${DILOCO_SOURCE_DIR})
endif()

if(DEFINED ONE_STD)
  list(APPEND consumer_args -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)
endif()
run(${CONSUMER_CMAKE} -S ${CMAKE_CURRENT_LIST_DIR}/${CONSUMER} -B ${WORK_DIR}/build -G ${GENERATOR} ${consumer_args})
run(${CONSUMER_CMAKE} --build ${WORK_DIR}/build)

if(DEFINED ONE_STD)
  file(READ ${WORK_DIR}/build/compile_commands.json commands)
  string(JSON count LENGTH "${commands}")
  if(count EQUAL 0)
    message(FATAL_ERROR "compile_commands.json lists no compilation")
  endif()
  math(EXPR last "${count} - 1")
  foreach(i RANGE ${last})
    string(JSON command GET "${commands}" ${i} command)
    string(JSON source GET "${commands}" ${i} file)
    string(REGEX MATCHALL "(^| )-+std[= ][^ ]+" flags "${command}")
    list(LENGTH flags n)
    if(NOT n EQUAL 1 OR NOT flags MATCHES "${ONE_STD}")
      message(FATAL_ERROR "${source} is compiled with ${n} -std flags (${flags}); expected one matching "
                          "'${ONE_STD}':\n${command}")
    endif()
    message(STATUS "${source}: ${flags}")
  endforeach()
endif()

run_matching("${EXPECT_OUTPUT}" ${WORK_DIR}/build/consumer)

# find_package mode: the installed launcher (scripts/launch_gloo.sh as
# bin/diloco-launch) is there, prints its usage first, and runs the consumer
# as a 2-rank program, each rank's lines prefixed with its rank.
if(MODE STREQUAL "find_package")
  if(NOT DEFINED LAUNCHER)
    set(LAUNCHER bin/diloco-launch)
  endif()
  if(DEFINED INSTALLED_PREFIX)
    set(launcher ${INSTALLED_PREFIX}/${LAUNCHER})
  else()
    set(launcher ${WORK_DIR}/prefix/${LAUNCHER})
  endif()
  if(NOT EXISTS ${launcher})
    message(FATAL_ERROR "the install has no launcher ${LAUNCHER} (scripts/launch_gloo.sh installed as diloco-launch)")
  endif()
  run_matching("^usage: diloco-launch N " ${launcher} --help)
  if(NOT DEFINED LAUNCH_EXPECT)
    set(LAUNCH_EXPECT "${EXPECT_OUTPUT}")
  endif()
  execute_process(COMMAND ${launcher} 2 -- ${WORK_DIR}/build/consumer
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${LAUNCHER} 2 -- consumer failed (${rc}):\n${out}\n${err}")
  endif()
  foreach(rank 0 1)
    string(REPLACE "@RANK@" ${rank} expect "${LAUNCH_EXPECT}")
    if(NOT "${out}" MATCHES "(^|\n)\\[rank ${rank}\\] [^\n]*(${expect})")
      message(FATAL_ERROR "under ${LAUNCHER} 2, rank ${rank} printed no line matching '${expect}':\n${out}\n${err}")
    endif()
  endforeach()
  message(STATUS "${LAUNCHER} 2 -- consumer:\n${out}${err}")
endif()
