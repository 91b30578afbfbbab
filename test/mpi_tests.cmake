# SPDX-License-Identifier: Apache-2.0
# comm::mpi tests. Each executable runs under mpirun with 2 and 4 ranks
# (4 > the cores of a small CI machine: --oversubscribe), every rank running
# the same doctest cases; a failure on any rank aborts the job.
include(diloco_mpi_launch)

add_library(diloco_mpi_test_main OBJECT mpi_test_main.cpp)
target_link_libraries(diloco_mpi_test_main PUBLIC diloco::mpi doctest::doctest diloco_project_options)

foreach(t test_comm_mpi test_algorithm_mpi)
  add_executable(${t} ${t}.cpp)
  target_link_libraries(${t} PRIVATE diloco_mpi_test_main)
  foreach(ranks 2 4)
    diloco_add_mpi_test(${t}_np${ranks} RANKS ${ranks} COMMAND ${t} LABELS unit)
  endforeach()
endforeach()

# The compressed mean across processes (issue: compression under mpirun -np 4).
add_executable(test_compressed_mean_mpi test_compressed_mean_mpi.cpp)
target_link_libraries(test_compressed_mean_mpi PRIVATE diloco_mpi_test_main)
diloco_add_mpi_test(test_compressed_mean_mpi_np4 RANKS 4 COMMAND test_compressed_mean_mpi LABELS unit)

# Two-level meshes (issue 41): a 2 x 2 mesh with replicated groups against
# flat DiLoCo computed in-process on comm::threads.
add_executable(test_mesh_mpi test_mesh_mpi.cpp)
target_link_libraries(test_mesh_mpi PRIVATE diloco_mpi_test_main)
diloco_add_mpi_test(test_mesh_mpi_np4 RANKS 4 COMMAND test_mesh_mpi LABELS unit)
add_executable(test_sharded_mpi test_sharded_mpi.cpp)
target_link_libraries(test_sharded_mpi PRIVATE diloco_mpi_test_main)
diloco_add_mpi_test(test_sharded_mpi_np4 RANKS 4 COMMAND test_sharded_mpi LABELS unit)

# The MPI doctest programs share a precompiled header (diloco_share_pch).
diloco_share_pch(mpi TARGETS test_comm_mpi test_algorithm_mpi test_compressed_mean_mpi test_mesh_mpi test_sharded_mpi
                 LIBS diloco::mpi)

# MPI_Init and MPI_Finalize happen inside this one's test cases.
add_executable(test_comm_mpi_lifecycle test_comm_mpi_lifecycle.cpp)
target_link_libraries(test_comm_mpi_lifecycle PRIVATE diloco::mpi doctest::doctest diloco_project_options)
diloco_add_mpi_test(test_comm_mpi_lifecycle_np2 RANKS 2 COMMAND test_comm_mpi_lifecycle LABELS unit)

# Device buffers: built by the host compiler with DILOCO_WITH_CUDA (from
# diloco::cuda); skipped (exit code 77) where no GPU is usable.
if(DILOCO_HAVE_CUDA)
  add_executable(test_comm_mpi_cuda test_comm_mpi_cuda.cpp)
  target_link_libraries(test_comm_mpi_cuda PRIVATE diloco::mpi diloco::cuda doctest::doctest diloco_project_options)
  diloco_add_mpi_test(test_comm_mpi_cuda_np2 RANKS 2 COMMAND test_comm_mpi_cuda LABELS cuda)
  set_tests_properties(test_comm_mpi_cuda_np2 PROPERTIES SKIP_RETURN_CODE 77)
endif()

# The header under nvcc (__CUDACC__): compiled, not run.
if(DILOCO_HAVE_CUDA)
  add_library(compile_mpi_nvcc OBJECT compile_mpi_nvcc.cu)
  target_link_libraries(compile_mpi_nvcc PRIVATE diloco::mpi diloco_project_options)
  diloco_cuda_cxx20(compile_mpi_nvcc)
endif()

# One layout of comm::mpi whatever the translation unit (an ODR hazard
# otherwise): sizes compared across a host-only, a DILOCO_WITH_CUDA and an
# nvcc translation unit of one program, and a request crossing them.
if(DILOCO_HAVE_CUDA)
  add_library(test_mpi_layout_host_only OBJECT mpi_layout/host_only.cpp)
  target_link_libraries(test_mpi_layout_host_only PRIVATE diloco::mpi diloco_project_options)
  add_executable(test_mpi_layout mpi_layout/main.cpp mpi_layout/nvcc.cu)
  target_link_libraries(test_mpi_layout PRIVATE test_mpi_layout_host_only diloco::mpi diloco::cuda
                                                diloco_project_options)
  diloco_add_mpi_test(test_mpi_layout_np2 RANKS 2 COMMAND test_mpi_layout LABELS unit
                      PASS "one layout; the request crossed")
endif()

