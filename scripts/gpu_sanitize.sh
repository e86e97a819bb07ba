#!/usr/bin/env bash
# compute-sanitizer over the GPU tests, one process per test, several at once on the one GPU: a sweep for
# out-of-bounds and misaligned device accesses (memcheck, the default) or reads of device memory never
# written (TOOL=initcheck) that a test's numeric checks can miss: a read past a buffer that happens to hold
# harmless values, say. Racecheck is not swept here: it reports false hazards across named barriers
# (docs/CONVENTIONS.md); run it per kernel with --kernel-regex.
#
#   scripts/gpu_sanitize.sh                          every GPU test under memcheck
#   TOOL=initcheck FILTER='Gemm*' scripts/gpu_sanitize.sh
#   PARALLEL=4 TEST_TIMEOUT=300 scripts/gpu_sanitize.sh
#
# Writes to $OUT: sanitize_build.log, sanitize_summary.txt (one line per test: verdict, errors, seconds),
# sanitize.log (the log of every test that did not pass clean, cut to its first 150 lines). SUFFIX=_x names
# the last two sanitize_x (two sweeps in one call).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD_DIR:-build-sanitize}
JOBS=${JOBS:-16}
TOOL=${TOOL:-memcheck}
FILTER=${FILTER:-*}
PARALLEL=${PARALLEL:-6}
TEST_TIMEOUT=${TEST_TIMEOUT:-240}
SUFFIX=${SUFFIX:-}
summary="$OUT/sanitize${SUFFIX}_summary.txt"
: >"$summary"

# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
export KIMIRT_EXPECT_GPU=1
# Kernels run one after the other under the sanitizer: tests of overlapped launches skip (mla_overlap_test.cu).
export KIMIRT_UNDER_SANITIZER=1
# And the two-GPU tests fail, not skip, on a machine with two GPUs.
KIMIRT_EXPECT_GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
export KIMIRT_EXPECT_GPUS
SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}

start=$(date +%s)
# -lineinfo: the reports name source lines, not only SASS offsets.
{
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKIMIRT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_CUDA_FLAGS=-lineinfo &&
    cmake --build "$BUILD" -j"$JOBS" --target test_cuda
} >"$OUT/sanitize_build.log" 2>&1 || {
  echo "build failed after $(( $(date +%s) - start )) s" | tee -a "$summary"
  grep -E "error|Error" "$OUT/sanitize_build.log" | head -20
  exit 1
}
echo "build: $(( $(date +%s) - start )) s; tool $TOOL, $PARALLEL at once, $TEST_TIMEOUT s per test" | tee -a "$summary"

[[ $BUILD == /* ]] || BUILD="$PWD/$BUILD"
BIN="$BUILD/tests/test_cuda"
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
# gtest's listing: suite lines end in '.', test lines are indented (parameterized ones carry a comment).
mapfile -t tests < <("$BIN" --gtest_list_tests --gtest_filter="$FILTER" |
  awk '/^[^ ]/{suite=$1} /^  /{print suite $1}')
echo "tests: ${#tests[@]}" | tee -a "$summary"
# An empty list (a filter that matches nothing, a binary that cannot start) must not read as a clean sweep.
(( ${#tests[@]} > 0 )) || { echo "no tests listed for filter '$FILTER'" | tee -a "$summary"; exit 1; }

run_one() {
  local t=$1 log="$LOGS/${1//[^A-Za-z0-9_.-]/_}.log" s=$SECONDS rc
  # API errors are left out: several tests provoke failing calls on purpose (and NCCL probes its kernels).
  timeout -k 10 "$TEST_TIMEOUT" "$SANITIZER" --tool "$TOOL" --report-api-errors no --error-exitcode 86 --print-limit 20 \
    "$BIN" --gtest_filter="$t" >"$log" 2>&1
  rc=$?
  local errors verdict
  errors=$(grep -oE "ERROR SUMMARY: [0-9]+" "$log" | tail -1 | grep -oE "[0-9]+$")
  case $rc in
    0) verdict=clean ;;
    86) verdict=SANITIZER ;;
    124) verdict=TIMEOUT ;;
    *) verdict=FAILED ;;
  esac
  grep -q "\[  SKIPPED \]" "$log" && [[ $rc -eq 0 ]] && verdict=skipped
  # A test of host code only: the tool has nothing to watch and says so with a failing status.
  grep -q "terminated before first instrumented API call" "$log" && grep -q "^\[  PASSED  \] 1 test" "$log" &&
    verdict=host-only
  printf '%-9s errors=%-4s %4ss  %s\n' "$verdict" "${errors:-?}" "$(( SECONDS - s ))" "$t"
}
export -f run_one
export BIN LOGS TOOL TEST_TIMEOUT SANITIZER

start=$(date +%s)
printf '%s\n' "${tests[@]}" | xargs -d '\n' -P "$PARALLEL" -I{} bash -c 'run_one "$@"' _ {} | sort >>"$summary"
echo "sweep: $(( $(date +%s) - start )) s; $(grep -c '^clean' "$summary") clean, $(grep -c '^host-only' "$summary") host-only, $(grep -c '^skipped' "$summary") skipped, $(grep -cE '^(SANITIZER|TIMEOUT|FAILED)' "$summary") not" |
  tee -a "$summary"
grep -E '^(SANITIZER|TIMEOUT|FAILED)' "$summary"

: >"$OUT/sanitize${SUFFIX}.log"
while read -r verdict _ _ t; do
  [[ $verdict == clean || $verdict == skipped || $verdict == host-only ]] && continue
  { echo "===== $verdict $t"; head -150 "$LOGS/${t//[^A-Za-z0-9_.-]/_}.log"; } >>"$OUT/sanitize${SUFFIX}.log"
done < <(grep -E '^(SANITIZER|TIMEOUT|FAILED) ' "$summary")
! grep -qE '^(SANITIZER|TIMEOUT|FAILED)' "$summary"
