#!/usr/bin/env python3
"""Markdown table of partita's benchmarks against their raw-MPI twins.

usage: ratio_table.py RESULT.json   (Google Benchmark JSON with repetitions)

Pairs every partita_<primitive>_<mode> with the raw MPI benchmark that moves
the same bytes, and prints the median times, their ratio and difference.
"""
import json
import sys

TWINS = {
    "partita_broadcast_fwd": "mpi_bcast",
    "partita_broadcast_fwdbwd": "mpi_bcast_reduce",
    "partita_sum_reduce_fwd": "mpi_reduce",
    "partita_sum_reduce_fwdbwd": "mpi_reduce_bcast",
    "partita_all_sum_reduce_fwd": "mpi_allreduce",
    "partita_all_sum_reduce_fwdbwd": "mpi_allreduce_twice",
}


def medians(doc):
    out = {}
    for b in doc["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name, size = b["run_name"].split("/")[:2]
        out[(name, int(size))] = b["real_time"]  # manual time, in the unit below
    return out


def human(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def main(path):
    doc = json.load(open(path))
    med = medians(doc)
    ranks = next((b.get("ranks") for b in doc["benchmarks"] if "ranks" in b), "?")
    print(f"| primitive | size | partita (us) | raw MPI (us) | ratio | difference (us) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for ours, twin in TWINS.items():
        for (name, size), t in sorted(med.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            if name != ours or (twin, size) not in med:
                continue
            raw = med[(twin, size)]
            print(f"| {ours.replace('partita_', '')} vs {twin} | {human(size)} | {t:.2f} | "
                  f"{raw:.2f} | {t / raw:.2f} | {t - raw:+.2f} |")
    print(f"\n(medians; {ranks} ranks; time unit: microseconds)")


if __name__ == "__main__":
    main(sys.argv[1])
