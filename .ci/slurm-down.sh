#!/usr/bin/env bash
# Stop what .ci/slurm-up.sh started: cancel leftover jobs, then every node's slurmd (n1..n3), slurmctld
# and munged, by the pids in their pid files (never by name). Safe to run twice or when nothing runs. Packages and the
# config stay, so the next slurm-up.sh is fast.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

say() { echo "slurm-down: $*"; }

if command -v scancel >/dev/null 2>&1; then
  scancel --quiet --full "--user=$(id -un)" 2>/dev/null || true
fi

stop_pidfile() {  # name pidfile: TERM, wait up to 10 s, then KILL
  local name=$1 file=$2 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file" 2>/dev/null) || return 0
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || { rm -f "$file"; return 0; }
  say "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  rm -f "$file"
}

for pidfile in /run/slurm/slurmd-*.pid /run/slurm/slurmd.pid; do  # the nodes; slurmd.pid: a 1-node cluster's
  [ -f "$pidfile" ] && stop_pidfile "$(basename "$pidfile" .pid)" "$pidfile"
done
stop_pidfile slurmctld /run/slurm/slurmctld.pid
stop_pidfile munged /run/munge/munged.pid
exit 0
