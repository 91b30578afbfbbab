# cmake -DMODE=find_package|add_subdirectory -DDILOCO_SOURCE_DIR=.. -DDILOCO_BINARY_DIR=..
#       -DWORK_DIR=.. -DCXX=.. -DGENERATOR=.. -P run_consumer.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()

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

if(NOT CONSUMER)
  set(CONSUMER consumer)  # the project under test/packaging/ to build
endif()
run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/${CONSUMER} -B ${WORK_DIR}/build -G ${GENERATOR} ${consumer_args})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer)
