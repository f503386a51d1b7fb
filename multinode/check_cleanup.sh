#!/usr/bin/env bash
# The simulated-node launcher leaves nothing behind when a job is ended by
# its --timeout (status 124) or by SIGTERM (status 143): no process of the
# job, no mount point under $TMPDIR, no mount or interface of its making.
#   check_cleanup.sh path/to/simnodes.sh
set -u
launcher="$1"
tmp="${TMPDIR:-/tmp}"
failed=0
fail() { echo "check_cleanup: FAIL $*" >&2; failed=1; }

mount_points() { find "$tmp" -maxdepth 1 -name 'simnodes.*' 2>/dev/null | wc -l; }
left_behind() {  # $1: what ended the job, $2: the job's marker
  sleep 2
  local procs
  procs="$(pgrep -f "$2" || true)"
  [ -z "$procs" ] || fail "$1: processes of the job are left: $procs"
  [ "$(mount_points)" = "$before" ] || fail "$1: a mount point is left under $tmp"
  ! grep -q simnodes /proc/self/mountinfo || fail "$1: a mount is left"
  ! ip -o link | grep -q 'simnodes\|sn-node' || fail "$1: an interface is left"
}

before="$(mount_points)"
# Ranks that never end, each marked so that pgrep finds them.
marker="simnodes-cleanup-check-$$"
"$launcher" --nodes 2 --ranks-per-node 1 --netns --timeout 3 -- \
  bash -c "while :; do :; done # $marker-a" >/dev/null 2>&1
status=$?
[ "$status" != 77 ] || { echo "check_cleanup: no namespaces here; skipped" >&2; exit 77; }
[ "$status" = 124 ] || fail "timeout: exit status $status, expected 124"
left_behind timeout "$marker-a"

"$launcher" --nodes 2 --ranks-per-node 1 --netns --timeout 60 -- \
  bash -c "while :; do :; done # $marker-b" >/dev/null 2>&1 &
job=$!
sleep 3
[ -n "$(pgrep -f "$marker-b" || true)" ] || fail "SIGTERM: the job's ranks did not start"
kill -TERM "$job"
wait "$job"
status=$?
[ "$status" = 143 ] || fail "SIGTERM: exit status $status, expected 143"
left_behind SIGTERM "$marker-b"

[ "$failed" = 0 ] && echo "check_cleanup: nothing left after the timeout and after SIGTERM"
exit "$failed"
