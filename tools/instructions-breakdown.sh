#!/usr/bin/env bash
# Where a forward's instructions go (issue 34 item 1): reads the callgrind
# files that `PARTITA_CALLGRIND_KEEP=DIR tools/instructions.sh ...` kept and
# prints the counted rank's inclusive instructions per call of every function
# under the benchmark's loop that takes at least MIN_PERCENT (default 4) of
# the side's total: partita's own functions, LibTorch's (at::, c10::),
# MPICH's entry points (PMPI_) and the C allocator. Inclusive costs nest (a
# function's count holds its callees'), so the lines are parts to compare,
# not terms of a sum.
#   tools/instructions-breakdown.sh DIR BENCHMARK [SIDE [MIN_PERCENT]]
#   tools/instructions-breakdown.sh /tmp/cg all_sum_reduce_fwd/4096
set -euo pipefail
dir=$1 bench=${2//\//_} side=${3:-ours} min=${4:-4}
command -v callgrind_annotate >/dev/null || { echo "instructions-breakdown.sh: callgrind_annotate is not installed (apt-get install valgrind)"; exit 2; }
[ -f "$dir/$bench.$side.calls" ] || { echo "instructions-breakdown.sh: no $dir/$bench.$side.calls (run instructions.sh with PARTITA_CALLGRIND_KEEP=$dir)"; exit 2; }
# One process ran under valgrind (the counted rank); the calls file holds
# its count of calls.
files=("$dir/$bench.$side".[0-9]*)
calls=$(cat "$dir/$bench.$side.calls")
for f in "${files[@]}"; do
  echo "== ${f##*/}: $calls calls"
  callgrind_annotate --inclusive=yes --threshold=100 --auto=no "$f" 2>/dev/null |
    awk -v calls="$calls" -v min="$min" '
      /PROGRAM TOTALS/ { gsub(",", "", $1); total = $1; next }
      total == 0 || !/^ *[0-9,]+ \( *[0-9.]+%\)/ { next }
      {
        ir = $1; gsub(",", "", ir)
        name = $0; sub(/^ *[0-9,]+ \( *[0-9.]+%\) +/, "", name)
        sub(/ \[[^]]*\]$/, "", name)   # the object file
        sub(/^[^:]*:/, "", name)        # the source file
        if (name !~ /^(partita::|at::|c10::|PMPI_|malloc|free|_int_malloc|_int_free|posix_memalign)/) next
        if (100 * ir / total < min) next
        if (seen[name]++) next
        printf "%9.0f  %5.1f%%  %s\n", ir / calls, 100 * ir / total, substr(name, 1, 110)
      }'
done
