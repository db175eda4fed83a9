#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests (Debian/Ubuntu, run as root, no systemd).
#
#   scripts/slurm/local_cluster.sh start  [STATE_DIR]   install (apt) if needed, start, wait idle
#   scripts/slurm/local_cluster.sh stop   [STATE_DIR]   stop exactly the daemons `start` started
#   scripts/slurm/local_cluster.sh status [STATE_DIR]   sinfo / squeue of the cluster
#   scripts/slurm/local_cluster.sh env    [STATE_DIR]   `export SLURM_CONF=...` for clients
#
# munged, slurmctld and slurmd (and with ACCOUNTING=1 mariadbd + slurmdbd) run as root in the
# background with every file under STATE_DIR (default /tmp/coec-slurm): slurm.conf, gres.conf,
# munge key and socket, spool and state folders, logs, pid files. proctrack/linuxproc and
# task/none (no cgroups), one node with the machine's CPUs and memory (DefMemPerCPU set), in
# partitions `cpu` (default) and `gpu`, with a fake GPU gres (Name=gpu File=/dev/null) so that
# `--gpus=1` jobs are placed. MinJobAge=3600 keeps finished jobs visible to `squeue` (the SLURM
# profile's status command). Clients need SLURM_CONF=STATE_DIR/slurm.conf (see `env`); where
# /etc/slurm/slurm.conf does not exist, /run/slurm/conf is linked to STATE_DIR for the job steps.
#
# Environment: ACCOUNTING=1 also starts MariaDB + slurmdbd (accounting_storage/slurmdbd, so
# `sacct` works); SLURM_PORT (default 6817: slurmctld; +1 slurmd, +2 slurmdbd);
# NO_INSTALL=1 never runs apt-get. Exit status 2: cannot run here (not root, no apt, ...).
set -euo pipefail

cmd=${1:-}
S=${2:-/tmp/coec-slurm}
PORT=${SLURM_PORT:-6817}
NODE=$(hostname -s)

die() { echo "local_cluster: $*" >&2; exit 1; }
cannot() { echo "local_cluster: cannot run here: $*" >&2; exit 2; }

need_packages() {
  local pkgs=(slurmctld slurmd slurm-client munge)
  [ "${ACCOUNTING:-0}" = 1 ] && pkgs+=(slurmdbd mariadb-server)
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "${NO_INSTALL:-0}" = 1 ] && cannot "packages missing (${missing[*]}) and NO_INSTALL=1"
  command -v apt-get >/dev/null || cannot "no apt-get to install ${missing[*]}"
  echo "local_cluster: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || cannot "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || cannot "apt-get install ${missing[*]} failed"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# start a daemon that forks (or is backgrounded here) and wait for its pid file
wait_pid() {
  local f=$1 name=$2
  for _ in $(seq 300); do alive "$f" && return 0; sleep 0.1; done
  die "$name did not start (see $S/$name.log)"
}