# Packaging: a consumer of the installed package, find_package(diloco
# COMPONENTS mpi), linking diloco::mpi and run under mpirun -np 2.
set(_launch ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${DILOCO_MPIEXEC_EXTRA_FLAGS} ${MPIEXEC_PREFLAGS})
add_test(NAME packaging_find_package_mpi
  COMMAND ${CMAKE_COMMAND}
    -DDILOCO_BINARY_DIR=${PROJECT_BINARY_DIR}
    -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/packaging_mpi
    -DCXX=${CMAKE_CXX_COMPILER}
    -DGENERATOR=${CMAKE_GENERATOR}
    "-DLAUNCH=${_launch}"
    "-DPOSTFLAGS=${MPIEXEC_POSTFLAGS}"
    -P ${CMAKE_CURRENT_SOURCE_DIR}/packaging/run_mpi_consumer.cmake)
set_tests_properties(packaging_find_package_mpi PROPERTIES LABELS "packaging;mpi" TIMEOUT 600
  RESOURCE_LOCK mpi_job ENVIRONMENT "${DILOCO_MPIEXEC_ENVIRONMENT}")

# The MPI example (docs/launching.md, which it moved to from README.md with
# its marker name and test) compiles and fits its line under mpirun -np 2
# (extracted as the other README and docs/ programs are).
include(diloco_doc_examples)
diloco_doc_example(${PROJECT_SOURCE_DIR}/docs/launching.md readme-mpi-example ${CMAKE_CURRENT_BINARY_DIR}/readme_mpi_example.cpp)
add_executable(readme_mpi_example ${CMAKE_CURRENT_BINARY_DIR}/readme_mpi_example.cpp)
target_link_libraries(readme_mpi_example PRIVATE diloco::mpi diloco_project_options)
diloco_add_mpi_test(readme_mpi_example_np2 RANKS 2 COMMAND readme_mpi_example LABELS "unit;readme"
  PASS "w = \\((1\\.99[5-9]|2\\.00[0-5]), (0\\.99[5-9]|1\\.00[0-5])\\) on 2 ranks")

# Under mpirun: rank 0 prints the expected line and rank 1 exits 3. mpirun
# exits non-zero, so the checked test fails (WILL_FAIL: this test passes);
# PASS_REGULAR_EXPRESSION alone saw rank 0's line and passed.
diloco_mpi_command(_other_rank_fails 2 sh -c
  "test \"$OMPI_COMM_WORLD_RANK\" = 1 && exit 3 || echo the-expected-line")
diloco_add_checked_test(NAME checked_output_fails_when_another_rank_fails COMMAND ${_other_rank_fails}
  PASS "the-expected-line")
set_tests_properties(checked_output_fails_when_another_rank_fails PROPERTIES WILL_FAIL TRUE
  LABELS "unit;mpi" TIMEOUT 120 RESOURCE_LOCK mpi_job ENVIRONMENT "${DILOCO_MPIEXEC_ENVIRONMENT}")

# Counts above INT_MAX for real: opt-in, it needs about 2.2 GB per rank.
option(DILOCO_TEST_LARGE_COUNTS "Add the MPI test that broadcasts more than INT_MAX bytes" OFF)
if(DILOCO_TEST_LARGE_COUNTS)
  add_executable(test_comm_mpi_large test_comm_mpi_large.cpp)
  target_link_libraries(test_comm_mpi_large PRIVATE diloco_mpi_test_main)
  diloco_add_mpi_test(test_comm_mpi_large_np2 RANKS 2 COMMAND test_comm_mpi_large LABELS slow TIMEOUT 600)
endif()

# A rank killed (SIGKILL) while mpirun keeps the job alive
# (orte_abort_on_non_zero_status 0, Open MPI only): the survivors, with a
# 1000 ms timeout, raise comm_error within the timeout + 2 s (error), or end
# the job with MPI_Abort when asked to (abort); with no timeout set they
# raise at the default one, 30 s (default). Judged from the output by
# run_mpi_peer_death.cmake; the TIMEOUT keeps a hang from lasting.
add_executable(test_comm_mpi_peer_death test_comm_mpi_peer_death.cpp)
target_link_libraries(test_comm_mpi_peer_death PRIVATE diloco::mpi diloco_project_options)
if(DILOCO_MPIEXEC_EXTRA_FLAGS MATCHES "oversubscribe")  # Open MPI
  set(_launch ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 ${DILOCO_MPIEXEC_EXTRA_FLAGS}
      --mca orte_abort_on_non_zero_status 0 ${MPIEXEC_PREFLAGS})
  foreach(mode error abort default)
    add_test(NAME test_comm_mpi_peer_death_${mode}_np3
      COMMAND ${CMAKE_COMMAND} "-DLAUNCH=${_launch}" -DEXE=$<TARGET_FILE:test_comm_mpi_peer_death>
        "-DPOSTFLAGS=${MPIEXEC_POSTFLAGS}" -DMODE=${mode} -P ${CMAKE_CURRENT_SOURCE_DIR}/run_mpi_peer_death.cmake)
    set_tests_properties(test_comm_mpi_peer_death_${mode}_np3 PROPERTIES LABELS "mpi;unit" TIMEOUT 150
      RESOURCE_LOCK mpi_job ENVIRONMENT "${DILOCO_MPIEXEC_ENVIRONMENT}")
  endforeach()
  # The default mode waits out the 30 s default timeout, idle, holding the
  # MPI lock: the release stage runs it; the sanitizer stages, which leave
  # out the slow tests, have the error mode for the same detection path.
  set_property(TEST test_comm_mpi_peer_death_default_np3 APPEND PROPERTY LABELS slow)
endif()
