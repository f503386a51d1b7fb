#!/usr/bin/env bash
# Runs an MPI command over simulated nodes on this machine (docs/testing.md,
# "Across simulated nodes").
#
#   tools/simnodes.sh [--nodes N] [--ranks-per-node K] [--netns] [--no-finalize]
#                     [--timeout SECONDS] [--mpiexec PATH] -- COMMAND [ARG...]
#
# starts COMMAND as one MPI job of N x K ranks with MPICH's launcher, told
# that the job has N hosts node0 ... node{N-1} of K ranks each and that it
# reaches them by ssh; the "ssh" is tools/simnodes-exec.sh, which starts each
# host's proxy (and so its K ranks) in namespaces of its own: its own
# hostname, its own /dev/shm (a private tmpfs), its own System V IPC, and,
# with --netns, its own network namespace, joined to the others and to the
# launcher by a veth pair on a bridge (10.200.0.0/24), so that traffic
# between nodes goes through a network interface, not the loopback. The
# hostnames resolve through a private /etc/hosts.
#
# --no-finalize preloads into every rank an MPI_Finalize that skips MPI's
# shutdown but finalizes the rank's PMI connection, so that the launcher
# takes its exit status (tools/simnodes_no_finalize.c, compiled with
# ${CC:-cc} at start, preloaded as /proc/1/fd/9 whatever $TMPDIR holds): with
# MPICH 4.0.2 and UCX 1.13, a job whose ranks talk over TCP hangs in
# MPI_Finalize in some runs, one rank waiting for a peer that already waits
# in Hydra's final barrier. The exit status is still the program's.
#
# Everything runs inside namespaces this script makes (mount, UTS, IPC, PID,
# and with --netns network): the mounts, interfaces and network namespaces
# of the nodes exist only there. On exit, failure, the timeout or a signal
# the script removes them; and should it itself be killed outright, the
# kernel ends every process of the job with the PID namespace and frees the
# rest with the namespaces. Nothing is changed outside, but for an empty
# directory under $TMPDIR (the mount point of the job's private tmpfs)
# while the job runs.
#
# Exit status: COMMAND's (as mpiexec reports it); 255 when a node was lost
# (its link down: the launcher is ended once no node is left running); 124 when the timeout
# (default 600 s) ended the job; 143, 130 or 129 when the launcher was sent
# SIGTERM, SIGINT or SIGHUP; 77 when namespaces cannot be made here (not
# root): callers treat that as skipped (ctest's SKIP_RETURN_CODE); 2 for a
# bad command line.
#
# Environment: every variable reaches the ranks, as with mpiexec. The
# simulated nodes share this machine's cores, which partita's automatic
# waiting policy (docs/mpi-runtime.md) cannot see, as it counts the ranks
# of a node only: where N x K ranks outnumber the cores and PARTITA_WAIT is
# unset, it is set to `yield`.
set -euo pipefail
# A signal that stops the launcher is taken from its first line on, and
# passed on by the first stage (below): however early it comes, the job
# ends and is cleaned up. The second stage sets traps of its own. (Until
# the job is started, the first stage forks nothing but the check that
# namespaces can be made: with these traps set, bash 5.2 may spin on a
# SIGINT that comes while it waits for a command substitution.)
stop=""
passed=0
if [ "${1:-}" != --inside ]; then
  trap 'stop=TERM; passed=0' TERM
  trap 'stop=INT; passed=0' INT
  trap 'stop=HUP; passed=0' HUP
fi

nodes=2
per_node=2
netns=0
no_finalize=0
timeout_s=600
mpiexec="${PARTITA_MPIEXEC:-}"
inside=0

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    -N|--nodes) nodes="$2"; shift 2 ;;
    -k|--ranks-per-node) per_node="$2"; shift 2 ;;
    --netns) netns=1; shift ;;
    --no-finalize) no_finalize=1; shift ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --mpiexec) mpiexec="$2"; shift 2 ;;
    --inside) inside=1; shift ;;  # internal: the second stage
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "simnodes: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "simnodes: no command given" >&2; usage; }
case "$nodes$per_node" in *[!0-9]*) echo "simnodes: --nodes and --ranks-per-node take positive integers" >&2; exit 2 ;; esac
if [ "$nodes" -lt 1 ] || [ "$nodes" -gt 200 ] || [ "$per_node" -lt 1 ]; then
  echo "simnodes: --nodes must be 1-200 and --ranks-per-node at least 1" >&2; exit 2
