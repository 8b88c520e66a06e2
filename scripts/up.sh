#!/usr/bin/env bash
# The run command: installs what is missing, builds everything, and runs the local stack in the
# foreground with the demo (registers `checksum`, uploads a sample, prints its output).
# Ctrl-C stops everything. Extra arguments go to `htfaas up` (e.g. --dir /tmp/stack).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export HTFAAS_NATS_SERVER=${HTFAAS_NATS_SERVER:-$(scripts/install-deps.sh | tail -n 1)}
echo "== building the example functions (Rust as wasm32-wasip1 modules and wasm32-wasip2 components, then C)" >&2
cargo build --release --target wasm32-wasip1 --target wasm32-wasip2 --manifest-path examples/Cargo.toml
# The demo runs only checksum (Rust), so a missing C toolchain is a warning here.
examples/c/build.sh || echo "== the C example (examples/c) did not build; the demo does not need it" >&2
echo "== building htfaas" >&2
cargo build --bin htfaas
exec target/debug/htfaas up --demo "$@"
