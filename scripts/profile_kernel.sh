#!/usr/bin/env bash
# Nsight Compute on one benchmark case, on the GPU machine (after scripts/gpu_session.sh has built build-gpu):
#   scripts/profile_kernel.sh SUITE "CASE TEXT" KERNEL_REGEX [SKIP] [COUNT]
# profiles COUNT launches (default 1) of the kernels matching KERNEL_REGEX after SKIP of them (default 8: past
# the set-up calls) in `kimirt-bench-cuda --quick --only SUITE --filter "CASE TEXT"`. Writes to $OUT:
#   ncu_<regex>.txt        speed of light, warp states, memory and compute workload, occupancy, launch
#   ncu_<regex>_sass.csv   per-SASS-instruction stall samples (where the warps wait)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/out}
BUILD=${BUILD_DIR:-build-gpu}
suite=$1 filter=$2 regex=$3 skip=${4:-8} count=${5:-1}
tag=$(echo "$regex" | tr -c 'A-Za-z0-9_' '_' | cut -c1-40)
BENCH=("$BUILD/bench/kimirt-bench-cuda" --quick --only "$suite" --filter "$filter")
ncu --clock-control none -k "regex:$regex" --launch-skip "$skip" -c "$count" \
  --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section LaunchStats --section Occupancy --section SchedulerStats "${BENCH[@]}" >"$OUT/ncu_${tag}.txt" 2>&1
ncu --clock-control none -k "regex:$regex" --launch-skip "$skip" -c 1 --section SourceCounters \
  --section WarpStateStats --page source --print-source sass --csv "${BENCH[@]}" >"$OUT/ncu_${tag}_sass.csv" 2>&1
echo "profile $regex ($filter): $(grep -m1 -E 'Duration' "$OUT/ncu_${tag}.txt")"
