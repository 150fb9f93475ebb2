#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, to try the Slurm path (sweeps through
# hydra/launcher=slurm, preemption and requeue, DDP with Slurm tasks) and for the slurm-marked tests.
#
#   sudo scripts/slurm/local_cluster.sh up      # prints the line to export; a few seconds (plus the install)
#   sudo scripts/slurm/local_cluster.sh down    # stops what `up` started (by PID)
#   scripts/slurm/local_cluster.sh status
#
# Needs root and Debian's packages (installed by `up` when missing and apt-get is there):
# slurmctld slurmd slurm-client slurmdbd munge mariadb-server. Everything it writes lives in one
# state dir ($TRAINER_SLURM_DIR, default /tmp/trainer-slurm): its own slurm.conf (SLURM_CONF points
# at it; /etc/slurm is not touched), its own MariaDB data dir on 127.0.0.1 for accounting, logs and
# PID files. Non-default ports (69xx), so a real Slurm on the machine is left alone. munged is
# started only if none is running (the system's /etc/munge/munge.key, created if missing).
#
# What the settings are for (found by running it here):
#   accounting (slurmdbd): without it, submitit waits forever on a job that died without a result
#   GraceTime on the preemptible partition: else Slurm's requeue races submitit's own
#   AuthInfo=cred_expire=5: a requeued job starts again after ~6 s instead of 120 s
#   sched_interval=2,bf_interval=2: a job starts within 2 s
#   partition priority preemption: a job in `high` requeues the jobs of `debug` (the default)
set -euo pipefail

STATE="${TRAINER_SLURM_DIR:-/tmp/trainer-slurm}"
CONF="$STATE/slurm.conf"
PORT_BASE="${TRAINER_SLURM_PORT_BASE:-6917}"   # slurmctld, slurmd, slurmdbd; MariaDB on +10
PACKAGES="slurmctld slurmd slurm-client slurmdbd munge mariadb-server"

die() { echo "local_cluster: $*" >&2; exit 1; }

start() {  # start NAME CMD...: run in the background, log to STATE/NAME.log, remember the PID
  local name=$1; shift
  "$@" >"$STATE/$name.log" 2>&1 &
  echo $! >"$STATE/$name.pid"
}

wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local seconds=$1 what=$2; shift 2
  for _ in $(seq $((seconds * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "$what did not come up within ${seconds} s; see the logs in $STATE"
}

install_packages() {
  local missing=()
  for cmd in slurmctld slurmd slurmdbd sbatch munged mariadbd; do
    command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$cmd")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and no apt-get to install them ($PACKAGES)"
  echo "local_cluster: installing $PACKAGES" >&2  # stdout carries only the export line
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $PACKAGES >/dev/null
}

write_configs() {
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
  mkdir -p "$STATE/spool" "$STATE/ctld"
  cat >"$CONF" <<EOF
# written by scripts/slurm/local_cluster.sh: a one-node test cluster
ClusterName=trainer
SlurmctldHost=$host
SlurmctldPort=$PORT_BASE
SlurmdPort=$((PORT_BASE + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.daemon.pid
SlurmdPidFile=$STATE/slurmd.daemon.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
KillWait=30
MinJobAge=300
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$((PORT_BASE + 2))
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=5
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10
EOF
  cat >"$STATE/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdPort=$((PORT_BASE + 2))
SlurmUser=root
PidFile=$STATE/slurmdbd.daemon.pid
LogFile=$STATE/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((PORT_BASE + 10))
StorageUser=root
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$STATE/slurmdbd.conf"
}

start_munge() {
  if pgrep -x munged >/dev/null 2>&1; then return 0; fi
  if [ ! -f /etc/munge/munge.key ]; then
    /usr/sbin/mungekey --create >/dev/null 2>&1 || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge && chown munge:munge /run/munge
  start munged runuser -u munge -- /usr/sbin/munged --foreground
  wait_for 10 munged munge -n
}

start_mariadb() {
  local datadir="$STATE/mysql" port=$((PORT_BASE + 10))
  if [ ! -d "$datadir/mysql" ]; then
    mariadb-install-db --no-defaults --datadir="$datadir" --user=root --auth-root-authentication-method=normal >"$STATE/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed; see $STATE/mariadb-install.log"
  fi
  start mariadb /usr/sbin/mariadbd --no-defaults --datadir="$datadir" --user=root --bind-address=127.0.0.1 --port="$port" \
    --socket="$STATE/mysql.sock" --pid-file="$STATE/mariadb.daemon.pid" --skip-log-error
  wait_for 30 MariaDB mariadb --no-defaults -h 127.0.0.1 -P "$port" -u root -e "select 1"
}

up() {
  [ "$(id -u)" = 0 ] || die "needs root (the daemons run as root on this test cluster)"
  if status >/dev/null 2>&1; then echo "export SLURM_CONF=$CONF"; return 0; fi
  local t0=$SECONDS
  BRINGING_UP=1
  install_packages
  mkdir -p "$STATE"
  write_configs
  start_munge
  start_mariadb
  # slurmdbd reads slurmdbd.conf from the dir of SLURM_CONF
  start slurmdbd env SLURM_CONF="$CONF" /usr/sbin/slurmdbd -D
  wait_for 30 slurmdbd bash -c "exec 3<>/dev/tcp/127.0.0.1/$((PORT_BASE + 2))"
  start slurmctld /usr/sbin/slurmctld -D -c -f "$CONF"   # -c: no jobs left over from an earlier cluster
  wait_for 30 slurmctld env SLURM_CONF="$CONF" scontrol ping
  start slurmd /usr/sbin/slurmd -D -f "$CONF"
  wait_for 60 "the node" bash -c "SLURM_CONF='$CONF' sinfo -h -N -o %t | grep -qx idle"
  BRINGING_UP=0
  echo "local_cluster: up in $((SECONDS - t0)) s ($(nproc) CPUs, partitions debug (default, preemptible) and high)" >&2
  echo "export SLURM_CONF=$CONF"
}

down() {
  local name pid
  for name in slurmd slurmctld slurmdbd mariadb munged; do
    [ -f "$STATE/$name.pid" ] || continue
    pid=$(cat "$STATE/$name.pid")
    # only a process this script started (a stale PID file may name someone else's by now)
    if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -e "$name" -e "runuser"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/$name.pid"
  done
  echo "local_cluster: down" >&2
}

status() {
  [ -f "$CONF" ] || { echo "no cluster configured in $STATE"; return 1; }
  SLURM_CONF="$CONF" sinfo -h -N -o "%N %t %c" && SLURM_CONF="$CONF" scontrol ping | head -1
}

case "${1:-}" in
  # a bring-up that fails half-way stops what it started
  up) trap '[ "${BRINGING_UP:-0}" = 1 ] && down' EXIT; up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
