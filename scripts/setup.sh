#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for kimirt and builds it. Idempotent: installs only missing packages,
# configures only once, and rebuilds only what changed.
#   scripts/setup.sh            packages + configure + build (Release, in ./build)
#   BUILD_DIR=... PRESET=...    another preset (debug, asan, ...)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PRESET=${PRESET:-release}
BUILD_DIR=${BUILD_DIR:-build}
PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev libcpp-httplib-dev
  libopenblas-dev libopenmpi-dev openmpi-bin
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The CUDA toolkit is not a Debian package we install; use it when it is there.
if [[ -z "${CUDACXX:-}" && -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake --preset "$PRESET" -B "$BUILD_DIR" >/dev/null
fi
jobs=$(nproc)
cmake --build "$BUILD_DIR" -j"$jobs"
