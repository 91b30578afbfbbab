// SPDX-License-Identifier: Apache-2.0
// Small probes the multi-process and GPU tests share: this process's place
// in MPI_COMM_WORLD, and how many CUDA devices it can use. Include
// <mpi.h> or <cuda_runtime_api.h> before this header to get the matching
// probe.
#pragma once

#if defined(MPI_VERSION)
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int m = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &m);
  return m;
}
#endif

#if defined(CUDART_VERSION)
// Any error (no driver, no device) counts as no GPU; the error is cleared so
// that later calls do not see it.
inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}
#endif
