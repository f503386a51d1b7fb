#!/usr/bin/env bash
# The simulated-node launcher's --no-finalize preload works when $TMPDIR
# holds a space or a colon (LD_PRELOAD splits its list there): under such a
# TMPDIR, every rank has the shim mapped and the dynamic loader names no
# object it could not preload, and an MPI job whose ranks close their
# launcher connection after MPI_Finalize (simnodes_check --pmi-closes-first,
# which ends with status 0 only through the shim's PMI finalize) passes.
# Nothing is left under the TMPDIR.
#   check_preload_path.sh path/to/simnodes.sh path/to/simnodes_check
set -u
launcher="$1"
check="$2"
failed=0
fail() { echo "check_preload_path: FAIL $*" >&2; failed=1; }

base="$(mktemp -d "${TMPDIR:-/tmp}/simnodes-preload.XXXXXX")"
trap 'rm -rf "$base"' EXIT
for name in "with space" "with:colon"; do
  dir="$base/$name"
  mkdir -p "$dir"
  out="$(TMPDIR="$dir" "$launcher" --nodes 2 --ranks-per-node 1 --netns --no-finalize --timeout 30 -- \
           bash -c 'grep -q no_finalize.so /proc/$$/maps && echo "preloaded on $(hostname)"' 2>&1)"
  status=$?
  [ "$status" != 77 ] || { echo "check_preload_path: no namespaces here; skipped" >&2; exit 77; }
  [ "$status" = 0 ] || fail "TMPDIR '$dir': exit status $status, expected 0"
  for node in node0 node1; do
    grep -q "preloaded on $node" <<< "$out" || fail "TMPDIR '$dir': the shim is not preloaded on $node"
  done
  ! grep -q "cannot be preloaded" <<< "$out" || fail "TMPDIR '$dir': the dynamic loader could not preload an object"
  out="$(TMPDIR="$dir" "$launcher" --nodes 2 --ranks-per-node 1 --netns --no-finalize --timeout 60 -- \
           "$check" 2 1 --netns --pmi-closes-first 2>&1)"
  status=$?
  [ "$status" = 0 ] || fail "TMPDIR '$dir': simnodes_check --pmi-closes-first: exit status $status, expected 0"
  ! grep -q "cannot be preloaded" <<< "$out" || fail "TMPDIR '$dir': simnodes_check: the dynamic loader could not preload an object"
  [ -z "$(ls -A "$dir")" ] || fail "TMPDIR '$dir': left behind: $(ls -A "$dir")"
  [ "$failed" = 0 ] || printf '%s\n' "$out" >&2
done
[ "$failed" = 0 ] && echo "check_preload_path: --no-finalize preloads its shim under a TMPDIR with a space and with a colon"
exit "$failed"
