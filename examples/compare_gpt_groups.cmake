# SPDX-License-Identifier: Apache-2.0
# cmake "-DFLAT_COMMAND=train_gpt;--workers;2;..." "-DGROUPS_COMMAND=train_gpt;--workers;4;--group-size;2;..."
#       "-DMETHODS=diloco;diloco one-step delay" -P compare_gpt_groups.cmake
# DiLoCo over 2 groups of 2 ranks (gradients averaged inside each group,
# theta_global and the outer state sharded over it: diloco::replicated)
# against flat DiLoCo with 2 workers on the same data. Group r's two ranks
# take exactly flat worker r's windows (a step's batch split 4 ways is the
# 2-way split cut in halves), so both train the same model up to the order
# of the float sums in the batch mean (a mean of two half-batch means): for
# each method the held-out losses printed to 4 decimals agree within 2e-4,
# and the rounds and bytes per worker (a group's bytes over inter, the sum
# of its shards') are equal.
function(rows_of out command)
  execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${command}\n${text}\n${err}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The loss (in units of 1e-4), bytes and rounds of `method`'s row (with the
# groups suffix when `suffix` is set) in `text`.
function(row_of prefix text method suffix)
  string(REPLACE "+" "\\+" m "${method}")
  string(REGEX MATCH "\n${m}${suffix} +2 +[0-9]+ +([0-9]+)\\.([0-9][0-9][0-9][0-9]) +[0-9.]+ +([0-9.]+ [kMG]?B) +([0-9]+)"
         row "${text}")
  if(NOT row)
    message(FATAL_ERROR "no row '${method}${suffix}' with 2 workers in:\n${text}")
  endif()
  math(EXPR loss "${CMAKE_MATCH_1} * 10000 + 1${CMAKE_MATCH_2} - 10000")
  set(${prefix}_loss ${loss} PARENT_SCOPE)
  set(${prefix}_bytes "${CMAKE_MATCH_3}" PARENT_SCOPE)
  set(${prefix}_rounds "${CMAKE_MATCH_4}" PARENT_SCOPE)
endfunction()

rows_of(flat "${FLAT_COMMAND}")
rows_of(groups "${GROUPS_COMMAND}")
foreach(method IN LISTS METHODS)
  row_of(f "${flat}" "${method}" "")
  row_of(g "${groups}" "${method}" " \\(2 groups of 2\\)")
  math(EXPR diff "${f_loss} - ${g_loss}")
  if(diff LESS 0)
    math(EXPR diff "0 - ${diff}")
  endif()
  message(STATUS "${method}: held-out loss x1e4 flat ${f_loss}, groups ${g_loss}; bytes ${f_bytes} / ${g_bytes}; "
                 "rounds ${f_rounds} / ${g_rounds}")
  if(diff GREATER 2)
    message(FATAL_ERROR "${method}: the groups' held-out loss (${g_loss} x 1e-4) is more than 2e-4 from flat DiLoCo's "
                        "(${f_loss} x 1e-4)")
  endif()
  if(NOT f_bytes STREQUAL g_bytes OR NOT f_rounds STREQUAL g_rounds)
    message(FATAL_ERROR "${method}: bytes per worker ${g_bytes} and rounds ${g_rounds} over groups, expected flat "
                        "DiLoCo's ${f_bytes} and ${f_rounds}")
  endif()
endforeach()
