#!/usr/bin/env bash
# README command 1: set up, build, run the conformance suite (summary table).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec build/partita conformance "$@"
