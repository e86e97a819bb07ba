#!/usr/bin/env bash
# Shows that GPU tests can fail: applies one edit (a sed expression) to a source file, rebuilds test_cuda,
# runs the given tests, and restores the file. The edit should break what the tests claim to check; they
# must then fail ("killed"). Prints one line per edit; exit status 1 when a mutant survives.
#
#   scripts/mutation_check.sh BUILD_DIR FILE SED_EXPR GTEST_FILTER [LOG]
#
# e.g. dropping the decode step's wait for the side stream's cache append:
#   scripts/mutation_check.sh build-gpu src/kimirt/cuda/mla_layer.cpp \
#     '/cudaStreamWaitEvent(stream, side->kv_ready)/d' 'MlaLayer.DecodeStepWaitsForTheSideStream'
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=$1 file=$2 expr=$3 filter=$4 log=${5:-/dev/null}
[[ -f $file ]] || { echo "mutation: no file $file"; exit 2; }
# The tests must pass before the edit, or a failure after it says nothing.
if ! (cd "$build" && timeout 120 ./tests/test_cuda --gtest_filter="$filter") >>"$log" 2>&1; then
  echo "mutation: $filter fails before any edit (see $log)"
  exit 2
fi
backup=$(mktemp)
cp "$file" "$backup" || exit 2
# The source is restored and rebuilt: a later copy of the tree may carry an older mtime than the mutant's
# objects, and ninja would then keep them.
restore() {
  cp "$backup" "$file" && rm -f "$backup"
  cmake --build "$build" -j"${JOBS:-16}" --target test_cuda >>"$log" 2>&1 || echo "mutation: rebuilding $file as it was failed"
}
trap restore EXIT
sed -i "$expr" "$file"
if cmp -s "$file" "$backup"; then
  echo "mutation: '$expr' changed nothing in $file"
  exit 2
fi
if ! cmake --build "$build" -j"${JOBS:-16}" --target test_cuda >>"$log" 2>&1; then
  echo "mutation: '$expr' on $file does not build (see $log)"
  exit 2
fi
(cd "$build" && timeout 120 ./tests/test_cuda --gtest_filter="$filter") >>"$log" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "mutation: '$expr' on $file: killed by $filter (rc $rc)"
else
  echo "mutation: '$expr' on $file: SURVIVED $filter"
  exit 1
fi
