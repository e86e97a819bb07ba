#!/usr/bin/env bash
# Checks that need the GPU machine beyond the kernels (which scripts/gpu_session.sh covers), in one call:
#   1. build everything (CUDA on) and run the CPU tests there too (a second compiler and machine),
#   2. the official Python safetensors package reads every file kimirt wrote (gpu-data/, made here with
#      make-tiny and run --dump-logits; see scripts/python_crosscheck.py),
#   3. the checkpoint load benchmark on the machine's NVMe (kimirt-bench load, 8 GiB).
# Take .deps and gpu-data along (carry). Results go to $OUT: checks.log and summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-gpu}
log="$OUT/checks.log"
summary="$OUT/summary.txt"
: >"$log"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
# The GPU tests fail, not skip, when they find no device here, or fewer than the machine has (tests/cuda/test_util.h).
export KIMIRT_EXPECT_GPU=1
KIMIRT_EXPECT_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
export KIMIRT_EXPECT_GPUS

start=$(date +%s)
{ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKIMIRT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a &&
    cmake --build "$BUILD" -j"${JOBS:-16}"; } >>"$log" 2>&1
rc=$?
note "build (all targets): rc=$rc in $(( $(date +%s) - start )) s"
[[ $rc -eq 0 ]] || { grep -E "error" "$log" | head -20 | tee -a "$summary"; exit 1; }

# GPU tests one at a time (they size their buffers from free memory); CPU tests in parallel.
for spec in "gpu 1" "cpu 16"; do
  set -- $spec
  start=$(date +%s)
  timeout 300 ctest --test-dir "$BUILD" -L "$1" -j"$2" --output-on-failure >>"$log" 2>&1
  note "ctest -L $1: rc=$? in $(( $(date +%s) - start )) s: $(grep -E 'tests passed|tests failed' "$log" | tail -1)"
done

if [[ -d gpu-data ]]; then
  python3 scripts/python_crosscheck.py gpu-data 2>&1 | tee -a "$summary" >>"$log"
fi

if [[ -z "${SKIP_LOAD:-}" ]]; then
  start=$(date +%s)
  timeout 240 "$BUILD/bench/kimirt-bench" load --dir /tmp/kimirt-load-bench --size-gb "${LOAD_GB:-8}" \
    --repeats "${LOAD_REPEATS:-2}" >>"$log" 2>&1
  note "load bench: rc=$? in $(( $(date +%s) - start )) s"
  awk '/^medians over/{p=1} p' "$log" | tee -a "$summary"
  rm -rf /tmp/kimirt-load-bench
fi
