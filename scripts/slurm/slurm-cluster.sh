#!/bin/bash
# Private one-node Slurm cluster in a temp dir (Debian 12: slurmctld slurmd slurm-client munge).
# Needs root (SlurmUser=root), no systemd, nothing written under /etc.
#
# Adapted from the verified recipe in ../shared/reference/slurm-recipe/ (slurm-cluster.sh,
# slurm.conf.in, and its list of pitfalls, each handled here); htfaas's changes: the cluster is
# named htfaas, and DIR/tmp (mode 1777) is made for jobs' scratch (the annex test's EPs keep
# theirs there: `htfaas annex create --scratch-dir`), so nothing a job leaves outlives DIR.
# Used by tests/e2e/annex_slurm.rs.
#
#   DIR=$(slurm-cluster.sh start [DIR])   # prints DIR on stdout once the node is idle
#   export SLURM_CONF=$DIR/slurm.conf     # every sbatch/squeue/scontrol/scancel needs this
#   slurm-cluster.sh status DIR
#   slurm-cluster.sh stop DIR             # cancels jobs, stops slurmd/slurmctld/munged by PID
#
# Env overrides: SLURMCTLD_PORT, SLURMD_PORT (default: free ports picked on 127.0.0.1),
#                SLURM_CPUS (default nproc), SLURM_MEM_MB (default detected-512),
#                SLURM_READY_TIMEOUT (s, default 30), SLURM_TEMPLATE (default: slurm.conf.in next to this script),
#                SLURM_MUNGED_FORCE=1 (pass --force to munged when DIR has a non-o+x parent)
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TEMPLATE=${SLURM_TEMPLATE:-$HERE/slurm.conf.in}

log() { echo "slurm-cluster: $*" >&2; }

free_port() {
  python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'
}

alive() { [ -n "${1:-}" ] && [ -d "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# stop_pid PID NAME: SIGTERM, wait up to 10 s, then SIGKILL. Only if /proc/PID/comm matches NAME.
stop_pid() {
  local pid=$1 name=$2 i
  alive "$pid" || return 0
  [ "$(cat /proc/$pid/comm 2>/dev/null)" = "$name" ] || { log "pid $pid is not $name, not touching it"; return 0; }
  kill -TERM "$pid" 2>/dev/null
  for i in $(seq 1 100); do alive "$pid" || return 0; sleep 0.1; done
  log "$name ($pid) ignored SIGTERM, sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null
}

start() {
  local DIR=${1:-}
  [ -n "$DIR" ] || DIR=$(mktemp -d /tmp/slurm-test.XXXXXX)
  mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd) || return 1
  # munged refuses a socket dir that is not o+x (mktemp -d gives 0700); every parent must be o+x too
  chmod 755 "$DIR"
  mkdir -p "$DIR/munge" "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/tmp"
  chmod 1777 "$DIR/tmp"
  chmod 755 "$DIR/munge"
  if [ ! -s "$DIR/munge/munge.key" ]; then
    mungekey -c -k "$DIR/munge/munge.key" 2>/dev/null ||
      dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 600 "$DIR/munge/munge.key"

  # SLURM_MUNGED_FORCE=1 adds --force: munged then only warns about insecure perms (e.g. 0700 parents such as pytest's tmp_path)
  munged ${SLURM_MUNGED_FORCE:+--force} --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.sock" \
         --log-file="$DIR/munge/munged.log" --pid-file="$DIR/munge/munged.pid" \
         --seed-file="$DIR/munge/munged.seed" </dev/null >/dev/null 2>"$DIR/munge/munged.stderr" ||
    { log "munged failed: $(cat "$DIR/munge/munged.stderr")"; return 1; }
  local i
  for i in $(seq 1 50); do [ -S "$DIR/munge/munge.sock" ] && break; sleep 0.1; done
  munge -n -S "$DIR/munge/munge.sock" | unmunge -S "$DIR/munge/munge.sock" >/dev/null ||
    { log "munge self-test failed"; stop "$DIR"; return 1; }

  local CTLD_PORT=${SLURMCTLD_PORT:-$(free_port)} SLURMD_PORT=${SLURMD_PORT:-$(free_port)}
  while [ "$SLURMD_PORT" = "$CTLD_PORT" ]; do SLURMD_PORT=$(free_port); done
  local CPUS=${SLURM_CPUS:-$(nproc)}
  local DETECTED
  DETECTED=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)
  [ -n "$DETECTED" ] || DETECTED=$(free -m | awk '/^Mem:/{print $2}')
  local MEM=${SLURM_MEM_MB:-$(( DETECTED > 1024 ? DETECTED - 512 : DETECTED / 2 ))}
  sed -e "s|@DIR@|$DIR|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
      -e "s|@CPUS@|$CPUS|g" -e "s|@MEM@|$MEM|g" "$TEMPLATE" > "$DIR/slurm.conf"

  export SLURM_CONF=$DIR/slurm.conf
  # cd so the daemons (and slurmstepd) do not keep the caller's cwd; setsid detaches them from our session
  ( cd "$DIR" || exit 1
    setsid slurmctld -D -f "$SLURM_CONF" >"$DIR/log/slurmctld.out" 2>&1 </dev/null &
    echo $! >"$DIR/slurmctld.run.pid"
    setsid slurmd -D -N localhost -f "$SLURM_CONF" >"$DIR/log/slurmd.out" 2>&1 </dev/null &
    echo $! >"$DIR/slurmd.run.pid" )

  local t0=$SECONDS st="" timeout=${SLURM_READY_TIMEOUT:-30}
  while [ $((SECONDS - t0)) -lt "$timeout" ]; do
    st=$(sinfo -h -n localhost -o %t 2>/dev/null)
    [ "$st" = idle ] && { echo "$DIR"; return 0; }
    sleep 0.1
  done
  log "node not idle after ${timeout}s (state '$st'); logs in $DIR/log"
  tail -5 "$DIR/log/slurmctld.out" "$DIR/log/slurmd.out" >&2
  stop "$DIR"
  return 1
}

