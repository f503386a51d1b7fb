#!/usr/bin/env python3
"""Doxygen's INPUT_FILTER for partita's public headers.

The headers are commented in plain `//` lines, written to be read in the
header. This filter shows Doxygen the same comments as documentation,
without changing the files:
  - the comment block at the top of a header becomes the file's
    description (`@file` is added to its last line);
  - a block of `//` lines becomes `///` lines, the documentation of the
    declaration below it (section rules such as `// --- x ---` stay plain);
  - a `// comment` after a declaration on the same line becomes
    `///< comment`, the documentation of that declaration.
The line count never changes, so Doxygen's warnings name the header's own
lines.
"""
import re
import sys

RULE = re.compile(r"^//\s*-{3}")
TRAILING = re.compile(r"^(.*?[^\s/].*?)(\s+)//(?!/)\s?(.*)$")
CLOSING = re.compile(r"^\s*(\}|\};|#endif|namespace\b)")


def main(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    top = None  # index of the top block's last line
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith("//") and not stripped.startswith("///"):
            if RULE.match(stripped):
                out.append(line)
            else:
                out.append(indent + "///" + stripped[2:])
            if top is None or top == i - 1 and all(l.lstrip().startswith("//") for l in lines[: i + 1]):
                if all(l.lstrip().startswith("//") for l in lines[: i + 1]):
                    top = i
            continue
        m = TRAILING.match(line)
        if m and not stripped.startswith("#") and '"' not in m.group(1) and not CLOSING.match(line):
            line = m.group(1) + m.group(2) + "///< " + m.group(3)
        out.append(line)
    if top is not None:
        out[top] = out[top] + " @file"
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
