# cmake -DMODE=find_package|add_subdirectory -DDILOCO_SOURCE_DIR=.. -DDILOCO_BINARY_DIR=..
#       -DWORK_DIR=.. -DCXX=.. -DGENERATOR=.. -P run_consumer.cmake
# -DCONSUMER=<dir under this one> picks the consumer project (default: consumer).
if(NOT DEFINED CONSUMER)
  set(CONSUMER consumer)
endif()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

include(${CMAKE_CURRENT_LIST_DIR}/run_common.cmake)

set(consumer_args -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release -DCONSUMER_MODE=${MODE})
if(MODE STREQUAL "find_package")
  # Install exactly what this build tree would install, into a private prefix.
  run(${CMAKE_COMMAND} --install ${DILOCO_BINARY_DIR} --prefix ${WORK_DIR}/prefix)
  list(APPEND consumer_args -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
  if(NOT EXISTS ${WORK_DIR}/prefix/include/diloco/diloco.hpp)
    message(FATAL_ERROR "install did not put diloco/diloco.hpp under include/")
  endif()
else()
  list(APPEND consumer_args -DDILOCO_SOURCE_DIR=${DILOCO_SOURCE_DIR})
endif()

run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/${CONSUMER} -B ${WORK_DIR}/build -G ${GENERATOR} ${consumer_args})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
