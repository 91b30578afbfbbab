# SPDX-License-Identifier: Apache-2.0
# cmake -DDOXYGEN=<doxygen> -DDOXYFILE=<build>/docs/Doxyfile -DSOURCE_DIR=<repo> -P check_api_reference.cmake
# The API reference builds without a single Doxygen warning (docs/Doxyfile.in
# turns every warning, an undocumented public name included, into a failed
# run), and every concept under include/ has a /// comment right above its
# template head: Doxygen 1.9 documents concepts but does not warn about an
# undocumented one.
cmake_minimum_required(VERSION 3.21)
execute_process(COMMAND ${DOXYGEN} ${DOXYFILE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE warnings)
if(NOT rc EQUAL 0 OR NOT warnings STREQUAL "")
  string(REGEX MATCHALL "\n" lines "\n${warnings}")
  list(LENGTH lines n)
  math(EXPR n "${n} - 1")
  message(FATAL_ERROR "doxygen exited with ${rc} and ${n} warning lines (every public name needs a /// comment; "
                      "detail namespaces are left out):\n${warnings}${out}")
endif()

file(GLOB_RECURSE headers ${SOURCE_DIR}/include/*.hpp ${SOURCE_DIR}/include/*.cuh)
set(missing "")
set(count 0)
foreach(h IN LISTS headers)
  file(READ ${h} text)
  string(REGEX MATCHALL "\n[ ]*concept [A-Za-z0-9_]+" declared "${text}")
  string(REGEX MATCHALL "///[^\n]*\n(template[^\n]*\n|[ ]+requires[^\n]*\n)*[ ]*concept [A-Za-z0-9_]+" documented
         "${text}")
  string(REGEX REPLACE "[^;]*concept " "" documented "${documented}")
  foreach(d IN LISTS declared)
    string(REGEX REPLACE ".*concept " "" name "${d}")
    math(EXPR count "${count} + 1")
    if(NOT name IN_LIST documented)
      file(RELATIVE_PATH rel ${SOURCE_DIR} ${h})
      list(APPEND missing "${rel}: concept ${name}")
    endif()
  endforeach()
endforeach()
if(count LESS 10)
  message(FATAL_ERROR "found only ${count} concepts under ${SOURCE_DIR}/include: wrong directory?")
elseif(missing)
  list(JOIN missing "\n  " missing)
  message(FATAL_ERROR "no /// comment right above the template head of:\n  ${missing}")
endif()
message(STATUS "the API reference builds without warnings; ${count} concepts carry a /// comment")
