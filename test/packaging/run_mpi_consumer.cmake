# SPDX-License-Identifier: Apache-2.0
# cmake -DDILOCO_BINARY_DIR=.. -DWORK_DIR=.. -DCXX=.. -DGENERATOR=.. "-DLAUNCH=mpiexec;-n;2;..."
#       [-DPOSTFLAGS=..] -P run_mpi_consumer.cmake
# Installs this build tree into a private prefix, builds mpi_consumer against
# it with find_package(diloco COMPONENTS mpi), and runs it as
# LAUNCH mpi_consumer POSTFLAGS.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

include(${CMAKE_CURRENT_LIST_DIR}/run_common.cmake)

run(${CMAKE_COMMAND} --install ${DILOCO_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
if(NOT EXISTS ${WORK_DIR}/prefix/include/diloco/comm/mpi.hpp)
  message(FATAL_ERROR "install did not put diloco/comm/mpi.hpp under include/")
endif()
run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/mpi_consumer -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} ${consumer_build_type} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${LAUNCH} ${WORK_DIR}/build/mpi_consumer ${POSTFLAGS})
