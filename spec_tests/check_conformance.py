#!/usr/bin/env python3
"""ctest conformance_runs: `partita conformance` on small manifests of fake
suites (shell scripts that write a gtest JSON report, print what they were
given, fail or wait), one check per line:

- deadline: a fractional PARTITA_DEADLINE under --nodes (a fake launcher
  that runs the command after `--`) reaches the suite scaled; one that is
  not a number stops the run before it starts, exit status 2;
- rerun: a failing row's rerun command (the JUnit <failure>, stdout) names
  the environment it ran with (PARTITA_DEADLINE, PARTITA_WAIT_TIMEOUT,
  RC_PARAMS with the seed), and run by the shell gives the suite the same;
- xml: a failing suite that prints bytes that are not UTF-8 and control
  characters leaves a JUnit report that is XML 1.0;
- report: a gtest report of another form (a test without "status") fails
  its row, and the run goes on to its summary, exit status 1;
- nothing: a run in which no test ran (rank counts no suite has, --nodes
  dividing none of them, every test filtered out) fails, exit status 1;
- interrupt: SIGINT while a suite runs stops the suite and the run within
  seconds, exit status 130, the next suite not started."""
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

partita, mpiexec, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
problems = []


def check(cond, what):
    if not cond:
        problems.append(what)
    return cond


def script(name, body):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, 0o755)
    return path


# The fake suite: writes a gtest JSON report of `tests` passing tests (none
# when given a --gtest_filter) to the path of --gtest_output, and its
# environment to env.txt. FAKE_MODE chooses what else it does.
REPORT_OK = '{"testsuites": [{"testsuite": [%s]}]}'
suite = script("fake_suite.sh", r"""
out=""; filtered=0
for a in "$@"; do
  case "$a" in --gtest_output=json:*) out="${a#--gtest_output=json:}" ;; --gtest_filter=*) filtered=1 ;; esac
done
printf 'PARTITA_DEADLINE=%s\nPARTITA_WAIT_TIMEOUT=%s\nRC_PARAMS=%s\n' "$PARTITA_DEADLINE" "$PARTITA_WAIT_TIMEOUT" "$RC_PARAMS" > "$FAKE_DIR/env.txt"
case "$FAKE_MODE" in
  fail) printf 'bad bytes: \377\300\200 \355\240\200 \001\033[31m red \357\277\276 end\n'; exit 1 ;;
  nostatus) printf '{"testsuites": [{"testsuite": [{"name": "A"}]}]}' > "$out"; exit 0 ;;
  wait) echo $$ > "$FAKE_DIR/pid.txt"; exec sleep 60 ;;
esac
if [ "$filtered" = 1 ]; then printf '{"testsuites": []}' > "$out"
else printf '{"testsuites": [{"testsuite": [{"name": "A", "status": "RUN", "result": "COMPLETED"}]}]}' > "$out"; fi
""")
# A simulated-node launcher that runs the command after `--` on this host.
launcher = script("fake_simnodes.sh", r"""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
exec "$@"
""")


def manifest(name, suites):
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump({"mpiexec": mpiexec, "simnodes": launcher, "suites": suites}, f)
    return path


def conformance(args, mode="", env=None, **kw):
    e = dict(os.environ, FAKE_MODE=mode, FAKE_DIR=work)
    e.pop("PARTITA_DEADLINE", None)
    e.pop("RC_PARAMS", None)
    e.update(env or {})
    return subprocess.run([partita, "conformance", "--timeout", "60"] + args, capture_output=True, text=True,
                          errors="replace", env=e, **kw)


def suite_env():
    with open(os.path.join(work, "env.txt")) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def lines(run):
    return (run.stdout + run.stderr)[-1500:]


