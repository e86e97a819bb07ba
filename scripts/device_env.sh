#!/usr/bin/env bash
# Sourced by the GPU-machine scripts (gpu_session.sh, device_checks.sh) from the repository root: makes the
# dependencies carried in .deps (PCRE2, which that machine lacks) visible to CMake, pkg-config and the
# loader, and points CMake at the machine's nvcc.
if [[ -d .deps/usr ]]; then
  # pack-deps.sh wrote absolute prefixes of the machine that packed them: point them here.
  for pc in .deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc; do
    [[ -f $pc ]] && sed -i "s|^prefix=.*|prefix=$PWD/.deps/usr|" "$pc"
  done
  export CMAKE_PREFIX_PATH="$PWD/.deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$PWD/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [[ -z "${CUDACXX:-}" && -x /usr/local/cuda/bin/nvcc ]]; then export CUDACXX=/usr/local/cuda/bin/nvcc; fi
