#!/usr/bin/env bash
# The GPT's training step at 2 ranks against one process, in one sitting
# (docs/transformer.md, "Speed on this machine"): examples/train_gpt at the
# same model, global batch and microbatches, as
#   one process, 1 LibTorch thread      (the baseline; 2.0x is the limit on 2 cores)
#   one process, 2 LibTorch threads     (what a user gets without partita)
#   2 ranks dp 2, tp 2, pp 2 (1F1B)     (1 LibTorch thread each; dp 2 with
#                                        the Linear layers replicated, and
#                                        stored on replica 0 as seed 002's)
#   2 ranks dp 2, half the microbatches  (dp2_same_mbs: each replica's
#                                        microbatch as large as one
#                                        process's, as Megatron-LM counts
#                                        microbatches: B / (mbs x dp))
#   two one-thread processes at once     (two_halves: each trains half the
#                                        batch on its own, no MPI; the
#                                        slower one's median step, the
#                                        ceiling the host allows dp 2 in
#                                        that round; its losses differ and
#                                        are not compared)
# and prints each run's median step, its speedup over the baseline and the
# CPU model. Every run must print the same losses (the same model and data):
# the script fails otherwise.
#
#   bash bench/gpt_scaling.sh [--exe build/examples/train_gpt] [--hidden 256]
#        [--batch 64] [--microbatches 4] [--steps 10] [--rounds 1]
#
# --rounds R repeats the five runs R times, interleaved, and reports the
# median of each run's medians.
set -euo pipefail
exe=build/examples/train_gpt hidden=256 batch=64 microbatches=4 steps=10 rounds=1 layers=4
while [ $# -gt 0 ]; do
  case "$1" in
    --exe) exe=$2 ;;
    --hidden) hidden=$2 ;;
    --batch) batch=$2 ;;
    --microbatches) microbatches=$2 ;;
    --steps) steps=$2 ;;
    --rounds) rounds=$2 ;;
    --layers) layers=$2 ;;
    *) echo "gpt_scaling.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
if [ $((microbatches % 2)) -ne 0 ]; then
  echo "gpt_scaling.sh: --microbatches must be even (dp2_same_mbs runs half as many)" >&2
  exit 2
fi
mpiexec=${PARTITA_MPIEXEC:-mpiexec.mpich}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/halves"

config() {  # partitions tp [microbatches]
  printf '{"partitions": %d, "tensor_parallel_degree": %d, "microbatches": %d, "pipeline": "interleaved"}' \
    "$1" "$2" "${3:-$microbatches}"
}
names=(one_thread two_threads two_halves dp2 dp2_same_mbs dp2_stored tp2 pp2)
run() {  # name -> the run's output in $work/name.R
  local name=$1 round=$2 out="$work/$1.$2"
  local common=(--hidden "$hidden" --batch "$batch" --steps "$steps" --layers "$layers")
  case "$name" in
    one_thread) PARTITA_SMP_CONFIG=$(config 1 1) timeout 900 "$exe" "${common[@]}" --threads 1 >"$out" ;;
    two_halves)
      local half=(--hidden "$hidden" --batch $((batch / 2)) --steps "$steps" --layers "$layers" --threads 1)
      PARTITA_SMP_CONFIG=$(config 1 1) timeout 900 "$exe" "${half[@]}" >"$work/halves/a.$round" &
      local a=$!
      PARTITA_SMP_CONFIG=$(config 1 1) timeout 900 "$exe" "${half[@]}" >"$work/halves/b.$round"
      wait "$a"
      sed -n 's/.*median step \([0-9.]*\) s.*/\1/p' "$work/halves/a.$round" "$work/halves/b.$round" |
        sort -g | tail -1 | sed 's/.*/median step & s/' >"$work/halves/two_halves.$round" ;;
    two_threads) PARTITA_SMP_CONFIG=$(config 1 1) timeout 900 "$exe" "${common[@]}" --threads 2 >"$out" ;;
    dp2) PARTITA_SMP_CONFIG=$(config 1 1) timeout 900 "$mpiexec" -n 2 "$exe" "${common[@]}" --threads 1 >"$out" ;;
    dp2_same_mbs) PARTITA_SMP_CONFIG=$(config 1 1 $((microbatches / 2))) timeout 900 "$mpiexec" -n 2 "$exe" "${common[@]}" \
      --threads 1 >"$out" ;;
    dp2_stored) PARTITA_SMP_CONFIG=$(config 1 1) timeout 900 "$mpiexec" -n 2 "$exe" "${common[@]}" --threads 1 \
      --data-parallel stored >"$out" ;;
    tp2) PARTITA_SMP_CONFIG=$(config 1 2) timeout 900 "$mpiexec" -n 2 "$exe" "${common[@]}" --threads 1 >"$out" ;;
    pp2) PARTITA_SMP_CONFIG=$(config 2 1) timeout 900 "$mpiexec" -n 2 "$exe" "${common[@]}" --threads 1 >"$out" ;;
  esac
}
for ((r = 0; r < rounds; ++r)); do
  for n in "${names[@]}"; do run "$n" "$r"; done
done

# Every run printed the same losses (within float32 rounding of the order
# of the sums: the first three decimals).
losses() { grep '^step ' "$1" | awk '{printf "%.3f\n", $4}'; }
losses "$work/one_thread.0" >"$work/want"
for f in "$work"/*.*; do
  if ! diff -q "$work/want" <(losses "$f") >/dev/null; then
    echo "gpt_scaling.sh: $(basename "$f") printed other losses than one process:" >&2
    paste "$work/want" <(losses "$f") >&2
    exit 1
  fi
done

median_of() {  # name -> the median over rounds of the run's median step
  local at=$work
  [ "$1" = two_halves ] && at=$work/halves
  for ((r = 0; r < rounds; ++r)); do
    sed -n 's/.*median step \([0-9.]*\) s.*/\1/p' "$at/$1.$r"
  done | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
}
base=$(median_of one_thread)
echo "# train_gpt: $layers blocks, width $hidden, global batch $batch in $microbatches microbatches," \
     "float32, Adam; median of $steps steps, $rounds round(s)"
echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(getconf _NPROCESSORS_ONLN) cores"
printf '| %s | %s | %s |\n' run "median step" "speedup over 1 thread"
printf '| --- | ---: | ---: |\n'
for n in "${names[@]}"; do
  m=$(median_of "$n")
  printf '| %s | %.4f s | %.2fx |\n' "$n" "$m" "$(awk -v b="$base" -v m="$m" 'BEGIN {print b / m}')"
done
