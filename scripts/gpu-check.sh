#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The CUDA checks for a machine with a GPU, from programs built on another
# machine (one without a GPU, with nvcc):
#
#   scripts/gpu-check.sh pack [BUILD]   here: build the CUDA test programs and
#                                       the kernel benchmark in BUILD (default
#                                       build-gpu) and copy them, with the
#                                       small libraries they need, into
#                                       build-gpu-pack/
#   scripts/gpu-check.sh run [OUTDIR]   there: every CUDA test program, the
#                                       example, bench_cuda_kernels and
#                                       bench_cuda_host_outer, then
#                                       compute-sanitizer (memcheck,
#                                       synccheck, initcheck) on the three
#                                       CUDA test programs (racecheck on
#                                       test_cuda_kernels); logs in OUTDIR
#                                       (default $OUT, else /tmp/gpu-check)
#   scripts/gpu-check.sh profile [OUTDIR]
#                                       there: Nsight Compute's speed of
#                                       light, occupancy and warp stalls for
#                                       the int8 codec passes of the benchmark
#
# NCCL, cuBLAS and MPI are not packed (NCCL and cuBLAS are hundreds of MB):
# `run` takes the GPU machine's own libnccl.so.2 and libcublas.so.13 (a CUDA
# toolkit's, or PyTorch's nvidia wheels), and runs test_comm_mpi_cuda with 2
# ranks and test_comm_nccl_mpi --gpu with 1 only where it has mpirun.
# Each step has a time limit, so a hang is reported, not waited on.
set -uo pipefail
cd "$(dirname "$0")/.."
pack=build-gpu-pack
programs=(test/cuda/test_cuda_kernels test/cuda/test_cuda_algorithm test/cuda/test_cuda_muon
          test/test_comm_nccl_gpu test/test_comm_nccl_mpi examples/cuda_linear_regression
          bench/bench_cuda_kernels bench/bench_cuda_host_outer test/test_comm_mpi_cuda)

case "${1:-}" in
pack)
  build=${2:-build-gpu}
  set -e
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDILOCO_ENABLE_CUDA=ON -DDILOCO_ENABLE_TORCH=OFF
  targets=()
  for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
  rm -rf "$pack" && mkdir -p "$pack/lib"
  for p in "${programs[@]}"; do cp "$build/$p" "$pack/"; done
  # The non-system libraries they load, but NCCL and the driver.
  for p in "${programs[@]}"; do ldd "$build/$p"; done | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libnccl|libcublas|libcublasLt|libmpi|libmpi_cxx|libopen-pal|libopen-rte|libhwloc|libevent[a-z_-]*2\.1|libz|libudev)\.so' |
    while read -r lib; do cp -L "$lib" "$pack/lib/"; done
  du -sh "$pack"
  ;;
