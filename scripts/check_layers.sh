#!/usr/bin/env bash
# Checks the layer order of src/kimirt for every include, header-only ones too (CMake's link order only
# catches an include of a higher layer that also needs its library):
#   base < tensor < comm < io < quant < model < text < cpu < cuda < runtime < serve < cli
# A file of layer L may include "kimirt/<M>/..." only for M at or below L; text may include only base, tensor
# and text itself. Prints every violation as FILE:LINE: ... and exits 1 when there is one.
#   scripts/check_layers.sh [ROOT]   ROOT defaults to src/kimirt next to this script
#   scripts/check_layers.sh --self-test   checks that the checker passes a clean tree and catches violations
set -euo pipefail

readonly LAYERS=(base tensor comm io quant model text cpu cuda runtime serve cli)

rank_of() {
  local i
  for i in "${!LAYERS[@]}"; do
    if [[ "${LAYERS[$i]}" == "$1" ]]; then
      echo "$i"
      return
    fi
  done
  echo -1
}

check() {
  local root=$1 violations=0 files=0
  if [[ ! -d "$root" ]]; then
    echo "check_layers: $root is not a directory" >&2
    return 2
  fi
  local dir layer rank file line text included included_rank
  for dir in "$root"/*/; do
    layer=$(basename "$dir")
    rank=$(rank_of "$layer")
    if ((rank < 0)); then
      echo "check_layers: $dir is not a known layer (${LAYERS[*]})"
      violations=$((violations + 1))
      continue
    fi
    while IFS= read -r -d '' file; do
      files=$((files + 1))
      while IFS=: read -r line text; do
        [[ "$text" =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"\<]kimirt/([A-Za-z0-9_]+)/ ]] || continue
        included=${BASH_REMATCH[1]}
        included_rank=$(rank_of "$included")
        if ((included_rank < 0)); then
          echo "$file:$line: includes kimirt/$included/, which is not a layer"
          violations=$((violations + 1))
        elif ((included_rank > rank)); then
          echo "$file:$line: layer $layer includes the higher layer $included"
          violations=$((violations + 1))
        elif [[ "$layer" == text && "$included" != base && "$included" != tensor && "$included" != text ]]; then
          echo "$file:$line: layer text may include only base and tensor, not $included"
          violations=$((violations + 1))
        fi
      done < <(grep -n 'include' "$file" || true)
    done < <(find "$dir" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0)
  done
  if ((files == 0)); then
    echo "check_layers: no sources under $root"
    return 2
  fi
  if ((violations > 0)); then
    echo "check_layers: $violations include(s) break the layer order ($files files)"
    return 1
  fi
  echo "check_layers: $files files follow the layer order"
}

# Fails with `what` unless check refuses the tree at $1 (exit status 1).
expect_refused() {
  local status=0
  check "$1" >/dev/null || status=$?
  if ((status != 1)); then
    echo "check_layers self-test: $2 was not caught"
    return 1
  fi
}

self_test() {
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$tmp/base" "$tmp/tensor" "$tmp/model" "$tmp/text" "$tmp/runtime"
  printf '#include "kimirt/base/error.h"\n' >"$tmp/tensor/a.h"
  printf '#include "kimirt/tensor/a.h"\n#include <vector>\n' >"$tmp/text/b.cpp"
  printf '#include "kimirt/text/b.h"\n#include "kimirt/model/c.h"\n' >"$tmp/runtime/c.cpp"
  printf '// #include "kimirt/runtime/c.h" in a comment is not an include\n' >"$tmp/base/d.h"
  if ! check "$tmp" >/dev/null; then
    echo "check_layers self-test: a clean tree was refused"
    return 1
  fi
  printf '#include "kimirt/runtime/engine.h"\n' >"$tmp/model/up.h"
  expect_refused "$tmp" "an include of a higher layer" || return 1
  rm "$tmp/model/up.h"
  printf '  #  include "kimirt/model/c.h"\n' >"$tmp/text/down.cpp"
  expect_refused "$tmp" "text including model" || return 1
  echo "check_layers self-test: ok"
}

if [[ "${1:-}" == --self-test ]]; then
  self_test
else
  check "${1:-$(dirname "${BASH_SOURCE[0]}")/../src/kimirt}"
fi