# processes (job shells, daemonised children, orphaned slurmstepd) that belong to this cluster:
# their environment carries SLURM_CONF=$DIR/slurm.conf plus SLURM_JOB_ID, or they are slurmstepd with it.
cluster_strays() {
  local conf=$1 p env comm
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = $$ ] && continue
    env=$( { tr '\0' '\n' < /proc/$p/environ; } 2>/dev/null ) || continue
    grep -qxF "SLURM_CONF=$conf" <<<"$env" || continue
    comm=$(cat /proc/$p/comm 2>/dev/null)
    if [ "$comm" = slurmstepd ] || grep -q '^SLURM_JOB_ID=' <<<"$env"; then alive "$p" && echo "$p"; fi
  done
}

stop() {
  local DIR
  DIR=$(cd "$1" && pwd) || return 1
  export SLURM_CONF=$DIR/slurm.conf
  local i ids
  if [ -f "$SLURM_CONF" ] && scontrol ping 2>/dev/null | grep -q UP; then
    ids=$(squeue -h -o %i 2>/dev/null)
    if [ -n "$ids" ]; then
      scancel $ids 2>/dev/null
      for i in $(seq 1 200); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
    fi
    scontrol shutdown >/dev/null 2>&1   # stops slurmctld and all slurmd
  fi
  # *.run.pid = PID of what we launched; slurm*.pid = written by the daemons themselves (same PID normally)
  local f
  for f in slurmd.run.pid slurmd.pid; do stop_pid "$(cat "$DIR/$f" 2>/dev/null)" slurmd; done
  for f in slurmctld.run.pid slurmctld.pid; do stop_pid "$(cat "$DIR/$f" 2>/dev/null)" slurmctld; done
  # slurmstepd and job processes survive slurmd; kill whatever is left of this cluster's jobs
  local strays
  strays=$(cluster_strays "$SLURM_CONF")
  if [ -n "$strays" ]; then
    log "killing leftover job processes: $(echo $strays)"
    kill -KILL $strays 2>/dev/null
  fi
  stop_pid "$(cat "$DIR/munge/munged.pid" 2>/dev/null)" munged
  return 0
}

status() {
  export SLURM_CONF=$(cd "$1" && pwd)/slurm.conf
  scontrol ping; sinfo; squeue
}

case "${1:-}" in
  start)  shift; start "${1:-}" ;;
  stop)   shift; stop "${1:?DIR}" ;;
  status) shift; status "${1:?DIR}" ;;
  *) echo "usage: $0 start [DIR] | stop DIR | status DIR" >&2; exit 2 ;;
esac
