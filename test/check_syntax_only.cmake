# SPDX-License-Identifier: Apache-2.0
# scripts/syntax-only.sh, the compiler launcher of DILOCO_COMPILE_ONLY_TARGETS,
# with the real compiler: a clean source gives an object and a dependency
# file, and the program linked from that object refuses to run (exit 1, says
# why) rather than pass with no tests; an error that only instantiating a
# template shows, and a warning under -Werror, fail the compile.
#   cmake -DLAUNCHER=... -DCXX=... -DWORK_DIR=... -P check_syntax_only.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
set(flags -std=c++20 -Wall -Wextra -Wconversion -Werror)

function(compile name source expect_ok)
  file(WRITE ${WORK_DIR}/${name}.cpp "${source}")
  execute_process(COMMAND ${LAUNCHER} ${CXX} ${flags} -MD -MT ${name}.o -MF ${WORK_DIR}/${name}.d
                          -o ${WORK_DIR}/${name}.o -c ${WORK_DIR}/${name}.cpp
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: syntax-only.sh failed on a clean source (${rc}):\n${out}${err}")
  elseif(NOT expect_ok AND rc EQUAL 0)
    message(FATAL_ERROR "${name}: syntax-only.sh passed a source the compiler refuses")
  endif()
endfunction()

compile(clean "template <class T> int f(T t) { return t + 1; }\nint main() { return f(1) - 2; }\n" TRUE)
foreach(f clean.o clean.d)
  if(NOT EXISTS ${WORK_DIR}/${f})
    message(FATAL_ERROR "syntax-only.sh wrote no ${f}")
  endif()
endforeach()
file(READ ${WORK_DIR}/clean.d deps)
if(NOT deps MATCHES "clean\\.cpp")
  message(FATAL_ERROR "the dependency file does not name the source: ${deps}")
endif()
execute_process(COMMAND ${CXX} ${WORK_DIR}/clean.o -o ${WORK_DIR}/clean RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the stub object does not link into a program: ${err}")
endif()
execute_process(COMMAND ${WORK_DIR}/clean RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "compiled with -fsyntax-only")
  message(FATAL_ERROR "the stub program should exit 1 and say why; it exited ${rc}: ${err}")
endif()

# Found only when f<int> is instantiated: -fsyntax-only must instantiate it.
compile(instantiation "template <class T> int f(T t) { return t.missing(); }\nint main() { return f(1); }\n" FALSE)
compile(warning "int main() { long long x = 1LL << 40; int y = x; return y; }\n" FALSE)
message(STATUS "syntax-only.sh: clean source compiled and stubbed; instantiation error and -Werror warning refused")
