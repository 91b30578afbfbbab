# SPDX-License-Identifier: Apache-2.0
# diloco_pip_venv(<venv dir> <python> <out-var> <requirement>...): a private
# virtual environment (python -m venv) with the requirements installed by
# pip from PyPI. Made once and reused by later tests. <out-var> is empty on
# success, else why it could not be made because PyPI was out of reach (the
# caller skips its test then); any other failure stops the script.
function(diloco_pip_venv venv python out)
  set(${out} "" PARENT_SCOPE)
  set(pip ${venv}/bin/pip)
  set(stamp ${venv}/installed.txt)
  if(EXISTS ${stamp})
    file(READ ${stamp} installed)
    if(installed STREQUAL "${ARGN}")
      return()
    endif()
  endif()
  if(NOT EXISTS ${pip})
    execute_process(COMMAND ${python} -m venv ${venv} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${python} -m venv ${venv} failed (Debian: apt-get install python3-venv):\n${o}\n${e}")
    endif()
  endif()
  # Short timeouts: an offline machine answers within seconds.
  set(ENV{PIP_DISABLE_PIP_VERSION_CHECK} 1)
  set(pip_net --timeout 15 --retries 1)
  list(GET ARGN 0 first)
  execute_process(COMMAND ${pip} download ${pip_net} --no-deps --dest ${venv}/probe ${first}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL 0)
    string(REGEX REPLACE "\n+$" "" e "${e}")
    string(REGEX MATCH "[^\n]*$" last "${e}")
    set(${out} "pip cannot reach PyPI to get ${first} (${last})" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND ${pip} install ${pip_net} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pip install ${ARGN} failed (${rc}):\n${o}\n${e}")
  endif()
  file(WRITE ${stamp} "${ARGN}")
endfunction()

# diloco_pip_venv_or_skip(): for a script given -DVENV, -DPYTHON and
# -DPIP_REQUIREMENTS=a,b,...: makes the environment, or prints "SKIPPED: ..."
# (the test's skip expression) and ends the script when PyPI is out of reach.
macro(diloco_pip_venv_or_skip)
  string(REPLACE "," ";" PIP_REQUIREMENTS "${PIP_REQUIREMENTS}")
  diloco_pip_venv(${VENV} ${PYTHON} _diloco_unreachable ${PIP_REQUIREMENTS})
  if(_diloco_unreachable)
    message("SKIPPED: ${_diloco_unreachable}")
    return()
  endif()
endmacro()
