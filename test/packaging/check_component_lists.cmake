# SPDX-License-Identifier: Apache-2.0
# cmake -DDILOCO_SOURCE_DIR=.. -P check_component_lists.cmake
# The CMake components are listed once, DILOCO_COMPONENTS in
# cmake/diloco_install.cmake; every other list of them (the find_package
# comments, docs/installing.md's table and its Conan and vcpkg paragraphs,
# the Conan recipe's options, the vcpkg port's features, portfile and usage) must
# name the same ones. Fails naming each list that differs.
cmake_minimum_required(VERSION 3.21)  # string(JSON)
set(src ${DILOCO_SOURCE_DIR})

# names_of(<out> <text> <regex>): the names the regex's first group holds in
# each match, sorted.
function(names_of out text regex)
  string(REGEX MATCHALL "${regex}" matches "${text}")
  set(names "")
  foreach(m IN LISTS matches)
    string(REGEX REPLACE "${regex}" "\\1" name "${m}")
    list(APPEND names ${name})
  endforeach()
  list(SORT names)
  set(${out} ${names} PARENT_SCOPE)
endfunction()

# words_of(<out> <text> <regex>): the first group of the regex's one match,
# split at commas, blanks and backquotes, sorted.
function(words_of out text regex)
  if(NOT text MATCHES "${regex}")
    set(${out} "(no match for '${regex}')" PARENT_SCOPE)
    return()
  endif()
  string(REGEX REPLACE "[`, \n]+" ";" words "${CMAKE_MATCH_1}")
  list(REMOVE_ITEM words "")
  list(SORT words)
  set(${out} ${words} PARENT_SCOPE)
endfunction()

file(READ ${src}/cmake/diloco_install.cmake install)
words_of(canonical "${install}" "\nset\\(DILOCO_COMPONENTS ([a-z ]+)\\)")
list(LENGTH canonical count)
if(count LESS 2)
  message(FATAL_ERROR "cmake/diloco_install.cmake sets no DILOCO_COMPONENTS list: ${canonical}")
endif()

set(lists "")
macro(compare what)
  list(APPEND lists "${what}")
  if(NOT "${ARGN}" STREQUAL "${canonical}")
    string(APPEND differ "  ${what}: ${ARGN}\n")
  endif()
endmacro()
set(differ "")

words_of(l "${install}" "COMPONENTS ([a-z ]+)\\]\\)")
compare("cmake/diloco_install.cmake's find_package comment" ${l})

file(READ ${src}/cmake/diloco_backends.cmake backends)
names_of(l "${backends}" "_diloco_add_component\\(([a-z]+) ")
compare("cmake/diloco_backends.cmake's _diloco_add_component calls" ${l})

file(READ ${src}/conanfile.py conan)
string(REGEX REPLACE "\"" "" conan_plain "${conan}")
words_of(l "${conan_plain}" "\nCOMPONENTS = \\(([a-z, ]+)\\)")
compare("conanfile.py's COMPONENTS" ${l})

file(READ ${src}/ports/diloco/vcpkg.json manifest)
string(JSON n LENGTH "${manifest}" features)
set(l "")
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON f MEMBER "${manifest}" features ${i})
  list(APPEND l ${f})
endforeach()
list(SORT l)
compare("ports/diloco/vcpkg.json's features" ${l})

file(READ ${src}/ports/diloco/portfile.cmake portfile)
names_of(l "${portfile}" "\n +([a-z]+) +DILOCO_ENABLE_[A-Z]+")
compare("ports/diloco/portfile.cmake's vcpkg_check_features" ${l})

file(READ ${src}/ports/diloco/usage usage)
words_of(l "${usage}" "\\(components: ([a-z, ]+)\\)")
compare("ports/diloco/usage" ${l})

file(READ ${src}/README.md readme)
words_of(l "${readme}" "add COMPONENTS ([a-z ]+) as needed")
compare("README's find_package comment" ${l})

file(READ ${src}/docs/installing.md installing)
words_of(l "${installing}" "add COMPONENTS ([a-z ]+) as needed")
compare("docs/installing.md's find_package comment" ${l})
names_of(l "${installing}" "\n\\| `diloco::([a-z]+)` \\|")
compare("docs/installing.md's table of components" ${l})
words_of(l "${installing}" "\\(header-only; options ([`a-z, \n]+), all\n?[ ]?off by default")
compare("docs/installing.md's Conan options" ${l})
words_of(l "${installing}" "in, with features ([`a-z, \n]+):")
compare("docs/installing.md's vcpkg features" ${l})

if(differ)
  message(FATAL_ERROR "these lists of components differ from DILOCO_COMPONENTS (${canonical}):\n${differ}")
endif()
list(LENGTH lists n)
message(STATUS "${n} lists of components agree with DILOCO_COMPONENTS: ${canonical}")
