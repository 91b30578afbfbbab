# SPDX-License-Identifier: Apache-2.0
# The programs the documentation shows are compiled and run by the test
# suite straight from the Markdown pages, so they cannot drift from the
# library. A page marks a program with
#
#   <!-- NAME:begin -->  ...  <!-- NAME:end -->
#
# and every ```cpp block between the two markers, in order, is one piece of
# that program: a page may interleave prose with the pieces (one block is
# the common case, as in README.md). C++ that is not part of the program
# stays outside the markers. Each piece starts with a #line directive, so
# a compiler error names the page and its line.
#
# diloco_doc_example(<page> <NAME> <output .cpp>) writes the program and
# makes the page a configure dependency (editing it regenerates the
# program; an unchanged program is not rewritten, so it is not rebuilt).
function(diloco_doc_example page marker out)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${page})
  file(READ ${page} text)
  set(begin_marker "<!-- ${marker}:begin -->")
  set(end_marker "<!-- ${marker}:end -->")
  string(FIND "${text}" "${begin_marker}" begin)
  string(FIND "${text}" "${end_marker}" end)
  if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
    message(FATAL_ERROR "${page}: no '${begin_marker}' ... '${end_marker}' region")
  endif()
  string(LENGTH "${begin_marker}" skip)
  math(EXPR at "${begin} + ${skip}")  # offset in the page of the region's start
  math(EXPR length "${end} - ${at}")
  string(SUBSTRING "${text}" ${at} ${length} region)

  set(program "")
  set(pieces 0)
  set(fence "```cpp\n")
  string(LENGTH "${fence}" fence_length)
  while(TRUE)
    string(FIND "${region}" "${fence}" open)
    if(open EQUAL -1)
      break()
    endif()
    math(EXPR code_start "${open} + ${fence_length}")
    string(SUBSTRING "${region}" ${code_start} -1 rest)
    string(FIND "${rest}" "\n```" close)  # the closing fence starts a line
    if(close EQUAL -1)
      message(FATAL_ERROR "${page}: a ```cpp block of '${marker}' is not closed")
    endif()
    # The page's line of the piece's first line, for #line.
    math(EXPR code_at "${at} + ${code_start}")
    string(SUBSTRING "${text}" 0 ${code_at} before)
    string(REGEX MATCHALL "\n" newlines "${before}")
    list(LENGTH newlines line)
    math(EXPR line "${line} + 1")
    math(EXPR code_length "${close} + 1")  # keep the piece's last newline
    string(SUBSTRING "${rest}" 0 ${code_length} code)
    string(APPEND program "#line ${line} \"${page}\"\n${code}")
    math(EXPR pieces "${pieces} + 1")
    math(EXPR after "${close} + 4")
    string(SUBSTRING "${rest}" ${after} -1 region)
    math(EXPR at "${code_at} + ${after}")
  endwhile()
  if(pieces EQUAL 0)
    message(FATAL_ERROR "${page}: the '${marker}' region holds no ```cpp block")
  endif()
  file(WRITE ${out}.new "${program}")
  configure_file(${out}.new ${out} COPYONLY)
endfunction()
