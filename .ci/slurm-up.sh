#!/usr/bin/env bash
# Start a single-node Slurm on this machine for babysit's `pytest -m slurm` tests.
#
# Debian's slurmctld + slurmd + munge, one partition ("debug") holding this host, no accounting
# daemon (so babysit's no-sacct path is what CI exercises) and jobcomp/filetxt so finished jobs
# leave a line after they age out of slurmctld. Runs as root on a fresh Debian 12; idempotent: a
# second run rewrites the same config, leaves running daemons alone and only waits for "idle".
# Exit 0: `sinfo` says the node is idle. Exit non-zero: the reason is printed last.
set -euo pipefail

die() { echo "slurm-up: FAILED: $*" >&2; exit 1; }
say() { echo "slurm-up: $*"; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

host=$(hostname -s)
conf=/etc/slurm/slurm.conf

# -- packages ---------------------------------------------------------------------------------------
need=()
for bin in slurmctld slurmd sinfo munged; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need+=("$bin")
done
if [ "${#need[@]}" -gt 0 ]; then
  say "installing slurmctld slurmd slurm-client munge (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed (network or sources.list?)"
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
    || die "apt-get install slurmctld slurmd slurm-client munge failed"
fi
export PATH="$PATH:/usr/sbin:/sbin"

# -- munge ------------------------------------------------------------------------------------------
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  say "creating /etc/munge/munge.key"
  if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --keyfile=/etc/munge/munge.key --force
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  runuser -u munge -- /usr/sbin/munged --force || die "munged did not start (see /var/log/munge/munged.log)"
  for _ in $(seq 1 20); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
  munge -n </dev/null | unmunge >/dev/null || die "munge does not round-trip a credential"
fi

# -- slurm.conf -------------------------------------------------------------------------------------
mem_total=$(free -m | awk '/^Mem:/ {print $2}')
real_mem=$(( mem_total > 2048 ? mem_total - 1024 : mem_total * 3 / 4 ))  # leave the OS a margin
install -d -m 0755 /etc/slurm /var/log/slurm /run/slurm
install -d -o slurm -g slurm -m 0755 /var/spool/slurmctld /var/spool/slurmd 2>/dev/null \
  || install -d -m 0755 /var/spool/slurmctld /var/spool/slurmd
touch /var/log/slurm/jobcomp.txt
chown slurm:slurm /var/log/slurm /var/log/slurm/jobcomp.txt 2>/dev/null || true

wanted=$(cat <<EOF
# Written by babysit's .ci/slurm-up.sh: a single-node cluster for tests. Edits are overwritten.
ClusterName=babysit-ci
SlurmctldHost=${host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.txt
MinJobAge=300
KillWait=5
InactiveLimit=0
Waittime=0
SchedulerParameters=sched_interval=2
DefMemPerCPU=512
NodeName=${host} CPUs=$(nproc) RealMemory=${real_mem} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
)
changed=0
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$wanted" ]; then
  printf '%s\n' "$wanted" > "$conf"
  changed=1
  say "wrote $conf (node ${host}: $(nproc) CPUs, ${real_mem} MiB)"
fi
# Debian's slurmd wants cgroup.conf only with cgroup plugins; none are configured here.

# -- daemons ----------------------------------------------------------------------------------------
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if running /run/slurm/slurmctld.pid && [ "$changed" = 1 ]; then
  say "config changed: reconfiguring"
  scontrol reconfigure || true
fi
if ! running /run/slurm/slurmctld.pid; then
  say "starting slurmctld"
  /usr/sbin/slurmctld || die "slurmctld did not start: $(tail -n 5 /var/log/slurm/slurmctld.log 2>/dev/null)"
fi
if ! running /run/slurm/slurmd.pid; then
  say "starting slurmd"
  /usr/sbin/slurmd || die "slurmd did not start: $(tail -n 5 /var/log/slurm/slurmd.log 2>/dev/null)"
fi

# -- wait for idle (bounded) ------------------------------------------------------------------------
state=""
for i in $(seq 1 60); do
  state=$(sinfo -h -o %T 2>/dev/null | head -n 1 || true)
  case "$state" in
    idle|mixed|allocated) say "node ${host} is ${state} after ${i} s"; exit 0 ;;
    down*|drain*|fail*)
      # ReturnToService=2 brings a node back once slurmd registers; nudge it once it is up.
      scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 1
done
reason=$(sinfo -h -R 2>/dev/null | head -n 3 || true)
die "node ${host} is '${state:-unknown}' after 60 s, not idle. sinfo -R: ${reason:-none}. Logs: \
$(tail -n 3 /var/log/slurm/slurmctld.log 2>/dev/null | tr '\n' ' ') | $(tail -n 3 /var/log/slurm/slurmd.log 2>/dev/null | tr '\n' ' ')"
