#!/usr/bin/env bash
# ctest explain_pipeline_svg (issue 31): `partita explain pipeline` draws a
# schedule as SVG; headless Chromium renders it, and the rendered document
# must hold one box per compute action and one idle band per rank. Exit 77
# (SKIPPED) without Chromium.
set -euo pipefail
partita=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
fail() { echo "FAILED: $*"; exit 1; }
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "SKIPPED the browser check: chromium is not installed (apt-get install chromium)"
  exit 77
fi
# Megatron's interleaved 1F1B, 4 ranks x 2 chunks x 8 microbatches: 128
# computations (a forward and a full backward per chunk and microbatch).
"$partita" explain pipeline --schedule interleaved_1f1b --stages 4 --microbatches 8 --virtual 2 \
  --svg "$dir/pipeline.svg" > "$dir/explain.txt" || fail "partita explain pipeline"
flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-background-networking
       --disable-extensions --no-first-run --user-data-dir="$dir/profile")
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$dir/pipeline.svg" > "$dir/dom.html" \
  2> "$dir/chromium.log" || fail "chromium --dump-dom (see $dir/chromium.log)"
actions=$(grep -o 'class="action"' "$dir/dom.html" | wc -l)
idle=$(grep -o 'class="idle"' "$dir/dom.html" | wc -l)
[ "$actions" -eq 128 ] || fail "the rendered SVG has $actions action boxes, not 128"
[ "$idle" -eq 4 ] || fail "the rendered SVG has $idle idle bands, not 4 (one per rank)"
grep -q 'bubble 15.8 %' "$dir/dom.html" || fail "the rendered SVG does not state the bubble 15.8 %"
timeout 120 "$browser" "${flags[@]}" --window-size=1700,200 --screenshot="$dir/pipeline.png" \
  "file://$dir/pipeline.svg" >> "$dir/chromium.log" 2>&1 || fail "chromium --screenshot"
[ -s "$dir/pipeline.png" ] || fail "no screenshot written"
echo "pipeline SVG rendered: $actions action boxes, $idle idle bands; screenshot $dir/pipeline.png"
