#!/usr/bin/env bash
# The "ssh" of tools/simnodes.sh: MPICH's launcher runs
#
#   simnodes-exec.sh [ssh options] HOST COMMAND...
#
# to start its proxy on HOST. This drops the options, finds HOST among the
# job's simulated nodes ($SIMNODES_STATE/nodes) and runs COMMAND as ssh's
# remote shell would (`sh -c "COMMAND..."`), in new mount, UTS and IPC
# namespaces, with HOST as hostname and a private tmpfs on /dev/shm, and in
# HOST's network namespace (with /sys showing its interfaces) when the job
# has them.
set -euo pipefail

while [ $# -gt 0 ]; do
  case "$1" in
    -[1246AaCfGgKkMNnqsTtVXxYy]*) shift ;;      # ssh flags without a value
    -[BbcDEeFIiJLlmOopQRSWw]) shift 2 ;;        # ssh options with a value
    -*) shift ;;
    *) break ;;
  esac
done
host="${1:?simnodes-exec: no host given}"
shift
state="${SIMNODES_STATE:?simnodes-exec: SIMNODES_STATE is not set (run through tools/simnodes.sh)}"
netns=""
found=0
while read -r name file; do
  if [ "$name" = "$host" ]; then
    found=1
    [ "$file" = "-" ] || netns="$file"
  fi
done < "$state/nodes"
if [ "$found" = 0 ]; then
  echo "simnodes-exec: $host is not a node of this job ($(cut -d' ' -f1 "$state/nodes" | tr '\n' ' '))" >&2
  exit 255
fi

# The node: a shell in new namespaces sets them up, then becomes COMMAND.
node_setup='
  set -e
  hostname "$1"
  mount -t tmpfs -o mode=1777 "simnodes-shm-$1" /dev/shm
  if [ -n "$2" ]; then mount -t sysfs "simnodes-sys-$1" /sys; fi
  shift 2
  exec sh -c "$*"
'
if [ -n "$netns" ]; then
  # Like ssh with ServerAliveInterval=1 and ServerAliveCountMax=3: while the
  # node runs, its link (the bridge's end of its veth pair) is checked once
  # a second; down three times running, the connection is lost, and this
  # "ssh" ends with ssh's status for it, 255, so that MPICH's launcher stops
  # waiting for the node. The node's processes follow it (its proxy by
  # PR_SET_PDEATHSIG); so do they when the launcher kills this process.
  setpriv --pdeathsig KILL nsenter --net="$netns" unshare -m -u -i sh -c "$node_setup" node "$host" "$netns" "$@" <&0 &
  node=$!
  trap 'kill -TERM "$node" 2>/dev/null' TERM INT HUP
  # What became of the node, for tools/simnodes.sh: running, ended or lost.
  mark="$state/proxies/$host.$$"
  mkdir -p "$state/proxies"
  : > "$mark.running"
  trap 'mv -f "$mark.running" "$mark.${outcome:-ended}" 2>/dev/null || true' EXIT
  down=0
  while :; do
    if ip -o link show "sn-$host" 2>/dev/null | grep -q LOWER_UP; then down=0; else down=$((down + 1)); fi
    if [ "$down" -ge 3 ]; then
      echo "simnodes-exec: lost the connection to $host (its link is down)" >&2
      outcome=lost
      exit 255
    fi
    sleep 1 &
    tick=$!
    finished=""
    status=0
    wait -n -p finished "$node" "$tick" || status=$?
    if [ "$finished" = "$node" ]; then
      kill "$tick" 2>/dev/null || true
      exit "$status"
    fi
  done
else
  exec unshare -m -u -i sh -c "$node_setup" node "$host" "" "$@"
fi
