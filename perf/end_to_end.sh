#!/usr/bin/env bash
# perf_end_to_end (ctest): real benchmark runs through partita_perf.
#  1. a small run at 2 ranks; the gate passes on it against itself;
#  2. the same run with a planted 30% slowdown of partita's side
#     (PARTITA_BENCH_PLANT_SLOWDOWN), its settings taken from the first run
#     (`run --like`: they must come out the same); the gate must fail on it
#     (exit 1);
#  3. the dashboard of both runs, rendered by headless Chromium: every data
#     point must be in the rendered SVG at its value; a screenshot is kept.
# Exit 77 (ctest: skipped) only when Chromium is absent, after 1 and 2 ran.
set -uo pipefail
perf=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
run=(run --ranks 2 --repetitions 6 --min-time 0.02
     --filter 'all_sum_reduce_fwd/(4096|262144)/')

fail() { echo "FAILED: $*"; exit 1; }

PARTITA_COMMIT=baseline "$perf" "${run[@]}" --out "$dir/base.json" || fail "the baseline run"
"$perf" gate "$dir/base.json" "$dir/base.json" || fail "the gate did not pass a run against itself"

sleep 1  # a later date for the second run
PARTITA_COMMIT=planted-slowdown PARTITA_BENCH_PLANT_SLOWDOWN=0.3 \
  "$perf" run --like "$dir/base.json" --out "$dir/slow.json" || fail "the planted run"
python3 - "$dir/base.json" "$dir/slow.json" <<'PY' || fail "run --like did not repeat the first run's settings"
import json, sys
base, slow = (json.load(open(f))["settings"] for f in sys.argv[1:])
slow.pop("planted_slowdown", None)
if base != slow:
    sys.exit(f"settings differ: {base} vs {slow}")
PY
"$perf" gate "$dir/base.json" "$dir/slow.json"
status=$?
[ $status -eq 1 ] || fail "the gate exited $status on a planted 30% slowdown (expected 1)"
echo "gate: passed on itself, failed on the planted 30% slowdown"

"$perf" dashboard "$dir/base.json" "$dir/slow.json" --out "$dir/dashboard.html" || fail "dashboard"
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "SKIPPED the browser check: chromium is not installed (apt-get install chromium)"
  exit 77
fi
flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-background-networking
       --disable-extensions --no-first-run --user-data-dir="$dir/profile")
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$dir/dashboard.html" > "$dir/dom.html" \
  2> "$dir/chromium.log" || fail "chromium --dump-dom (see $dir/chromium.log)"
"$perf" verify-dashboard "$dir/dom.html" "$dir/base.json" "$dir/slow.json" || fail "the rendered dashboard"
timeout 120 "$browser" "${flags[@]}" --window-size=1400,1800 --screenshot="$dir/dashboard.png" \
  "file://$dir/dashboard.html" >> "$dir/chromium.log" 2>&1 || fail "chromium --screenshot"
[ -s "$dir/dashboard.png" ] || fail "no screenshot written"
echo "dashboard rendered in $("$browser" --version 2>/dev/null); screenshot $dir/dashboard.png"
