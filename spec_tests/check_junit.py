#!/usr/bin/env python3
"""ctest conformance_junit (issue 10): `partita conformance --junit FILE` on a
small manifest with one passing suite, one failing program and one
unimplemented primitive, then checks the XML's structure the way CI
systems read it: <testsuites> of <testsuite> of <testcase>, one testcase
per suite and rank count, counts that add up, a <failure> that carries the
rerun command, a <skipped> for the unimplemented suite."""
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

partita, mpiexec, suite_binary, work = sys.argv[1:5]
manifest = {
    "mpiexec": mpiexec,
    "suites": [
        {"name": "spec_mpi_primitives", "binary": suite_binary, "ranks": [1, 2]},
        {"name": "always_fails", "binary": "/bin/false", "ranks": [1]},
        {"name": "not_yet", "unimplemented": "no implementation yet"},
    ],
}
suites = work + "/suites.json"
report = work + "/report.xml"
with open(suites, "w") as f:
    json.dump(manifest, f)
run = subprocess.run([partita, "conformance", "--suites", suites, "--filter", "*Broadcast*",
                      "--timeout", "120", "--junit", report], capture_output=True, text=True)
problems = []
def check(cond, what):
    if not cond:
        problems.append(what)

check(run.returncode == 1, f"exit status {run.returncode}, expected 1 (a suite failed)")
root = ET.parse(report).getroot()
check(root.tag == "testsuites", f"root is <{root.tag}>")
by_name = {s.get("name"): s for s in root.findall("testsuite")}
check(sorted(by_name) == ["always_fails", "not_yet", "spec_mpi_primitives"],
      f"testsuites {sorted(by_name)}")
total = failures = skipped = 0
for name, s in by_name.items():
    cases = s.findall("testcase")
    check(int(s.get("tests")) == len(cases), f"{name}: tests={s.get('tests')} for {len(cases)} cases")
    f = sum(1 for c in cases if c.find("failure") is not None)
    k = sum(1 for c in cases if c.find("skipped") is not None)
    check(int(s.get("failures")) == f, f"{name}: failures={s.get('failures')}, counted {f}")
    check(int(s.get("skipped")) == k, f"{name}: skipped={s.get('skipped')}, counted {k}")
    for c in cases:
        check(c.get("classname") == "partita.conformance." + name, f"{name}: classname {c.get('classname')}")
        check(float(c.get("time")) >= 0, f"{name}: time {c.get('time')}")
    total, failures, skipped = total + len(cases), failures + f, skipped + k
check(int(root.get("tests")) == total == 4, f"tests={root.get('tests')}, counted {total}, expected 4")
check(int(root.get("failures")) == failures == 1, f"failures={root.get('failures')}, counted {failures}")
check(int(root.get("skipped")) == skipped == 1, f"skipped={root.get('skipped')}, counted {skipped}")
passing = by_name.get("spec_mpi_primitives")
if passing is not None:
    check([c.get("name") for c in passing.findall("testcase")] == ["np1", "np2"], "np1, np2 testcases")
    check(all(c.find("failure") is None for c in passing.findall("testcase")), "passing suite has a failure")
failing = by_name.get("always_fails")
if failing is not None:
    fail = failing.find("testcase/failure")
    check(fail is not None and "-n 1 '/bin/false'" in fail.get("message", ""),
          "the failure's message carries the rerun command")
    check(fail is not None and "rerun: " in (fail.text or ""), "the failure's text carries the rerun command")
for p in problems:
    print("JUNIT WRONG:", p)
if problems:
    print(run.stdout, run.stderr)
    sys.exit(1)
print(f"JUNIT OK: {total} testcases, {failures} failure, {skipped} skipped")
