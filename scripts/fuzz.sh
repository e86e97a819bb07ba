#!/usr/bin/env bash
# Builds the libFuzzer targets (preset fuzz: clang, ASan + UBSan) and fuzzes them, then prints executions,
# speed and findings. Exits 1 when a target found anything.
#   scripts/fuzz.sh [MINUTES] [TARGET...]   MINUTES (default 1) is the total, shared evenly by the targets;
#                                           TARGET defaults to every fuzz_* target.
#   BUILD_DIR=build-fuzz JOBS=2             where to build, and how many compile jobs
# The growing corpus lives in $BUILD_DIR/fuzz-corpus/<target> (seeded from fuzz/corpus/), so later runs
# resume where earlier ones stopped; crash inputs go to $BUILD_DIR/fuzz-findings/<target>/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MINUTES=${1:-1}
shift || true
TARGETS=("$@")
if ((${#TARGETS[@]} == 0)); then TARGETS=(fuzz_safetensors_header fuzz_safetensors_file); fi
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-2}

if [[ ! "$MINUTES" =~ ^[0-9]+$ ]] || ((MINUTES < 1)); then
  echo "fuzz: MINUTES must be a positive integer, not '$MINUTES'" >&2
  exit 2
fi
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake --preset fuzz -B "$BUILD_DIR" >/dev/null
fi
cmake --build "$BUILD_DIR" -j"$JOBS" --target "${TARGETS[@]}"

seconds=$((MINUTES * 60 / ${#TARGETS[@]}))
((seconds > 0)) || seconds=1
status=0
summary=()
for target in "${TARGETS[@]}"; do
  seeds="fuzz/corpus/${target#fuzz_}"
  corpus="$BUILD_DIR/fuzz-corpus/$target"
  findings="$BUILD_DIR/fuzz-findings/$target"
  log="$BUILD_DIR/fuzz-$target.log"
  mkdir -p "$corpus" "$findings"
  echo "fuzz: $target for ${seconds}s (log $log)"
  # Runs until max_total_time, or stops at the first finding; either way the stats follow.
  set +e
  "$BUILD_DIR/fuzz/$target" "$corpus" "$seeds" \
    -dict=fuzz/safetensors.dict -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$findings/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  found=$(find "$findings" -type f | wc -l)
  summary+=("$target: ${execs:-?} executions, ${speed:-?} exec/s, coverage ${cov:-?} edges, corpus $(find "$corpus" -type f | wc -l) inputs, findings $found (exit $rc)")
  if ((rc != 0 || found > 0)); then
    status=1
    grep -E 'ERROR|fuzz property|runtime error|uncaught|Test unit written' "$log" | head -20 || true
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
