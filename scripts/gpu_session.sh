#!/usr/bin/env bash
# One GPU-machine session: configure + build the CUDA tests and benchmarks, run the gpu-labelled tests,
# run the CUDA benchmarks, and leave logs and JSON under $OUT (only $OUT comes back; at most 8 files).
#
#   scripts/gpu_session.sh                  everything
#   BENCH_ARGS="--only mla" scripts/gpu_session.sh    a subset of the benchmarks
#   SKIP_BENCH=1 / SKIP_TESTS=1             leave one half out
#   GTEST_FILTER='Mla*:Wgmma*' scripts/gpu_session.sh   run only these GPU tests (one process, no ctest)
#
# The GPU machine lacks the PCRE2 headers that the text layer needs: before the call, run here
#   ../shared/device/pack-deps.sh libpcre2-dev libpcre2-8-0     (writes .deps/, which is git-ignored)
# and take .deps along (carry: [".deps"]). The script picks it up when present.
# Files written to $OUT: build.log, tests.log, tests.xml (JUnit), bench.log, bench.json, gemm_table.txt,
# summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-16}
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
# The GPU tests fail, not skip, when they find no device here (tests/cuda/test_util.h).
export KIMIRT_EXPECT_GPU=1
# And the two-GPU tests fail, not skip, on a machine with two GPUs.
KIMIRT_EXPECT_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
export KIMIRT_EXPECT_GPUS

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /' | tee -a "$summary"

start=$(date +%s)
{
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKIMIRT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
    cmake --build "$BUILD" -j"$JOBS" --target test_cuda kimirt-bench-cuda
} >"$OUT/build.log" 2>&1
build_rc=$?
note "build: rc=$build_rc in $(( $(date +%s) - start )) s (log: build.log)"
if [[ $build_rc -ne 0 ]]; then
  grep -E "error|Error" "$OUT/build.log" | head -20 | tee -a "$summary"
  exit 1
fi

tests_rc=0
if [[ -z "${SKIP_TESTS:-}" ]]; then
  start=$(date +%s)
  if [[ -n "${GTEST_FILTER:-}" ]]; then
    (cd "$BUILD" && timeout 240 ./tests/test_cuda --gtest_filter="$GTEST_FILTER" --gtest_output="xml:$OUT/tests.xml") \
      >"$OUT/tests.log" 2>&1
    tests_rc=$?
    note "tests ($GTEST_FILTER): rc=$tests_rc in $(( $(date +%s) - start )) s: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/tests.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]|Failure|rel_err|Expected|Which is" "$OUT/tests.log" | head -30 | tee -a "$summary"
  else
    timeout 240 ctest --test-dir "$BUILD" -L gpu --output-on-failure --output-junit "$OUT/tests.xml" -j1 \
      >"$OUT/tests.log" 2>&1
    tests_rc=$?
    note "tests: rc=$tests_rc in $(( $(date +%s) - start )) s: $(grep -E 'tests passed|tests failed' "$OUT/tests.log" | tail -1)"
    # Skips are legitimate only for hardware this machine lacks (two GPUs, say): named, so a reader can tell.
    skipped=$(grep -E '^[[:space:]]*[0-9]+ - .*\(Skipped\)' "$OUT/tests.log" | sed -E 's/^[[:space:]]*[0-9]+ - //; s/ \(Skipped\)//')
    note "skipped: $(grep -c . <<<"$skipped") $(tr '\n' ' ' <<<"$skipped")"
    grep -E "\(Failed\)|\(Timeout\)|\*\*\*Exception" "$OUT/tests.log" | head -30 | tee -a "$summary"
  fi
fi

bench_rc=0
if [[ -z "${SKIP_BENCH:-}" ]]; then
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout 200 "$BUILD/bench/kimirt-bench-cuda" --json "$OUT/bench.json" --gemm-table "$OUT/gemm_table.txt" \
    ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  bench_rc=$?
  note "bench: rc=$bench_rc in $(( $(date +%s) - start )) s (log: bench.log, results: bench.json)"
  # The table printed last by the benchmark.
  awk '/^suite /{p=1} p' "$OUT/bench.log" | tee -a "$summary"
fi
# PROFILE=1: Nsight Compute on one launch of each kernel under study (ncu.txt), and the MLA kernel's
# tensor-core / barrier instructions from its SASS. Launch indices follow the benchmarks' order with --quick
# (3 warm-up calls, then 5 samples).
if [[ -n "${PROFILE:-}" ]]; then
  start=$(date +%s)
  BENCH="$BUILD/bench/kimirt-bench-cuda"
  NCU=(ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis
       --section LaunchStats --section Occupancy)
  {
    "${NCU[@]}" -k regex:mla_decode_kernel --launch-skip 20 -c 1 "$BENCH" --quick --only mla
    "${NCU[@]}" -k regex:mla_decode_merge --launch-skip 20 -c 1 "$BENCH" --quick --only mla
    "${NCU[@]}" -k regex:mla_decode_kernel --launch-skip 92 -c 1 "$BENCH" --quick --only mla
    "${NCU[@]}" -k regex:attn_res_kernel --launch-skip 4 -c 1 "$BENCH" --quick --only dense
    "${NCU[@]}" -k regex:rms_norm_kernel --launch-skip 4 -c 1 "$BENCH" --quick --only dense
    "${NCU[@]}" -k regex:sample_kernel --launch-skip 20 -c 1 "$BENCH" --quick --only sampling
    echo "== SASS of mla_decode_kernel (tensor-core, barrier and copy instructions)"
    cuobjdump -sass "$BUILD/src/kimirt/CMakeFiles/kimirt_cuda.dir/cuda/mla_decode.cu.o" |
      awk '/Function : .*mla_decode_kernel/{p=1} /Function : .*merge/{p=0} p' |
      grep -nE "HGMMA|WARPGROUP|BAR|SYNCS|UTMALDG|DEPBAR|WARPSYNC" | head -150
  } >"$OUT/ncu.txt" 2>&1
  note "profile: $(( $(date +%s) - start )) s (ncu.txt)"
fi

[[ $tests_rc -eq 0 && $bench_rc -eq 0 ]]
