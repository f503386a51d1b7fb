#!/usr/bin/env python3
"""Reads a partita checkpoint with Python's standard library alone, as any
safetensors reader would, and checks it against the global tensors that
spec_checkpoint's WritesTensorsAnyReaderOpens saved: element i of tensor
t<k> is (i mod 61) - 30 + k. Exit 0 when every check holds.

usage: read_checkpoint.py DIR
"""
import json
import os
import struct
import sys

FORMATS = {"F64": "d", "F32": "f", "F16": "e", "I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B"}
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def values(dtype, raw):
    if dtype == "BF16":  # the upper half of a float32
        halves = struct.unpack("<%dH" % (len(raw) // 2), raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    fmt = FORMATS[dtype]
    return list(struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw))


def main(path):
    problems = []
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    with open(os.path.join(path, manifest["file"]), "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    header.pop("__metadata__", None)
    ranges = sorted((e["data_offsets"][0], e["data_offsets"][1], name) for name, e in header.items())
    at = 0
    for begin, end, name in ranges:
        if begin != at:
            problems.append("%s begins at %d, not %d" % (name, begin, at))
        at = end
    if at != len(body):
        problems.append("the data ends at %d of %d bytes" % (at, len(body)))
    listed = {t["name"]: t for t in manifest["tensors"]}
    if set(listed) != set(header):
        problems.append("the manifest lists %s, the file holds %s" % (sorted(listed), sorted(header)))
    for name, e in sorted(header.items()):
        shape, dtype = e["shape"], e["dtype"]
        count = 1
        for d in shape:
            count *= d
        begin, end = e["data_offsets"]
        if end - begin != count * SIZES[dtype]:
            problems.append("%s: %d bytes for %s %s" % (name, end - begin, dtype, shape))
            continue
        if listed.get(name, {}).get("shape") != shape or listed.get(name, {}).get("dtype") != dtype:
            problems.append("%s: the manifest says %s" % (name, listed.get(name)))
        k = int(name[1:])
        got = values(dtype, body[begin:end])
        want = [(i % 61) - 30 + k for i in range(count)]
        bad = [i for i in range(count) if got[i] != want[i]]
        if bad:
            i = bad[0]
            problems.append("%s: %d of %d elements differ, first at %d: %r, not %r" % (name, len(bad), count, i, got[i], want[i]))
        else:
            print("%s %s %s: %d elements as the global tensor" % (name, dtype, shape, count))
    if manifest["counters"].get("data.position") != 12:
        problems.append("counters: %s" % manifest["counters"])
    for p in problems:
        print("read_checkpoint.py: " + p)
    print("read_checkpoint.py: %s" % ("FAILED" if problems else "every tensor as saved"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
