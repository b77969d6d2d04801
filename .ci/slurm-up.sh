#!/usr/bin/env bash
# Start a 6-node Slurm on this one machine for babysit's `pytest -m slurm` tests.
#
# Debian's slurmctld + munge and six slurmd (Debian builds Slurm with MULTIPLE_SLURMD): nodes n1..n6,
# each `NodeHostname` this host, `NodeAddr=127.0.0.1` and its own port, started as `slurmd -N nX`, so
# `srun -N 3` runs one task on each and a node can be lost on its own (kill its slurmd). Partition
# "debug" (the default) holds n1-n3; "faults" holds n4-n6, for the tests that kill a node's slurmd, so
# no other test's job runs where a node is lost on purpose (CI runs tests side by side). Each node
# has 2 stand-in GPUs (gres whose "device files" are empty files in /run/slurm/gpu: Slurm drops a GPU
# without a file) so GPU requests (--gres=gpu:N) are real. No accounting daemon (babysit's no-sacct
# path is what CI exercises); jobcomp/filetxt so finished jobs leave a line after they age out of slurmctld; a node
# silent for SlurmdTimeout (10 s) is DOWN and its jobs end NODE_FAIL, not requeued (babysit
# resubmits). Partition "urgent" (n3 alone, a higher PriorityTier) preempts the jobs it needs room
# from: PreemptMode=REQUEUE requeues a `--requeue` job and ends any other PREEMPTED (the preemption
# tests). Runs as root on a fresh Debian 12; idempotent: a second run rewrites the same config,
# leaves running daemons alone and only waits for "idle"; a changed config restarts the daemons.
# Exit 0: `sinfo` says every node is idle. Exit non-zero: the reason is printed last.
set -euo pipefail

die() { echo "slurm-up: FAILED: $*" >&2; exit 1; }
say() { echo "slurm-up: $*"; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

host=$(hostname -s)
conf=/etc/slurm/slurm.conf
gres_conf=/etc/slurm/gres.conf
nodes=(n1 n2 n3 n4 n5 n6)  # debug: n1-n3, every test's; faults: n4-n6, for tests that kill a node
first_port=17001  # n1's slurmd port; n2 and n3 take the next ones

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
node_mem=$(( real_mem / ${#nodes[@]} ))  # the host's memory shared out, so no node promises it twice
install -d -m 0755 /var/spool/slurmctld /var/spool/slurmd
for n in "${nodes[@]}"; do install -d -m 0755 "/var/spool/slurmd/$n"; done
touch /var/log/slurm/jobcomp.txt
chown slurm:slurm /var/log/slurm /var/log/slurm/jobcomp.txt 2>/dev/null || true

wanted=$(cat <<EOF
# Written by babysit's .ci/slurm-up.sh: a 6-node cluster on one host for tests. Edits are overwritten.
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
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmdSpoolDir=/var/spool/slurmd/%n
StateSaveLocation=/var/spool/slurmctld
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.txt
MinJobAge=300
KillWait=5
InactiveLimit=0
Waittime=0
SlurmdTimeout=10
JobRequeue=0
GresTypes=gpu
SchedulerParameters=sched_interval=2
DefMemPerCPU=512
NodeName=n[1-${#nodes[@]}] NodeHostname=${host} NodeAddr=127.0.0.1 Port=[${first_port}-$(( first_port + ${#nodes[@]} - 1 ))] CPUs=$(nproc) RealMemory=${node_mem} Gres=gpu:2 State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=n[1-3] Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=faults Nodes=n[4-6] MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=n3 MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
)
gres_wanted=$(for n in "${nodes[@]}"; do echo "NodeName=$n Name=gpu File=/run/slurm/gpu/$n-[0-1]"; done)
install -d -m 0755 /run/slurm/gpu
for n in "${nodes[@]}"; do touch "/run/slurm/gpu/$n-0" "/run/slurm/gpu/$n-1"; done
changed=0
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$wanted" ] || [ "$(cat "$gres_conf" 2>/dev/null)" != "$gres_wanted" ]; then
  printf '%s\n' "$wanted" > "$conf"
  printf '%s\n' "$gres_wanted" > "$gres_conf"
  changed=1
  say "wrote $conf and $gres_conf (nodes ${nodes[*]} on ${host}: $(nproc) CPUs, ${node_mem} MiB, 2 GPUs each)"
fi
# Debian's slurmd wants cgroup.conf only with cgroup plugins; none are configured here.

# -- daemons ----------------------------------------------------------------------------------------
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop_pidfile() {  # TERM, wait up to 10 s, KILL; by the pid in the file, never by name
  local pid
  running "$1" || { rm -f "$1"; return 0; }
  pid=$(cat "$1")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  rm -f "$1"
}
if [ "$changed" = 1 ]; then
  # nodes added or renamed: slurmctld must start afresh with the new node table (reconfigure cannot)
  for pidfile in /run/slurm/slurmd.pid /run/slurm/slurmd-*.pid /run/slurm/slurmctld.pid; do
    [ -f "$pidfile" ] || continue
    say "config changed: stopping $(basename "$pidfile" .pid)"
    stop_pidfile "$pidfile"
  done
fi
if ! running /run/slurm/slurmctld.pid; then
  say "starting slurmctld"
  /usr/sbin/slurmctld || die "slurmctld did not start: $(tail -n 5 /var/log/slurm/slurmctld.log 2>/dev/null)"
fi
for n in "${nodes[@]}"; do
  if ! running "/run/slurm/slurmd-$n.pid"; then
    say "starting slurmd -N $n"
    /usr/sbin/slurmd -N "$n" || die "slurmd -N $n did not start: $(tail -n 5 "/var/log/slurm/slurmd-$n.log" 2>/dev/null)"
  fi
done

# -- wait until every node is idle (bounded) --------------------------------------------------------
states=""
for i in $(seq 1 60); do
  states=$(sinfo -h -N -o '%N=%T' 2>/dev/null | sort -u | tr '\n' ' ' || true)
  idle=$(printf '%s' "$states" | tr ' ' '\n' | grep -cE '=(idle|mixed|allocated)$' || true)
  if [ "${idle:-0}" -ge "${#nodes[@]}" ]; then say "nodes ${states}after ${i} s"; exit 0; fi
  for n in "${nodes[@]}"; do
    case "$(sinfo -h -n "$n" -o %T 2>/dev/null)" in
      down*|drain*|fail*)  # ReturnToService=2 brings a node back once slurmd registers; nudge it
        scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true ;;
    esac
  done
  sleep 1
done
reason=$(sinfo -h -R 2>/dev/null | head -n 3 || true)
die "nodes are '${states:-unknown}' after 60 s, not all idle. sinfo -R: ${reason:-none}. Logs: \
$(tail -n 3 /var/log/slurm/slurmctld.log 2>/dev/null | tr '\n' ' ') | $(tail -n 3 /var/log/slurm/slurmd-n1.log 2>/dev/null | tr '\n' ' ')"
