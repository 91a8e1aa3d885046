#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for tests/workflow/test_slurm.py and .ci/run.
#
#   tests/slurm/cluster.sh start    install (Debian: slurmctld slurmd slurm-client munge) if missing,
#                                   write a cgroup-less slurm.conf, start munged/slurmctld/slurmd by
#                                   hand (no systemd), wait until the node is idle and srun works
#   tests/slurm/cluster.sh stop     stop every daemon this script started, by the pid it recorded
#   tests/slurm/cluster.sh status   daemons, sinfo; exit 0 only when the node is up and idle/mixed
#
# Needs root. State, spool, logs and pid files live under $BUDGETGEN_SLURM_DIR (default
# /run/budgetgen-slurm). The config must be /etc/slurm/slurm.conf: a private SLURM_CONF does not
# reach the job's inner `srun` (the plugin's job step drops every SLURM_* variable but the job's
# ids). `start` refuses to overwrite a slurm.conf it did not write; `stop` removes its own, so that
# afterwards SLURM clients fail at once (with a config naming a stopped controller, every snakemake
# start would wait ~10 s in the SLURM plugin's `scontrol show config`).
# A munged that already answers is used as it is and never stopped.
set -euo pipefail

DIR=${BUDGETGEN_SLURM_DIR:-/run/budgetgen-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# Written by tests/slurm/cluster.sh"
CTLD_PORT=${BUDGETGEN_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${BUDGETGEN_SLURM_SLURMD_PORT:-6818}

log() { echo "cluster.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

alive() {  # $1 = pid file; true if it names a live process
  [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

node_state() { sinfo -h -N -o %T 2>/dev/null | head -n1 || true; }

install_packages() {
  local missing=()
  for bin in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch /usr/sbin/munged; do
    [[ -x "$bin" ]] || missing+=("$bin")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing slurmctld slurmd slurm-client munge (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "munged already running; using it"
    return 0
  fi
  if [[ ! -s /etc/munge/munge.key ]]; then  # the Debian postinst normally creates it
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  local _
  for _ in $(seq 40); do
    if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
      cp /run/munge/munged.pid "$DIR/munged.pid"  # ours: stopped by `stop`
      return 0
    fi
    sleep 0.25
  done
  die "munged does not answer (munge -n | unmunge)"
}

write_conf() {
  local hn ncpu mem
  hn=$(hostname -s)
  ncpu=$(nproc)
  mem=$(($(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo) - 1024))
  # the node name must resolve; pin it to loopback
  getent hosts "$hn" >/dev/null || echo "127.0.0.1 $hn" >>/etc/hosts
  if [[ -e "$CONF" ]] && ! grep -qxF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; not touching a real cluster's config"
  fi
  install -d -m 0755 "$(dirname "$CONF")"
  cat >"$CONF.tmp" <<EOF
$MARK
# A one-node test cluster: no cgroups, no accounting. Removed by "cluster.sh stop".
ClusterName=budgetgen-ci
SlurmctldHost=${hn}(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
SlurmUser=slurm
SlurmdUser=root
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
StateSaveLocation=${DIR}/ctld
SlurmdSpoolDir=${DIR}/slurmd
SlurmctldPidFile=${DIR}/run/slurmctld.pid
SlurmdPidFile=${DIR}/run/slurmd.pid
SlurmctldLogFile=${DIR}/log/slurmctld.log
SlurmdLogFile=${DIR}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdTimeout=300
InactiveLimit=0
# keep finished jobs visible to squeue for 5 min: the plugin's squeue status check needs
# MinJobAge >= 3 x its initial status delay, else it silently falls back to sacct (which hangs
# without slurmdbd)
MinJobAge=300
KillWait=30
Waittime=0
NodeName=${hn} NodeAddr=127.0.0.1 CPUs=${ncpu} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.tmp" "$CONF"
}

start() {
  [[ $(id -u) == 0 ]] || die "needs root (it installs packages and starts daemons)"
  if alive "$DIR/run/slurmctld.pid" && alive "$DIR/run/slurmd.pid"; then
    log "already running ($CONF)"
    return 0
  fi
  local t0=$SECONDS _
  install_packages
  # a fresh cluster every time: no job or node state from an earlier run
  rm -rf "$DIR/ctld" "$DIR/slurmd" "$DIR/log" "$DIR/run"
  install -d -m 0755 "$DIR"
  install -d -o slurm -g slurm -m 0755 "$DIR/ctld" "$DIR/log" "$DIR/run"
  install -d -m 0755 "$DIR/slurmd"
  write_conf
  start_munge
  /usr/sbin/slurmctld || { tail -n 30 "$DIR/log/slurmctld.log" >&2 || true; die "slurmctld did not start"; }
  /usr/sbin/slurmd || { tail -n 30 "$DIR/log/slurmd.log" >&2 || true; die "slurmd did not start"; }
  for _ in $(seq 120); do
    [[ $(node_state) == idle ]] && break
    sleep 0.5
  done
  if [[ $(node_state) != idle ]]; then
    sinfo >&2 || true
    tail -n 30 "$DIR"/log/*.log >&2 || true
    die "node not idle after 60 s (state: $(node_state))"
  fi
  if ! timeout 60 srun -t 1 -n1 true; then
    tail -n 30 "$DIR"/log/*.log >&2 || true
    die "srun on the new cluster failed"
  fi
  log "up in $((SECONDS - t0)) s: node $(hostname -s) idle ($CONF)"
}

stop_pidfile() {  # $1 = pid file; SIGTERM, wait up to 30 s, then SIGKILL
  local pid _
  [[ -s "$1" ]] || return 0
  pid=$(cat "$1")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$1: pid $pid ignored SIGTERM for 30 s; SIGKILL"
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$1"
}

stop() {
  # slurmd first (it ends the job steps it runs), then the controller, then munge (if ours)
  stop_pidfile "$DIR/run/slurmd.pid"
  stop_pidfile "$DIR/run/slurmctld.pid"
  stop_pidfile "$DIR/munged.pid"
  if [[ -e "$CONF" ]] && grep -qxF "$MARK" "$CONF"; then rm -f "$CONF"; fi
  log "stopped"
}

status() {
  local ok=0 f
  for f in "$DIR/run/slurmctld.pid" "$DIR/run/slurmd.pid" "$DIR/munged.pid"; do
    if alive "$f"; then echo "$(basename "$f" .pid): running (pid $(cat "$f"))"; else echo "$(basename "$f" .pid): not running"; fi
  done
  alive "$DIR/run/slurmctld.pid" && alive "$DIR/run/slurmd.pid" || ok=1
  if ((ok == 0)); then
    sinfo || ok=1
    [[ $(node_state) =~ ^(idle|mixed|allocated)$ ]] || ok=1
  fi
  return $ok
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
