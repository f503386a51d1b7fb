#!/usr/bin/env bash
# Instructions per call of partita's forward and of its raw-MPI twin
# (issue 34 item 1), counted by callgrind inside bench_primitives' paired
# loop (bench/paired.hpp, CountedScope): one valgrind run per side,
# collection on only inside that side's calls.
#   tools/instructions.sh BUILD_DIR RANKS BENCHMARK...    e.g.
#   tools/instructions.sh build 1 all_sum_reduce_fwd/4096 broadcast_fwd/4096
# Prints one line per benchmark: ours and raw instructions per call, and
# their ratio.
# At 1 rank the counts are the calls' own work (MPI has no peer to wait for).
# At 2 ranks and more only one rank runs under valgrind (rank
# PARTITA_COUNTED_RANK, 0 unless set) and its peers run natively, fifty
# times faster: they are always inside the collective, waiting, when the
# counted rank arrives, so the counted rank finds its peers' messages there
# and its count holds its own work and MPI's, not MPICH's polling while it
# waits for a peer. (Every rank under valgrind counted that polling, which
# depends on timing: one twin counted 28,856 and 48,623 in two benchmarks of
# one run.) The count is that one rank's: the root of a broadcast or
# reduction is rank 0.
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
counted=${PARTITA_COUNTED_RANK:-0}
[[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "instructions.sh: RANKS must be a positive number, got '$ranks'" >&2; exit 2; }
[[ $counted =~ ^[0-9]+$ ]] && (( counted < ranks )) ||
  { echo "instructions.sh: PARTITA_COUNTED_RANK=$counted is not a rank of $ranks" >&2; exit 2; }
(( ranks <= $(getconf _NPROCESSORS_ONLN) )) ||
  echo "instructions.sh: $ranks ranks on $(getconf _NPROCESSORS_ONLN) cores: the native peers take the counted rank's core and it waits (counts include polling)" >&2
for bench in "$@"; do
  declare -A per_call=()
  program=("$build/bench/bench_primitives" --benchmark_filter="^${bench}/" --benchmark_min_time=0.5)
  for side in ours raw; do
    # One mpiexec, one argument set per rank (MPMD): valgrind on the counted rank only.
    job=()
    for ((r = 0; r < ranks; r++)); do
      [ "$r" -eq 0 ] || job+=(:)
      job+=(-n 1)
      if [ "$r" -eq "$counted" ]; then
        job+=(valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$dir/$side.%p")
      fi
      job+=("${program[@]}")
    done
    PARTITA_BENCH_COUNT=$side OMP_NUM_THREADS=1 timeout 1200 "${preload[@]}" mpiexec.mpich "${job[@]}" \
      > "$dir/$side.log" 2>&1 || { cat "$dir/$side.log"; exit 1; }
    # Every rank prints "counted calls: N (pid P)"; valgrind's process
    # prints "==P== Collected : I". The counted rank's instructions over its
    # own calls.
    pid=$(grep -h "Collected :" "$dir/$side.log" | sed -n 's/^==\([0-9]*\)==.*/\1/p' | head -1)
    ir=$(grep -h "Collected :" "$dir/$side.log" | awk '{print $NF}' | head -1)
    calls=$(grep -h "^counted calls:.*(pid ${pid:-none})" "$dir/$side.log" | awk '{print $3}')
    [ "${calls:-0}" -gt 0 ] || { echo "instructions.sh: no calls counted for $bench ($side)"; exit 1; }
    per_call[$side]=$(awk -v i="$ir" -v c="$calls" 'BEGIN {printf "%.0f", i / c}')
    if [ -n "${PARTITA_CALLGRIND_KEEP:-}" ]; then
      mkdir -p "$PARTITA_CALLGRIND_KEEP"
      rm -f "$PARTITA_CALLGRIND_KEEP/${bench//\//_}.$side".*  # one run's files per benchmark and side
      for f in "$dir/$side".[0-9]*; do mv "$f" "$PARTITA_CALLGRIND_KEEP/${bench//\//_}.${f##*/}"; done
      echo "$calls" > "$PARTITA_CALLGRIND_KEEP/${bench//\//_}.$side.calls"
    fi
    rm -f "$dir/$side".*
  done
  awk -v b="$bench" -v r="$ranks" -v o="${per_call[ours]}" -v w="${per_call[raw]}" \
    -v k="$counted" 'BEGIN {printf "%s @%d ranks (rank %d counted): partita %d, twin %d instructions per call (%.2fx)\n", b, r, k, o, w, o / w}'
done
