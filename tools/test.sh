#!/usr/bin/env bash
# README command 2 (and .ci/run): set up, build, run every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --with-browser
cd build
# MPI tests declare PROCESSORS 2, so -j2 runs one of them at a time.
ctest -j2 --output-on-failure "$@"
