#!/usr/bin/env bash
# README command 2 (and .ci/run): set up, build, run every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --with-browser
cd build
# MPI tests declare PROCESSORS 2, so -j2 runs one of them at a time.
# The soak tests (fresh seeds, ten times the cases: `ctest -L soak`) and
# the long suites (`ctest -L nightly`) are for nightly runs, not this one.
ctest -j2 --output-on-failure -LE "soak|nightly" "$@"
