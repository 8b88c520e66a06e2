#!/usr/bin/env bash
# The run command: installs what the demo needs and is missing (scripts/install-deps.sh --demo:
# the wasm targets, a C compiler, nats-server; none of the test-only parts), builds htfaas
# (without the Kafka bridge: no librdkafka) and the demo's function, and runs the local stack in the foreground
# with the demo (registers `checksum`, uploads a sample, prints its output).
# Ctrl-C stops everything. Extra arguments go to `htfaas up` (e.g. --dir /tmp/stack).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export HTFAAS_NATS_SERVER=${HTFAAS_NATS_SERVER:-$(scripts/install-deps.sh --demo | tail -n 1)}
# The demo runs one function, checksum, as a wasm32-wasip1 module; the test command builds the
# other examples (every target, and C).
echo "== building the demo's function (examples/checksum, wasm32-wasip1)" >&2
cargo build --release --target wasm32-wasip1 --manifest-path examples/Cargo.toml -p checksum
echo "== building htfaas" >&2
cargo build --bin htfaas
exec target/debug/htfaas up --demo "$@"