run | profile)
  out=${2:-${OUT:-/tmp/gpu-check}}
  mkdir -p "$out"
  log=$out/gpu-check.log
  summary=$out/summary.txt
  : >"$log"
  : >"$summary"
  sanitizer=$(command -v compute-sanitizer ||
    find /usr/local /opt -name compute-sanitizer -type f -perm -u+x 2>/dev/null | head -n 1)
  nccl=$(find /usr/local/cuda*/lib* /usr/lib /opt -name 'libnccl.so.2' 2>/dev/null | head -n 1)
  cublas=$(find /usr/local/cuda*/lib* /usr/local/cuda*/targets /usr/lib /opt -name 'libcublas.so.13' 2>/dev/null | head -n 1)
  export LD_LIBRARY_PATH="$PWD/$pack/lib${nccl:+:$(dirname "$nccl")}${cublas:+:$(dirname "$cublas")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    echo "nccl: ${nccl:-none found}"
    echo "cublas: ${cublas:-none found}"
    echo "compute-sanitizer: ${sanitizer:-not found}"
  } 2>&1 | tee -a "$summary"
  # step NAME LIMIT_S COMMAND...: runs it, its output to the log, one line to the summary.
  step() {
    local name=$1 limit=$2
    shift 2
    echo "==== $name: $*" >>"$log"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" >>"$log" 2>&1
    local rc=$?
    printf '%-28s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$summary"
  }
  if [ "$1" = profile ]; then
    # One launch each (after the benchmark's warm-ups): int8 encode with and
    # without error feedback, the shard reduce of 4, the structure check.
    ncu=$(command -v ncu || find /usr/local /opt -name ncu -type f -perm -u+x 2>/dev/null | head -n 1)
    prof() {
      local name=$1 regex=$2 skip=$3
      step "ncu_$name" 120 "$ncu" --kernel-name-base demangled -k "regex:$regex" --launch-skip "$skip" \
        --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis "$pack/bench_cuda_kernels" --iterations 1 --tensors 1
    }
    # (demangled names read "blockwise_codec<diloco::int8, (unsigned long)128, ...")
    prof encode_int8_ef 'encode_blocks<.*int8, .unsigned long.128,' 4
    prof encode_int8 'encode_blocks<.*int8, .unsigned long.128,' 8
    prof reduce_int8_m4 'reduce_blocks<.*int8, .unsigned long.128,' 1
    prof check_blocks 'check_blocks' 1
    grep -E "^====|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Stall|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$log" | cut -c1-160
    exit 0
  fi
  step test_cuda_kernels 90 "$pack/test_cuda_kernels"
  step test_cuda_algorithm 180 "$pack/test_cuda_algorithm"
  step test_cuda_muon 120 "$pack/test_cuda_muon"
  step test_comm_nccl_gpu 60 "$pack/test_comm_nccl_gpu"
  step cuda_linear_regression 60 "$pack/cuda_linear_regression"
  if command -v mpirun >/dev/null; then
    step test_comm_mpi_cuda_np2 120 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      mpirun --oversubscribe -np 2 -x LD_LIBRARY_PATH "$pack/test_comm_mpi_cuda"
    # comm::nccl bootstrapped by MPI on one device (a world of one: two
    # ranks would need two devices, and the test skips them with 77).
    step test_comm_nccl_mpi_gpu_np1 120 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      mpirun -np 1 -x LD_LIBRARY_PATH "$pack/test_comm_nccl_mpi" --gpu
  else
    echo "test_comm_mpi_cuda_np2: no mpirun here, not run" | tee -a "$summary"
  fi
  step bench_smoke 60 "$pack/bench_cuda_kernels" --elements 1048579 --iterations 3
  step bench 120 "$pack/bench_cuda_kernels"
  step bench_host_outer 120 "$pack/bench_cuda_host_outer"
  # --report-api-errors no: NCCL probes kernels it has no sm_90 image for
  # (cudaFuncGetAttributes answers cudaErrorNoKernelImageForDevice), which
  # memcheck would count as errors; our own CUDA calls are checked by
  # detail::cuda_check, which throws.
  # racecheck on test_cuda_algorithm did not finish its second test case in
  # 170 s on an H100 (2026-11-26): it runs on test_cuda_kernels alone.
  for program in test_cuda_kernels test_cuda_algorithm test_cuda_muon; do
    for tool in memcheck racecheck synccheck initcheck; do
      [ "$tool" = racecheck ] && [ "$program" != test_cuda_kernels ] && continue
      step "${tool}_$program" "${SANITIZER_LIMIT:-120}" "${sanitizer:-compute-sanitizer}" --tool "$tool" \
        --report-api-errors no --error-exitcode 99 "$pack/$program"
    done
  done
  echo "---- bench" >>"$summary"
  awk '/^==== bench: /{on=1; next} /^==== /{on=0} on' "$log" >>"$summary"
  echo "---- bench_host_outer" >>"$summary"
  awk '/^==== bench_host_outer: /{on=1; next} /^==== /{on=0} on' "$log" >>"$summary"
  cat "$summary"
  ;;
*)
  sed -n '3,27p' "$0"
  exit 2
  ;;
esac
