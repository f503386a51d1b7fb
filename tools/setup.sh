#!/usr/bin/env bash
# Installs what is missing (Debian 12, as root) and builds partita in ./build.
# Used by both README commands; safe to run again. `--with-browser` also
# installs Chromium (the dashboard's browser test; tools/test.sh asks for it).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake ninja-build make libtorch-dev libmpich-dev mpich librapidcheck-dev libgtest-dev
          libbenchmark-dev nlohmann-json3-dev libcli11-dev python3 coreutils
          clang-14 libclang-rt-14-dev libfuzzer-14-dev  # the smp decoder fuzzer
          libgloo-dev  # the headers of LibTorch's c10d Gloo, the benchmarks' third line
          libopenblas0-serial  # LibTorch's GEMMs: Debian's default libblas is the reference BLAS
          iproute2 procps util-linux  # tools/simnodes.sh: ip, pgrep, nsenter/unshare/setpriv
          doxygen)  # the API reference (docs/api.md) and its ctest
if [ "${1:-}" = "--with-browser" ]; then packages+=(chromium); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# MPICH explicitly: if OpenMPI is also installed it may own `mpicxx`.
# Line tables only (-g1) and the libraries in unity batches: a build from
# scratch takes a third less (docs/building.md).
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DPARTITA_UNITY_BUILD=ON \
      -DMPI_CXX_COMPILER="$(command -v mpicxx.mpich || command -v mpicxx)"
cmake --build build -j "$(nproc)"
