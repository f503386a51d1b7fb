#!/usr/bin/env bash
# partita::checkpoint's save and load against dd writing and reading the
# same number of bytes on the same file system, in one sitting
# (docs/checkpoints.md, "Speed and memory"):
#   dd if=/dev/zero of=F bs=4M conv=fsync   (a save flushes its file too)
#   dd if=F of=/dev/null bs=4M              (from the page cache, as a load
#                                            right after a save reads)
#   dd if=F iflag=nocache count=0, then the same read (cold: the file's
#                                            pages dropped, as a resume on a
#                                            fresh allocation reads)
# then bench_checkpoint at each rank count. Prints a table of medians and
# ratios to dd, the CPU model and the file system.
#
#   bash bench/checkpoint_bandwidth.sh [--exe build/bench/bench_checkpoint]
#        [--dir /tmp/partita-checkpoint-bench] [--mib 256] [--rounds 3] [--ranks "1 2 4"]
set -euo pipefail
exe=build/bench/bench_checkpoint dir=/tmp/partita-checkpoint-bench mib=256 rounds=3 ranks="1 2 4"
while [ $# -gt 0 ]; do
  case "$1" in
    --exe) exe=$2 ;;
    --dir) dir=$2 ;;
    --mib) mib=$2 ;;
    --rounds) rounds=$2 ;;
    --ranks) ranks=$2 ;;
    *) echo "checkpoint_bandwidth.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
mpiexec=${PARTITA_MPIEXEC:-mpiexec.mpich}
mkdir -p "$dir"
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
seconds() {  # COMMAND...: its wall time in seconds
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > /dev/null 2>&1
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f\n", b - a }'
}
dd_write=() dd_read=() dd_cold=()
for r in $(seq "$rounds"); do
  dd_write+=("$(seconds dd if=/dev/zero of="$dir/dd" bs=4M count=$((mib / 4)) conv=fsync)")
  dd_read+=("$(seconds dd if="$dir/dd" of=/dev/null bs=4M)")
  dd if="$dir/dd" iflag=nocache count=0 2> /dev/null
  dd_cold+=("$(seconds dd if="$dir/dd" of=/dev/null bs=4M)")
done
rm -f "$dir/dd"
w=$(printf '%s\n' "${dd_write[@]}" | median)
rd=$(printf '%s\n' "${dd_read[@]}" | median)
cold=$(printf '%s\n' "${dd_cold[@]}" | median)
echo "| operation | ranks | median s | MiB/s | ratio to dd |"
echo "| --- | --- | --- | --- | --- |"
awk -v s="$w" -v m="$mib" 'BEGIN { printf "| dd write + fsync | 1 | %.3f | %.0f | 1.00x |\n", s, m / s }'
awk -v s="$rd" -v m="$mib" 'BEGIN { printf "| dd read | 1 | %.3f | %.0f | 1.00x |\n", s, m / s }'
awk -v s="$cold" -v m="$mib" 'BEGIN { printf "| dd cold read | 1 | %.3f | %.0f | 1.00x |\n", s, m / s }'
rss=""
for n in $ranks; do
  out=$(OMP_NUM_THREADS=1 "$mpiexec" -n "$n" "$exe" --dir "$dir" --mib "$mib" --rounds "$rounds")
  s=$(echo "$out" | awk '/^save/ { print $4 }')
  l=$(echo "$out" | awk '/^load/ { print $4 }')
  c=$(echo "$out" | awk '/^cold load/ { print $5 }')
  awk -v s="$s" -v d="$w" -v m="$mib" -v n="$n" 'BEGIN { printf "| save | %d | %.3f | %.0f | %.2fx |\n", n, s, m / s, d / s }'
  awk -v s="$l" -v d="$rd" -v m="$mib" -v n="$n" 'BEGIN { printf "| load | %d | %.3f | %.0f | %.2fx |\n", n, s, m / s, d / s }'
  awk -v s="$c" -v d="$cold" -v m="$mib" -v n="$n" 'BEGIN { printf "| cold load | %d | %.3f | %.0f | %.2fx |\n", n, s, m / s, d / s }'
  rss+="$n ranks:$(echo "$out" | sed -n 's/^peak RSS.*rank)://p'); "
done
echo
echo "peak RSS growth during save and load over each rank's shards (KiB growth/shards): $rss"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(getconf _NPROCESSORS_ONLN) cores"
echo "file system: $(df -T "$dir" | awk 'NR == 2 { print $2 " on " $1 }')"
