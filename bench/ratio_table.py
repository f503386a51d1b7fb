#!/usr/bin/env python3
"""Markdown table of partita's benchmarks against their raw-MPI twins.

usage: ratio_table.py RESULT.json   (bench_primitives JSON, with repetitions)

Each benchmark times partita and its raw-MPI twin in the same iterations and
records the medians as counters (partita_us, mpi_us, ratio); this prints the
median over the repetitions of each.
"""
import json
import sys

TWINS = {
    "broadcast_fwd": "MPI_Bcast",
    "broadcast_fwdbwd": "MPI_Bcast + MPI_Reduce",
    "sum_reduce_fwd": "MPI_Reduce",
    "sum_reduce_fwdbwd": "MPI_Reduce + MPI_Bcast",
    "all_sum_reduce_fwd": "MPI_Allreduce",
    "all_sum_reduce_fwdbwd": "2 x MPI_Allreduce",
    "all_gather_fwd": "MPI_Allgather",
    "reduce_scatter_fwd": "MPI_Reduce_scatter",
    "repartition_fwd": "MPI_Alltoall",
}


def human(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main(path):
    doc = json.load(open(path))
    rows = []
    for b in doc["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name, size = b["run_name"].split("/")[:2]
        rows.append((list(TWINS).index(name), int(size), name, b))
    ranks = int(rows[0][3]["ranks"]) if rows else "?"
    print("| primitive | raw MPI twin | size | partita (us) | raw MPI (us) | ratio | difference (us) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for _, size, name, b in sorted(rows, key=lambda r: (r[0], r[1])):
        ours, raw = b["partita_us"], b["mpi_us"]
        print(f"| {name} | {TWINS[name]} | {human(size)} | {ours:.1f} | {raw:.1f} | "
              f"{b['ratio']:.2f} | {ours - raw:+.1f} |")
    print(f"\n(medians over repetitions of per-iteration medians; {ranks} ranks; "
          f"{doc['context'].get('num_cpus', '?')} cores)")


if __name__ == "__main__":
    main(sys.argv[1])
