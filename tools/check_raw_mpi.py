#!/usr/bin/env python3
"""Fails when a test suite calls a blocking MPI operation directly.

A raw MPI_Allreduce (or barrier, broadcast, blocking send, MPI_Wait ...) in
a test body, a fixture or the harness waits where no deadline and no
watchdog reach it: a peer that left the test by an exception leaves it
waiting until ctest's timeout. Tests use partita::testing's agreed helpers
(sum_over_ranks, all_ranks, agree, sync_ranks ...) or post the operation and
finish it with partita::mpi::wait (docs/testing-library.md, "No test can
hang"). A call that must stay raw carries `raw-mpi-ok: <why>` in a comment
on its line or the line above.

usage: check_raw_mpi.py DIR_OR_FILE ...   (exit 1 and one line per call found)
"""
import os
import re
import sys

BLOCKING = (
    "Allreduce|Reduce|Bcast|Barrier|Allgather|Allgatherv|Gather|Gatherv|Scatter|Scatterv|"
    "Alltoall|Alltoallv|Alltoallw|Reduce_scatter|Reduce_scatter_block|Scan|Exscan|"
    "Sendrecv|Sendrecv_replace|Send|Ssend|Bsend|Rsend|Recv|Probe|Mprobe|Mrecv|"
    "Wait|Waitall|Waitany|Waitsome|Comm_dup|Comm_split|Comm_split_type|Comm_create|"
    "Comm_create_group|Cart_create|Cart_sub|Intercomm_create|Intercomm_merge|Dist_graph_create|"
    "Dist_graph_create_adjacent|Comm_accept|Comm_connect|"
    "Neighbor_allgather|Neighbor_allgatherv|Neighbor_alltoall|Neighbor_alltoallv|Neighbor_alltoallw|"
    "Win_fence|Win_create|Win_allocate|Win_allocate_shared|Win_create_dynamic|Win_free|Win_lock|"
    "Win_lock_all|Win_unlock|Win_unlock_all|Win_flush|Win_flush_all|Win_wait|Win_complete|"
    "File_open|File_close|File_set_view|File_set_size|File_sync|File_read_all|File_write_all|"
    "File_read_at_all|File_write_at_all|File_read_ordered|File_write_ordered")
# MPI_ or ::MPI_, not PMPI_ (an interposer forwarding) nor x.MPI_ / x::MPI_.
CALL = re.compile(r"(?<![\w.:>])(?:::)?MPI_(%s)\s*\(" % BLOCKING)
DEFINITION = re.compile(r"\bint\s+P?MPI_\w+\s*\(")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)\'')


def code_of(line, in_block):
    """The line without comments and string literals; whether a /* */ block is still open."""
    out = ""
    i = 0
    line = STRING.sub('""', line)
    while i < len(line):
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                return out, True
            i, in_block = end + 2, False
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            in_block, i = True, i + 2
        else:
            out += line[i]
            i += 1
    return out, in_block


def check(path):
    found = []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    in_block = False
    for n, line in enumerate(lines, 1):
        code, in_block = code_of(line, in_block)
        for m in CALL.finditer(code):
            if DEFINITION.search(code):
                continue  # a PMPI interposer's own definition
            allowed = "raw-mpi-ok" in line or (n > 1 and "raw-mpi-ok" in lines[n - 2])
            if not allowed:
                found.append(f"{path}:{n}: raw blocking MPI_{m.group(1)} (use partita::testing's helpers or "
                             f"post it and finish it with partita::mpi::wait; `raw-mpi-ok: why` if it must stay)")
    return found


def main():
    found = []
    for arg in sys.argv[1:]:
        paths = [arg]
        if os.path.isdir(arg):
            paths = [os.path.join(root, n) for root, _, names in os.walk(arg) for n in sorted(names)
                     if n.endswith((".cpp", ".hpp", ".h", ".cc"))]
        for p in sorted(paths):
            found += check(p)
    for line in found:
        print(line)
    print(f"check_raw_mpi: {len(found)} raw blocking MPI call(s) in the test suites")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
