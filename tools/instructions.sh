#!/usr/bin/env bash
# Instructions per call of partita's forward and of its raw-MPI twin
# (issue 34 item 1), counted by callgrind inside bench_primitives' paired
# loop (bench/paired.hpp, CountedScope): one valgrind run per side, every
# rank under valgrind, collection on only inside that side's calls.
#   tools/instructions.sh BUILD_DIR RANKS BENCHMARK...    e.g.
#   tools/instructions.sh build 1 all_sum_reduce_fwd/4096 broadcast_fwd/4096
# Prints one line per benchmark: ours and raw instructions per call (every
# rank's instructions over every rank's counted calls: the mean over the
# ranks of one rank's count per call), and their ratio.
# At 2 ranks and more the counts include MPICH's polling while a rank waits
# for its peer, which depends on timing; at 1 rank they are the calls' own
# work only.
# PARTITA_CALLGRIND_KEEP=DIR keeps the callgrind files there (DIR/<benchmark>.<side>.<pid>)
# for `callgrind_annotate --inclusive=yes` (tools/instructions-breakdown.sh).
set -euo pipefail
build=$1 ranks=$2
shift 2
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is not installed (apt-get install valgrind)"; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# Valgrind 3.19 (Debian 12) decodes RDTSCP only where the CPU advertises it
# (cpuid); some virtual machines run it without advertising it (flags
# without `rdtscp` in /proc/cpuinfo, as on the AMD EPYC host of
# 2026-11-26), and LibTorch's dependencies load libhwy, whose initialiser
# executes RDTSCP in hwy::platform::TimerResolution(): under valgrind the
# program dies of SIGILL before main. libhwy calls that function through
# its PLT, so a preloaded definition (returning 1; only hwy's own
# benchmarking timer reads it) takes its place there.
preload=()
if ! grep -qw rdtscp /proc/cpuinfo && ldd "$build/bench/bench_primitives" | grep libhwy >/dev/null; then
  printf '#include <cstdint>\nnamespace hwy { namespace platform { uint64_t TimerResolution() { return 1; } } }\n' \
    > "$dir/hwy_timer.cpp"
  g++ -O2 -shared -fPIC "$dir/hwy_timer.cpp" -o "$dir/libhwy_timer.so"
  preload=(env "LD_PRELOAD=$dir/libhwy_timer.so")
fi
for bench in "$@"; do
  declare -A per_call=()
  for side in ours raw; do
    PARTITA_BENCH_COUNT=$side OMP_NUM_THREADS=1 timeout 1200 "${preload[@]}" mpiexec.mpich -n "$ranks" \
      valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$dir/$side.%p" \
      "$build/bench/bench_primitives" --benchmark_filter="^${bench}/" --benchmark_min_time=0.5 \
      > "$dir/$side.log" 2>&1 || { cat "$dir/$side.log"; exit 1; }
    calls=$(grep -h "^counted calls:" "$dir/$side.log" | awk '{s += $3} END {print s}')
    ir=$(grep -h "Collected :" "$dir/$side.log" | awk '{s += $NF} END {print s}')
    [ "${calls:-0}" -gt 0 ] || { echo "instructions.sh: no calls counted for $bench ($side)"; exit 1; }
    per_call[$side]=$(awk -v i="$ir" -v c="$calls" 'BEGIN {printf "%.0f", i / c}')
    if [ -n "${PARTITA_CALLGRIND_KEEP:-}" ]; then
      mkdir -p "$PARTITA_CALLGRIND_KEEP"
      for f in "$dir/$side".[0-9]*; do mv "$f" "$PARTITA_CALLGRIND_KEEP/${bench//\//_}.${f##*/}"; done
      echo "$calls" > "$PARTITA_CALLGRIND_KEEP/${bench//\//_}.$side.calls"
    fi
    rm -f "$dir/$side".*
  done
  awk -v b="$bench" -v r="$ranks" -v o="${per_call[ours]}" -v w="${per_call[raw]}" \
    'BEGIN {printf "%s @%d ranks: partita %d, twin %d instructions per call (%.2fx)\n", b, r, o, w, o / w}'
done
