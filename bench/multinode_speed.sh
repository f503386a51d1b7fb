#!/usr/bin/env bash
# Speed across simulated nodes (docs/benchmarks.md, "Across nodes"): the
# team primitives and the communicator beside their raw MPI twins
# (bench_primitives' paired rows), at 4 KiB, 256 KiB and 4 MiB, in one
# sitting on four layouts:
#
#   one node, 2 ranks          mpiexec -n 2
#   2 nodes x 1 rank           tools/simnodes.sh --netns (traffic through veth)
#   one node, 4 ranks          mpiexec -n 4
#   2 nodes x 2 ranks          tools/simnodes.sh --netns
#
# and prints one Markdown table: per row, partita's time over its twin's
# (the median of the repetitions) on one node and across nodes, and at
# 4 KiB the difference in microseconds. Needs root (network namespaces).
#
#   sudo bench/multinode_speed.sh [--build DIR] [--repetitions N] [--min-time S]
#                                 [--ranks 2|4|2,4]
#
# --ranks 2 runs the two 2-rank layouts only (about a quarter of the time:
# the 4-rank layouts put 4 ranks on 2 cores here).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
reps=5
min_time=0.2
ranks=2,4
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --repetitions) reps="$2"; shift 2 ;;
    --min-time) min_time="$2"; shift 2 ;;
    --ranks) ranks="$2"; shift 2 ;;
    *) echo "multinode_speed: unknown option $1" >&2; exit 2 ;;
  esac
done
bench="$build/bench/bench_primitives"
[ -x "$bench" ] || { echo "multinode_speed: $bench not built" >&2; exit 2; }
filter='^((broadcast|sum_reduce|all_sum_reduce|all_gather|reduce_scatter)_(fwd|fwdbwd|static_fwd)|comm_(allreduce|bcast|alltoall|ring)_(fwd|fwdbwd)|comm_(alltoall|bcast)_static_fwd)/(4096|262144|4194304)/'
args=(--benchmark_filter="$filter" --benchmark_min_time="$min_time" --benchmark_repetitions="$reps"
      --benchmark_report_aggregates_only=true --benchmark_format=json)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1
export PARTITA_BENCH_GLOO=0  # the c10d peer line works on one node only
run() {  # name, command...
  local name="$1"
  shift
  echo "multinode_speed: $name" >&2
  "$@" "$bench" "${args[@]}" > "$out/$name.json.all"
  # Only rank 0 prints; the JSON is the one object in the output.
  python3 -c 'import sys,json; t=sys.stdin.read(); i=t.index("{"); d=json.JSONDecoder().raw_decode(t[i:])[0]; json.dump(d, open(sys.argv[1],"w"))' \
    "$out/$name.json" < "$out/$name.json.all"
}
mpiexec="${PARTITA_MPIEXEC:-mpiexec.mpich}"
case ",$ranks," in *,2,*) ;; *,4,*) ;; *) echo "multinode_speed: --ranks is 2, 4 or 2,4" >&2; exit 2 ;; esac
if [[ ",$ranks," == *,2,* ]]; then
  run one2 "$mpiexec" -n 2
  run nodes2x1 tools/simnodes.sh --nodes 2 --ranks-per-node 1 --netns --no-finalize --timeout 900 --
fi
if [[ ",$ranks," == *,4,* ]]; then
  run one4 "$mpiexec" -n 4
  run nodes2x2 tools/simnodes.sh --nodes 2 --ranks-per-node 2 --netns --no-finalize --timeout 900 --
fi

python3 - "$out" <<'EOF'
import json, sys, re
out = sys.argv[1]
def load(name):
    rows = {}
    for b in json.load(open(f"{out}/{name}.json"))["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        m = re.match(r"(\w+)/(\d+)/", b["name"])
        rows[(m.group(1), int(m.group(2)))] = (b["partita_us"], b["mpi_us"])
    return rows
import os
runs = {n: load(n) for n in ("one2", "nodes2x1", "one4", "nodes2x2") if os.path.exists(f"{out}/{n}.json")}
names = sorted({k[0] for r in runs.values() for k in r}, key=lambda s: (s.startswith("comm_"), s))
def cell(run, name, size):
    p, m = runs[run].get((name, size), (None, None))
    if p is None:
        return "-"
    return f"{p - m:+.2f} us" if size == 4096 else f"{p / m:.2f}"
for one, across, title in (("one2", "nodes2x1", "2 ranks: one node (1 x 2) | 2 nodes x 1"),
                           ("one4", "nodes2x2", "4 ranks: one node (1 x 4) | 2 nodes x 2")):
    if one not in runs:
        continue
    print(f"{title}; at 4 KiB partita's time minus its twin's, above it the ratio")
    print()
    print("| benchmark | 4 KiB, 1 node | 4 KiB, nodes | 256 KiB, 1 node | 256 KiB, nodes | 4 MiB, 1 node | 4 MiB, nodes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in names:
        print(f"| {n} | " + " | ".join(cell(r, n, s) for s in (4096, 262144, 4194304) for r in (one, across)) + " |")
    a1 = runs[one].get(("all_sum_reduce_fwd", 4096), (0, 0))[1]
    a2 = runs[across].get(("all_sum_reduce_fwd", 4096), (0, 0))[1]
    print()
    print(f"(raw MPI_Allreduce of 4 KiB: {a1:.2f} us on one node, {a2:.2f} us across nodes)")
    print()
EOF
lscpu | grep -m1 "Model name"
