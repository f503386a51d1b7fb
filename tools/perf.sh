#!/usr/bin/env bash
# The performance run (docs/performance.md): set up and build, run the
# benchmarks the baseline gates (its rank counts, passes and filter:
# `partita_perf run --like perf/baseline.json`; with no baseline, every
# benchmark at 1 and 2 ranks), store the result in perf/history/, gate it
# against perf/baseline.json, and draw the dashboard of the whole history
# into build/perf/dashboard.html.
# Extra arguments go to `partita_perf run` and win over the baseline's
# (e.g. --repetitions 9, --filter . for every benchmark, --oversubscribed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
out="perf/history/$(date -u +%Y%m%dT%H%M%SZ)_$(git rev-parse --short=7 HEAD 2>/dev/null || echo unknown).json"
like=()
if [ -f perf/baseline.json ]; then like=(--like perf/baseline.json); fi
build/partita_perf run --out "$out" "${like[@]}" "$@"
mkdir -p build/perf
build/partita_perf dashboard perf/history --out build/perf/dashboard.html
if [ -f perf/baseline.json ]; then
  build/partita_perf gate perf/baseline.json "$out"
else
  echo "no perf/baseline.json yet: copy $out there to make it the baseline"
fi