# deadline
m = manifest("one", [{"name": "fake", "binary": suite, "ranks": [2]}])
run = conformance(["--suites", m, "--nodes", "2"], env={"PARTITA_DEADLINE": "2.5"})
cores = os.cpu_count() or 1
want = "%g" % (2.5 * ((2 + cores - 1) // cores))
got = suite_env().get("PARTITA_DEADLINE") if os.path.exists(os.path.join(work, "env.txt")) else None
check(run.returncode == 0 and got == want,
      f"deadline: PARTITA_DEADLINE=2.5 under --nodes 2: exit {run.returncode}, the suite saw {got!r}, "
      f"expected {want!r}:\n{lines(run)}")
run = conformance(["--suites", m], env={"PARTITA_DEADLINE": "ten"})
check(run.returncode == 2 and "PARTITA_DEADLINE='ten' is not a number of seconds" in run.stderr,
      f"deadline: PARTITA_DEADLINE=ten: exit {run.returncode}, expected 2 and a message:\n{lines(run)}")

# rerun and xml
report = os.path.join(work, "report.xml")
if os.path.exists(report):
    os.remove(report)
m = manifest("failing", [{"name": "fails", "binary": suite, "ranks": [1]}])
run = conformance(["--suites", m, "--junit", report], mode="fail", env={"PARTITA_DEADLINE": "7"})
ran_with = suite_env()
root = None
try:
    root = ET.parse(report).getroot()
except Exception as e:  # an unreadable report is the finding
    check(False, f"xml: the JUnit report is not XML: {e}")
if root is not None:
    fail = root.find("testsuite/testcase/failure")
    text = fail.text if fail is not None else ""
    check("\ufffd" in text and "red" in text and "end" in text,
          f"xml: the failure text lost the output around the bad bytes: {text!r}")
    message = fail.get("message", "") if fail is not None else ""
    rerun = message.split("rerun: ", 1)[1] if "rerun: " in message else ""
    for word in ("PARTITA_DEADLINE=7 ", "PARTITA_WAIT_TIMEOUT=30 ", "RC_PARAMS=", "seed="):
        check(word in rerun, f"rerun: the rerun command lacks {word!r}: {rerun!r}")
    check("rerun: " + rerun in run.stdout, "rerun: stdout does not print the rerun command")
    if rerun:
        os.remove(os.path.join(work, "env.txt"))
        again = subprocess.run(["sh", "-c", rerun], capture_output=True,
                               env=dict(os.environ, FAKE_MODE="fail", FAKE_DIR=work))
        check(suite_env() == ran_with,
              f"rerun: the rerun command gave the suite {suite_env()}, the run {ran_with}")
check(run.returncode == 1, f"rerun: a failing suite: exit {run.returncode}, expected 1")

# report
m = manifest("nostatus", [{"name": "odd_report", "binary": suite, "ranks": [1]}])
run = conformance(["--suites", m], mode="nostatus")
check(run.returncode == 1 and "odd_report" in run.stdout and "is not gtest's" in run.stdout
      and "CONFORMANCE FAILED (1 rows, 1 failed)" in run.stdout,
      f"report: a report without \"status\": exit {run.returncode}, expected 1, the row failed, a summary:\n"
      f"{lines(run)}")

# nothing
m = manifest("two", [{"name": "fake", "binary": suite, "ranks": [1, 2]}])
for args, what in ((["--ranks", "5"], "--ranks 5"), (["--nodes", "3", "--ranks", "2"], "--nodes 3 --ranks 2"),
                   (["--filter", "NoSuch.*"], "--filter matching no test")):
    run = conformance(["--suites", m] + args)
    check(run.returncode == 1 and "CONFORMANCE FAILED: no test ran" in run.stdout,
          f"nothing: {what}: exit {run.returncode}, expected 1 and 'no test ran':\n{lines(run)}")
run = conformance(["--suites", m, "--ranks", "2"])
check(run.returncode == 0 and "CONFORMANCE PASSED" in run.stdout, f"nothing: a run that ran:\n{lines(run)}")

# interrupt
m = manifest("waits", [{"name": "waits", "binary": suite, "ranks": [1]},
                       {"name": "after", "binary": suite, "ranks": [1]}])
pid_file = os.path.join(work, "pid.txt")
if os.path.exists(pid_file):
    os.remove(pid_file)
e = dict(os.environ, FAKE_MODE="wait", FAKE_DIR=work)
proc = subprocess.Popen([partita, "conformance", "--timeout", "60", "--suites", m], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, errors="replace", env=e)
for _ in range(200):
    if os.path.exists(pid_file) and os.path.getsize(pid_file) > 0:
        break
    time.sleep(0.05)
time.sleep(0.5)
started = time.monotonic()
proc.send_signal(signal.SIGINT)
try:
    out, _ = proc.communicate(timeout=30)
except subprocess.TimeoutExpired:
    proc.kill()
    out, _ = proc.communicate()
took = time.monotonic() - started
check(proc.returncode == 130 and took < 15 and "running after" not in out and "STOPPED by SIGINT" in out,
      f"interrupt: SIGINT: exit {proc.returncode} after {took:.1f} s, expected 130 within 15 s, "
      f"the next suite not run:\n{out[-1500:]}")
try:
    with open(pid_file) as f:
        pid = int(f.read())
    alive = True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        alive = False
    check(not alive, f"interrupt: the suite (pid {pid}) still runs")
    if alive:
        os.kill(pid, signal.SIGKILL)
except (OSError, ValueError) as err:
    check(False, f"interrupt: the suite never started ({err})")

for p in problems:
    print("CONFORMANCE RUNS WRONG:", p)
if problems:
    sys.exit(1)
print("CONFORMANCE RUNS OK: deadline, rerun, xml, report, nothing, interrupt")
