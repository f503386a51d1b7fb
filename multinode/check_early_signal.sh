#!/usr/bin/env bash
# A SIGTERM or SIGINT that reaches the simulated-node launcher however early
# ends the job (status 143 or 130) within seconds, and leaves nothing behind:
# no process of the job, no mount point under $TMPDIR, no mount or
# interface of its making.
#
#  - frozen: the launcher's second stage (the first process of the job's
#    PID namespace) is stopped (SIGSTOP) as soon as it exists, before its
#    traps are set; the launcher is sent the signal, and the second stage
#    continued half a second later. The kernel drops a signal sent to that
#    process while it has no handler for it: the launcher must hold the
#    signal until it can be taken;
#  - at 0, 10, 30 and 60 ms after the launcher starts, unhindered.
#
#   check_early_signal.sh path/to/simnodes.sh
set -u
launcher="$1"
tmp="${TMPDIR:-/tmp}"
failed=0
fail() { echo "check_early_signal: FAIL $*" >&2; failed=1; }

mount_points() { find "$tmp" -maxdepth 1 -name 'simnodes.*' 2>/dev/null | wc -l; }
before="$(mount_points)"
marker="simnodes-early-signal-$$"

# The job's processes are gone (the kernel ends a PID namespace's processes
# soon after its first one), and nothing else is left.
left_behind() {  # $1: the case, $2: the job's marker
  local procs="" i
  for i in $(seq 30); do
    procs="$(pgrep -f "$2" || true)"
    [ -n "$procs" ] || break
    sleep 0.1
  done
  [ -z "$procs" ] || { fail "$1: processes of the job are left: $procs"; kill -KILL $procs 2>/dev/null; }
  [ "$(mount_points)" = "$before" ] || fail "$1: a mount point is left under $tmp"
  ! grep -q simnodes /proc/self/mountinfo || fail "$1: a mount is left"
  ! ip -o link | grep -q 'simnodes\|sn-node' || fail "$1: an interface is left"
}

# Waits up to 10 s for the launcher (pid $1) to end; its status in $status.
status=""
await() {
  local i
  for i in $(seq 100); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$1" 2>/dev/null; then
    status=running
    return 1
  fi
  wait "$1"
  status=$?
}

# The launcher in a process group of its own (job control on while it
# starts), so that it takes SIGINT as from a terminal: started in the
# background without job control, it would ignore it.
start() {  # $1: the job's marker; the launcher's pid in $job
  set -m
  "$launcher" --nodes 2 --ranks-per-node 1 --netns --timeout 20 -- \
    bash -c "while :; do :; done # $1" >/dev/null 2>&1 &
  job=$!
  set +m
}

expected() { case "$1" in TERM) echo 143 ;; INT) echo 130 ;; esac; }

# The second stage: the child of the launcher's unshare whose command line
# holds --inside (before or after its exec of bash). Builtins only, to catch
# it in its first milliseconds.
second_stage() {  # $1: the launcher's pid
  local kids=() grandkids k g args
  # (the lists end without a newline: read's status says nothing)
  read -r -a kids < "/proc/$1/task/$1/children" 2>/dev/null
  for k in "${kids[@]}"; do
    grandkids=()
    read -r -a grandkids < "/proc/$k/task/$k/children" 2>/dev/null
    for g in "${grandkids[@]}"; do
      mapfile -d '' args < "/proc/$g/cmdline" 2>/dev/null || continue
      case " ${args[*]} " in *" --inside "*) echo "$g"; return 0 ;; esac
    done
  done
  return 1
}

sigterm_caught() {  # $1: pid; whether its SIGTERM has a handler
  local caught
  caught="$(awk '/^SigCgt:/ {print $2}' "/proc/$1/status" 2>/dev/null)"
  [ -n "$caught" ] && (( (16#$caught >> 14) & 1 ))
}

# Skipped where namespaces cannot be made.
"$launcher" --nodes 1 --ranks-per-node 1 --netns --timeout 10 -- true >/dev/null 2>&1
[ "$?" != 77 ] || { echo "check_early_signal: no namespaces here; skipped" >&2; exit 77; }

caught_early=0

# The job ended within 10 s of SIG$2 with its status, and left nothing
# ($1: the case's name, $3: the job's marker).
expect_end() {
  if ! await "$job"; then
    fail "$1: the launcher still runs 10 s after SIG$2 (the signal was lost)"
    kill -TERM "$job" 2>/dev/null; await "$job"
  elif [ "$status" != "$(expected "$2")" ]; then
    fail "$1: exit status $status, expected $(expected "$2")"
  fi
  left_behind "$1" "$3"
}
for sig in TERM INT; do
  name="frozen $sig"
  start "$marker-frozen-$sig"
  inner=""
  SECONDS=0
  until inner="$(second_stage "$job")" || [ "$SECONDS" -ge 5 ]; do :; done
  if [ -z "$inner" ]; then
    fail "$name: the launcher's second stage did not appear within 5 s"
    kill -TERM "$job" 2>/dev/null; await "$job"
    continue
  fi
  kill -STOP "$inner"
  if sigterm_caught "$inner"; then
    echo "check_early_signal: $name: the second stage had set its traps already" >&2
  else
    caught_early=$((caught_early + 1))
  fi
  kill -s "$sig" "$job"
  sleep 0.5
  kill -CONT "$inner"
  expect_end "$name" "$sig" "$marker-frozen-$sig"
done

for delay in 0 0.01 0.03 0.06; do
  for sig in TERM INT; do
    name="SIG$sig after $delay s"
    start "$marker-$delay-$sig"
    sleep "$delay"
    kill -s "$sig" "$job"
    expect_end "$name" "$sig" "$marker-$delay-$sig"
  done
done

if [ "$failed" = 0 ]; then
  echo "check_early_signal: every early SIGTERM and SIGINT ended the job, nothing left" \
       "(the second stage stopped before its traps in $caught_early of 2)"
fi
exit "$failed"