fi
if [ -z "$mpiexec" ]; then
  for name in mpiexec.mpich mpiexec; do
    if hash "$name" 2>/dev/null; then mpiexec="${BASH_CMDS[$name]}"; break; fi
  done
fi
[ -n "$mpiexec" ] || { echo "simnodes: no mpiexec.mpich found (--mpiexec PATH)" >&2; exit 2; }

node_name() { echo "node$1"; }
node_ip() { if [ "$netns" = 1 ]; then echo "10.200.0.$(($1 + 2))"; else echo "127.0.1.$(($1 + 1))"; fi; }
head_ip() { if [ "$netns" = 1 ]; then echo 10.200.0.1; else echo 127.0.0.1; fi; }

# ---------------------------------------------------------------------------
# First stage: check that namespaces can be made, then run the second stage
# inside new ones under the timeout.
if [ "$inside" = 0 ]; then
  stopped() { case "$stop" in TERM) exit 143 ;; INT) exit 130 ;; HUP) exit 129 ;; esac; }
  ns_flags=(-m -u -i -p)
  [ "$netns" = 1 ] && ns_flags+=(-n)
  if ! unshare "${ns_flags[@]}" -f true 2>/dev/null; then
    echo "simnodes: cannot make namespaces here (unshare ${ns_flags[*]} failed: root is needed); skipped" >&2
    exit 77
  fi
  for tool in ip nsenter timeout setpriv; do
    command -v "$tool" >/dev/null || { echo "simnodes: $tool not found; skipped" >&2; exit 77; }
  done
  args=(--nodes "$nodes" --ranks-per-node "$per_node" --timeout "$timeout_s" --mpiexec "$mpiexec")
  [ "$netns" = 1 ] && args+=(--netns)
  [ "$no_finalize" = 1 ] && args+=(--no-finalize)
  stopped  # before anything is started
  # unshare blocks SIGTERM and SIGINT while it waits: this script passes them
  # (and SIGHUP) on to the second stage as SIGTERM (started in the
  # background, it ignores SIGINT), whose trap cleans up; the launcher then
  # ends with the status of the signal it was sent. Should this
  # script be killed outright, unshare gets SIGKILL (setpriv --pdeathsig) and
  # the second stage SIGTERM (--kill-child); and when the second stage, the
  # PID namespace's first process, ends, the kernel ends every other process
  # of the job.
  setpriv --pdeathsig KILL unshare "${ns_flags[@]}" -f --kill-child=SIGTERM --mount-proc \
    bash "${BASH_SOURCE[0]}" --inside "${args[@]}" -- "$@" &
  child=$!
  # The second stage is the first process of a PID namespace: the kernel
  # drops a signal sent to it that it has no handler for, as it has none in
  # its first milliseconds. So the signal is passed on only once the second
  # stage takes SIGTERM (its last trap to be set; or ignores it, cleaning
  # up), and until then it waits here.
  # (Builtins only, no command substitution: see the traps above.)
  pass_on() {
    local kids=() inner key value caught="" ignored=""
    # unshare's one child (the list ends without a newline); where the
    # kernel has no children list (CONFIG_PROC_CHILDREN), the process whose
    # parent it is, from every process's stat line
    if [ -r "/proc/$child/task/$child/children" ]; then
      read -r -a kids 2>/dev/null < "/proc/$child/task/$child/children" || true
    else
      local stat line rest
      for stat in /proc/[0-9]*/stat; do
        read -r line 2>/dev/null < "$stat" || continue
        rest="${line##*) }"   # after "pid (comm) ": state ppid ...
        rest="${rest#* }"
        if [ "${rest%% *}" = "$child" ]; then kids=("${line%% *}"); break; fi
      done
    fi
    inner="${kids[0]:-}"
    [ -n "$inner" ] || return 0
    while read -r key value; do
      case "$key" in SigCgt:) caught="$value" ;; SigIgn:) ignored="$value" ;; esac
    done 2>/dev/null < "/proc/$inner/status" || true
    [ -n "$caught" ] && [ -n "$ignored" ] || return 0
    if (( ((16#$caught | 16#$ignored) >> 14) & 1 )); then  # bit 14: SIGTERM
      kill -TERM "$inner" 2>/dev/null || true
      passed=1
    fi
  }
  set +e
  while :; do
    if [ -n "$stop" ] && [ "$passed" = 0 ]; then
      pass_on
      if [ "$passed" = 0 ]; then
        if ! kill -0 "$child" 2>/dev/null; then wait "$child"; status=$?; break; fi
        sleep 0.02 &
        wait $!
        continue
      fi
    fi
    wait "$child"
    status=$?
    kill -0 "$child" 2>/dev/null || break
  done
  # Told to stop, the launcher says so, whatever the second stage's status
  # (bash 5.2 may end it with 2 when its trap runs while it expands a
  # command substitution; its cleanup has run all the same).
  if [ "$passed" = 1 ]; then stopped; fi
  exit "$status"
fi

# ---------------------------------------------------------------------------
# Second stage: PID 1 of a PID namespace, in mount, UTS, IPC (and network)
# namespaces of its own.
self_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
job=""
state=""
made_links=()
made_netns=()
made_mounts=()

cleanup() {
  # A second signal must not cut the cleanup short.
  trap - EXIT
  trap '' INT TERM HUP
  if [ -n "$job" ] && kill -0 "$job" 2>/dev/null; then
    kill -TERM "$job" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$job" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$job" 2>/dev/null || true
  fi
  # Every other process of the job (the proxies and ranks of the nodes).
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    [ "$p" = 1 ] || [ "$p" = "$$" ] || kill -KILL "$p" 2>/dev/null || true
  done
  local i
  for ((i = ${#made_links[@]} - 1; i >= 0; i--)); do ip link del "${made_links[i]}" 2>/dev/null || true; done
  for ((i = ${#made_netns[@]} - 1; i >= 0; i--)); do umount "${made_netns[i]}" 2>/dev/null || true; done
  for ((i = ${#made_mounts[@]} - 1; i >= 0; i--)); do umount -l "${made_mounts[i]}" 2>/dev/null || true; done
  # The mount point on the host (nothing of the job was written to it).
  [ -z "$state" ] || rmdir "$state" 2>/dev/null || true
}
# The first stage passes a signal on once this stage catches SIGTERM: its
# trap is set after the others, and before the EXIT trap (with which bash
# catches SIGTERM too, to run it).
trap 'exit 130' INT
trap 'exit 129' HUP
trap 'exit 143' TERM
trap cleanup EXIT

# A private tmpfs for the job's files, and a private /etc/hosts.
state="$(mktemp -d "${TMPDIR:-/tmp}/simnodes.XXXXXX")"
made_mounts+=("$state")  # before the mount: a signal right after it must not leave the mount point busy
mount -t tmpfs -o size=16m,mode=0755 simnodes "$state"
mkdir -p "$state/netns"
hostname simnodes-head
{
  echo "127.0.0.1 localhost"
  echo "$(head_ip) simnodes-head"
  for ((i = 0; i < nodes; i++)); do echo "$(node_ip "$i") $(node_name "$i")"; done
} > "$state/hosts"
mount --bind "$state/hosts" /etc/hosts
made_mounts+=(/etc/hosts)

: > "$state/nodes"
if [ "$netns" = 1 ]; then
  ip link set lo up
  ip link add simnodes0 type bridge
  made_links+=(simnodes0)
  ip addr add "$(head_ip)/24" dev simnodes0
  ip link set simnodes0 up
fi
for ((i = 0; i < nodes; i++)); do
  name="$(node_name "$i")"
  if [ "$netns" = 1 ]; then
    # The node's network namespace, kept by a bind mount on a file of the
    # job's tmpfs; its end of the veth pair is its eth0.
    file="$state/netns/$name"
    : > "$file"
    unshare --net="$file" true
    made_netns+=("$file")
    nsenter --net="$file" ip link add eth0 type veth peer name "sn-$name" netns 1
    made_links+=("sn-$name")
    ip link set "sn-$name" master simnodes0
    ip link set "sn-$name" up
    nsenter --net="$file" ip link set lo up
    nsenter --net="$file" ip addr add "$(node_ip "$i")/24" dev eth0
    nsenter --net="$file" ip link set eth0 up
    echo "$name $file" >> "$state/nodes"
  else
    echo "$name -" >> "$state/nodes"
  fi
done

hosts=""
for ((i = 0; i < nodes; i++)); do hosts+="${hosts:+,}$(node_name "$i"):$per_node"; done
total=$((nodes * per_node))
# The machine's online cores, as partita counts them; not nproc, which
# answers OMP_NUM_THREADS instead when that is set (as the tests set it).
cores="$(getconf _NPROCESSORS_ONLN)"
if [ -z "${PARTITA_WAIT:-}" ] && [ "$total" -gt "$cores" ]; then
  export PARTITA_WAIT=yield
fi
export SIMNODES_STATE="$state"
if [ "$no_finalize" = 1 ]; then
  "${CC:-cc}" -shared -fPIC -O1 -o "$state/no_finalize.so" "$self_dir/simnodes_no_finalize.c"
  # LD_PRELOAD splits its list at spaces and colons, which $TMPDIR may hold:
  # the ranks preload the library through this stage's descriptor 9 on it,
  # /proc/1/fd/9 (this stage is the first process of their PID namespace,
  # and keeps the descriptor while the job runs; the job does not inherit it).
  exec 9<"$state/no_finalize.so"
  # A program built with AddressSanitizer (tools/sanitize.sh) refuses to
  # start unless the sanitizer's runtime comes first among the preloads.
  asan=""
  for arg in "$@"; do
    if [ -f "$arg" ] && [ -x "$arg" ]; then
      asan="$(ldd "$arg" 2>/dev/null | awk '/libasan/ {print $3; exit}')"
      [ -n "$asan" ] && break
    fi
  done
  set -- env "LD_PRELOAD=${asan:+$asan:}/proc/1/fd/9${LD_PRELOAD:+:$LD_PRELOAD}" "$@"
fi

SECONDS=0
timeout -k 10 "$timeout_s" "$mpiexec" -launcher ssh -launcher-exec "$self_dir/simnodes-exec.sh" \
  -hosts "$hosts" -n "$total" "$@" 9<&- &
job=$!
# MPICH's launcher waits for a node whose connection is lost until TCP gives
# up on it (many minutes). Once every node's proxy has ended or been lost
# (simnodes-exec.sh marks them under $state/proxies), and at least one was
# lost, nothing is left to wait for: the launcher is ended, as a cluster's
# resource manager ends a job step on a failed node.
set +e
while :; do
  sleep 0.5 &
  tick=$!
  finished=""
  wait -n -p finished "$job" "$tick"
  status=$?
  if [ "$finished" = "$job" ]; then
    kill "$tick" 2>/dev/null || true
    wait "$tick" 2>/dev/null || true  # (quietly: no "Terminated" line)
    break
  fi
  if compgen -G "$state/proxies/*.lost" >/dev/null && ! compgen -G "$state/proxies/*.running" >/dev/null; then
    lost="$(cd "$state/proxies" && ls -- *.lost | sed 's/\..*//' | sort -u | tr '\n' ' ')"
    echo "simnodes: every node's proxy has ended or been lost (lost: ${lost% }); ending the launcher" >&2
    kill -TERM "$job" 2>/dev/null
    sleep 2 & wait $!
    kill -KILL "$job" 2>/dev/null
    wait "$job"
    status=255
    break
  fi
done
set -e
job=""
# 124: the timeout's SIGTERM ended mpiexec; 137: mpiexec had not ended
# 10 s later (its proxies unreachable) and SIGKILL did.
if { [ "$status" = 124 ] || [ "$status" = 137 ]; } && [ "$SECONDS" -ge "$timeout_s" ]; then
  echo "simnodes: the job did not end within ${timeout_s} s (--timeout); ended" >&2
  status=124
fi
exit "$status"
