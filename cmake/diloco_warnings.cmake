# SPDX-License-Identifier: Apache-2.0
# Warning and sanitizer settings for diloco's own targets (tests, examples,
# benchmarks). Never applied to the library target users link.

add_library(diloco_project_options INTERFACE)
target_compile_options(diloco_project_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${DILOCO_WARNINGS_AS_ERRORS}>>:-Werror>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${DILOCO_WARNINGS_AS_ERRORS}>>:-Werror=all-warnings>)
if(DILOCO_SANITIZE)
  target_compile_options(diloco_project_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DILOCO_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(diloco_project_options INTERFACE -fsanitize=${DILOCO_SANITIZE})
endif()

# diloco's own tests, examples and benchmarks run the host executor on
# OpenMP threads when the build has OpenMP (diloco::diloco does not carry it).
if(TARGET diloco_openmp)
  target_link_libraries(diloco_project_options INTERFACE diloco_openmp)
endif()
