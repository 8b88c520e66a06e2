#!/usr/bin/env bash
# Install the benchmark peer (Parsl's HighThroughputExecutor) into .tools/venv-parsl.
# Idempotent; works unattended on a fresh Debian machine (run as root there).
# Progress goes to stderr; the last line on stdout is the venv's python path.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/.tools/venv-parsl"
PYTHON="${PYTHON:-python3}"

# parsl and every package it pulls in, pinned exactly (pip freeze of a clean install), and numpy
# for the native guests' figures (the same Python function as htfaas's numpy image runs).
PINS=(
  parsl==2026.10.26
  certifi==2026.10.18
  charset-normalizer==3.5.2
  dill==0.4.1
  filelock==4.2.11
  idna==3.20
  numpy==2.3.5
  psutil==7.2.2
  pyzmq==27.3.0
  requests==2.34.2
  setproctitle==1.3.8
  sortedcontainers==2.4.0
  tblib==3.2.2
  typeguard==4.6.0
  typing_extensions==4.16.0
  urllib3==2.8.0
)
STAMP="$VENV/.htfaas-pins"
WANT="$(printf '%s\n' "${PINS[@]}")"

log() { echo "install.sh: $*" >&2; }

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
   && "$VENV/bin/python" -c 'import parsl' 2>/dev/null; then
  log "up to date: $VENV"
  echo "$VENV/bin/python"
  exit 0
fi

command -v "$PYTHON" >/dev/null || { log "error: $PYTHON not found"; exit 1; }

# Debian splits venv/ensurepip into python3-venv.
if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
  command -v apt-get >/dev/null || { log "error: $PYTHON lacks venv/ensurepip and there is no apt-get"; exit 1; }
  log "installing python3-venv with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q python3-venv >&2; then
    apt-get update -q >&2
    apt-get install -y -q python3-venv >&2
  fi
fi

# A half-made venv (no pip) is rebuilt from scratch.
if [[ ! -x "$VENV/bin/pip" ]]; then
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV" >&2
fi

log "installing ${PINS[0]} (and pinned dependencies)"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-input "${PINS[@]}" >&2
"$VENV/bin/python" -c 'import parsl.executors.high_throughput.executor' >&2
echo "$WANT" >"$STAMP"
log "done: parsl $("$VENV/bin/python" -c 'import parsl; print(parsl.__version__)')"
echo "$VENV/bin/python"
