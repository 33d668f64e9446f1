#!/usr/bin/env bash
# make test-slurm: a real one-node SLURM cluster on this machine, then the SLURM tests (tests/test_slurm.py).
#
# Root only: installs Debian's slurmctld slurmd slurm-client munge (--no-install-recommends), writes
# /etc/slurm/slurm.conf and gres.conf (the default path: the jobstep plugin strips SLURM_CONF from a job's
# environment), starts munged, slurmctld and slurmd in the foreground of this script (no systemd), runs
# `pytest -m slurm`, and on exit (pass, fail or interrupt) stops exactly the daemons it started, by PID, and removes
# the files it wrote. The node is declared as an 8-GPU node (fake GPUs, SlurmdParameters=config_overrides): the tiny
# study's CPU jobs run on it. Eight more slurmd on the same host (slurmd -N paper<i>, ports 6901-6908) make the
# partition paper8 of 8 such nodes, the paper's topology: its study's requests (8-node training jobs included) are
# tested against it with `sbatch --test-only`, and a 2-node job runs the multi-node launch line on two of them.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
if [ "$(id -u)" != 0 ]; then
  echo "test-slurm: skipped: needs root (installs Debian packages, writes /etc/slurm, starts slurmctld/slurmd)"
  exit 0
fi
MARK="# written by stapo tests/slurm/cluster.sh"
for f in /etc/slurm/slurm.conf /etc/slurm/gres.conf; do
  if [ -e "$f" ] && ! grep -qF "$MARK" "$f"; then
    echo "test-slurm: $f exists and is not ours: refusing to replace a real cluster's config" >&2
    exit 1
  fi
done
for daemon in slurmctld slurmd munged; do
  if pgrep -x "$daemon" >/dev/null; then
    echo "test-slurm: a $daemon is already running (pid $(pgrep -x "$daemon" | tr '\n' ' ')): stop it first" >&2
    exit 1
  fi
done

PKGS="slurmctld slurmd slurm-client munge"
if ! dpkg -s $PKGS >/dev/null 2>&1; then
  t0=$SECONDS
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS; } \
    > /tmp/stapo-slurm-apt.log 2>&1 || { tail -n 20 /tmp/stapo-slurm-apt.log; exit 1; }
  echo "test-slurm: installed $PKGS in $((SECONDS - t0)) s"
fi

WORK=$(mktemp -d /tmp/stapo-slurm.XXXXXX)
PIDS=()
cleanup() {
  rc=$?
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do  # slurmd, slurmctld, then munged
    pid=${PIDS[i]}
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -0 "$pid" 2>/dev/null && { echo "test-slurm: pid $pid ignored SIGTERM: SIGKILL"; kill -KILL "$pid"; }
    fi
    wait "$pid" 2>/dev/null || true
  done
  left=""
  for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && left+=" $pid"; done
  echo "test-slurm: stopped the daemons it started (pids ${PIDS[*]:-none})${left:+; STILL RUNNING:$left}"
  rm -f /etc/slurm/slurm.conf /etc/slurm/gres.conf
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

NODE=$(hostname -s)
mkdir -p "$WORK"/{state,spool,log} /run/munge /etc/slurm
chown munge:munge /run/munge
cat > /etc/slurm/slurm.conf <<CONF
$MARK
ClusterName=stapo-test
SlurmctldHost=$NODE
SlurmUser=root
AuthType=auth/munge
# A requeued job waits cred_expire + 1 s before it may start again (SLURM 22.05; later: SchedulerParameters=
# requeue_delay): 120 s by default, 10 s here so that a continued run's jobs follow each other quickly
AuthInfo=cred_expire=10
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool/%n
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd-%n.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
MpiDefault=none
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
SchedulerType=sched/backfill
MinJobAge=300
# An 8-GPU node as clusters have them (the machine itself has no GPU: config_overrides keeps these figures)
NodeName=$NODE CPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=1000000 Gres=gpu:8 State=UNKNOWN
PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
# A real wall-time limit of 2 minutes: training runs continued over several jobs (tests/test_slurm.py)
PartitionName=short Nodes=$NODE MaxTime=2 State=UP
# The paper's topology, 8 nodes of 8 GPUs, in their own partition: 8 more slurmd on this host (slurmd -N, each
# on its own port), so that sbatch --test-only sees 8 live nodes and a job step can span two of them.
NodeName=paper[1-8] NodeHostname=$NODE NodeAddr=127.0.0.1 Port=[6901-6908] CPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=1000000 Gres=gpu:8 State=UNKNOWN
PartitionName=paper8 Nodes=paper[1-8] MaxTime=INFINITE State=UP
CONF
# Fake GPUs: 8 character devices with /dev/null's numbers (gres/gpu wants device files; nothing opens them).
mkdir -p "$WORK/dev"
for i in $(seq 0 7); do mknod "$WORK/dev/gpu$i" c 1 3; done
cat > /etc/slurm/gres.conf <<CONF
$MARK
NodeName=$NODE Name=gpu File=$WORK/dev/gpu[0-7]
NodeName=paper[1-8] Name=gpu File=$WORK/dev/gpu[0-7]
CONF

setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground > "$WORK/log/munged.out" 2>&1 & PIDS+=($!)
for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.2; done
/usr/sbin/slurmctld -D > "$WORK/log/slurmctld.out" 2>&1 & PIDS+=($!)
/usr/sbin/slurmd -D > "$WORK/log/slurmd.out" 2>&1 & PIDS+=($!)
for i in $(seq 1 8); do /usr/sbin/slurmd -D -N "paper$i" > "$WORK/log/slurmd-paper$i.out" 2>&1 & PIDS+=($!); done
echo "test-slurm: started munged, slurmctld, slurmd (pids ${PIDS[*]}); logs in $WORK/log"
for _ in $(seq 60); do
  state=$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 1
done
if [ "$state" != idle ]; then
  echo "test-slurm: node $NODE is '${state:-unreachable}', not idle, after 60 s" >&2
  tail -n 20 "$WORK"/log/*.log "$WORK"/log/*.out >&2 || true
  exit 1
fi
sinfo

# The tests (or, for development, any command: tests/slurm/cluster.sh sleep 3600 keeps the cluster up).
export STAPO_TEST_SLURM_PARTITION=gpu STAPO_TEST_SLURM_NODE=$NODE STAPO_TEST_SLURM_PAPER_PARTITION=paper8 \
  STAPO_TEST_SLURM_SHORT_PARTITION=short
if [ $# -gt 0 ]; then
  "$@"
else
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    "$PY" -m pytest -q -rP -m slurm -p no:cacheprovider tests/test_slurm.py  # -rP: the measured figures
fi