write_conf() {
  local cpus mem defmem
  cpus=$(nproc)
  mem=$(free -m | awk '/^Mem:/ {print $2}')
  mem=$(( mem * 9 / 10 ))               # leave room for the OS
  defmem=$(( mem / cpus ))
  mkdir -p "$S"/{spool,state,munge}
  chmod 700 "$S" "$S/munge"
  local acct="AccountingStorageType=accounting_storage/none"
  if [ "${ACCOUNTING:-0}" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$((PORT + 2))
AccountingStoragePass=$S/munge/munge.socket
JobAcctGatherType=jobacct_gather/linux"
  else
    acct="$acct
JobAcctGatherType=jobacct_gather/none"
  fi
  cat > "$S/slurm.conf" <<CONF
# written by scripts/slurm/local_cluster.sh
ClusterName=coec-local
SlurmctldHost=$NODE
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$S/munge/munge.socket
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
EnforcePartLimits=ALL
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
GresTypes=gpu
DefMemPerCPU=$defmem
MinJobAge=3600
$acct
JobCompType=jobcomp/none
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmdSpoolDir=$S/spool
StateSaveLocation=$S/state
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
PlugStackConfig=$S/plugstack.conf
NodeName=$NODE CPUs=$cpus RealMemory=$mem Gres=gpu:1 State=UNKNOWN
PartitionName=cpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$NODE MaxTime=INFINITE State=UP
CONF
  echo "NodeName=$NODE Name=gpu File=/dev/null" > "$S/gres.conf"
  : > "$S/plugstack.conf"
  [ -f "$S/munge/munge.key" ] || { head -c 1024 /dev/urandom > "$S/munge/munge.key"; chmod 400 "$S/munge/munge.key"; }
}

start_accounting() {
  # MariaDB with its data under STATE_DIR, and slurmdbd on top
  local db=$S/mysql
  if [ ! -d "$db/mysql" ]; then
    mkdir -p "$db"
    mariadb-install-db --user=root --datadir="$db" --auth-root-authentication-method=socket \
      >"$S/mariadb-install.log" 2>&1 || die "mariadb-install-db failed (see $S/mariadb-install.log)"
  fi
  mariadbd --user=root --datadir="$db" --socket="$S/mysql.sock" --pid-file="$S/mariadbd.pid" \
    --skip-networking --log-error="$S/mariadbd.log" >/dev/null 2>&1 &
  wait_pid "$S/mariadbd.pid" mariadbd
  for _ in $(seq 100); do mariadb --socket="$S/mysql.sock" -e "select 1" >/dev/null 2>&1 && break; sleep 0.2; done
  cat > "$S/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$S/munge/munge.socket
DbdHost=localhost
DbdPort=$((PORT + 2))
SlurmUser=root
PidFile=$S/slurmdbd.pid
LogFile=$S/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=root
CONF
  # slurmdbd talks to MariaDB through its socket: point the client default at ours
  printf '[client]\nsocket=%s\n' "$S/mysql.sock" > "$S/my.cnf"
  chmod 600 "$S/slurmdbd.conf"
  MYSQL_UNIX_PORT="$S/mysql.sock" slurmdbd   # reads slurmdbd.conf next to $SLURM_CONF
  wait_pid "$S/slurmdbd.pid" slurmdbd
  for _ in $(seq 50); do timeout 5 sacctmgr -i show cluster >/dev/null 2>&1 && break; sleep 0.2; done
  timeout 20 sacctmgr -i add cluster coec-local >/dev/null 2>&1 || true
}

# SLURM commands without SLURM_CONF (the executor's job steps drop every SLURM_* variable) look in
# /etc/slurm, then in /run/slurm/conf (where a configless slurmd keeps its copy): link ours there.
# A link left by a cluster that was killed instead of stopped (its slurmctld is gone, its folder
# perhaps too) is replaced; a live cluster's link or a real folder is never touched.
link_conf() {
  [ -e /etc/slurm/slurm.conf ] && return 0
  if [ -L /run/slurm/conf ]; then
    local cur
    cur=$(readlink /run/slurm/conf)
    if [ "$cur" != "$S" ] && alive "$cur/slurmctld.pid"; then
      cannot "/run/slurm/conf is taken by a running cluster in $cur"
    fi
    rm -f /run/slurm/conf
  elif [ -e /run/slurm/conf ]; then
    cannot "/run/slurm/conf is taken (a configless slurmd?)"
  fi
  mkdir -p /run/slurm
  ln -s "$S" /run/slurm/conf
  echo /run/slurm/conf >"$S/linked"
}

start() {
  [ "$(id -u)" = 0 ] || cannot "not root"
  command -v dpkg-query >/dev/null || cannot "not a Debian system (no dpkg-query)"
  alive "$S/slurmctld.pid" && die "already running in $S (stop it first)"
  local t0=$SECONDS
  need_packages
  write_conf
  export SLURM_CONF=$S/slurm.conf
  link_conf
  munged --force --socket="$S/munge/munge.socket" --key-file="$S/munge/munge.key" \
    --pid-file="$S/munged.pid" --log-file="$S/munged.log" --seed-file="$S/munge/munged.seed"
  wait_pid "$S/munged.pid" munged
  [ "${ACCOUNTING:-0}" = 1 ] && start_accounting
  slurmctld -f "$S/slurm.conf"
  wait_pid "$S/slurmctld.pid" slurmctld
  for _ in $(seq 50); do timeout 5 scontrol ping >/dev/null 2>&1 && break; alive "$S/slurmctld.pid" || break; sleep 0.2; done
  alive "$S/slurmctld.pid" || die "slurmctld exited (see $S/slurmctld.log)"
  slurmd -f "$S/slurm.conf"
  wait_pid "$S/slurmd.pid" slurmd
  for _ in $(seq 300); do
    state=$(timeout 5 sinfo -h -N -n "$NODE" -o %t 2>/dev/null | head -1 || true)
    [ "$state" = idle ] && { echo "local_cluster: up in $S ($((SECONDS - t0)) s): export SLURM_CONF=$S/slurm.conf"; return 0; }
    sleep 0.2
  done
  die "node $NODE not idle (state '${state:-?}'; see $S/slurmctld.log, $S/slurmd.log)"
}

stop() {
  local f pid
  export SLURM_CONF=$S/slurm.conf
  [ -f "$S/slurmctld.pid" ] && scancel --full -u root >/dev/null 2>&1 || true
  for name in slurmd slurmctld slurmdbd mariadbd munged; do
    f=$S/$name.pid
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      echo "local_cluster: stopped $name ($pid)"
    fi
    rm -f "$f"
  done
  if [ -f "$S/linked" ] && [ "$(readlink /run/slurm/conf)" = "$S" ]; then rm -f /run/slurm/conf; fi
  rm -f "$S/linked"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) export SLURM_CONF=$S/slurm.conf; sinfo -N -l; squeue ;;
  env) echo "export SLURM_CONF=$S/slurm.conf" ;;
  *) sed -n '2,8p' "$0" >&2; exit 64 ;;
esac
