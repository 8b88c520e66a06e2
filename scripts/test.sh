#!/usr/bin/env bash
# The test command: installs what the tests need (wasm targets, nats-server, pymacaroons, xrootd, clang, slurm),
# then runs every test of the workspace. `.ci/run` calls exactly this.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export HTFAAS_NATS_SERVER=${HTFAAS_NATS_SERVER:-$(scripts/install-deps.sh | tail -n 1)}
if cargo fmt --version >/dev/null 2>&1; then
  echo "== cargo fmt --check" >&2
  cargo fmt --all -- --check
else
  echo "== rustfmt is not installed (rustup component add rustfmt); skipping the format check" >&2
fi
# A broken intra-doc link fails the test command, so the docs stay true as code moves.
echo "== cargo doc (intra-doc links)" >&2
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --document-private-items --features htfaas/kafka
echo "== example guests (Rust as wasm32-wasip1 modules and wasm32-wasip2 components, then C)" >&2
cargo build --release --target wasm32-wasip1 --target wasm32-wasip2 --manifest-path examples/Cargo.toml
examples/c/build.sh
# The native guests' numpy image (tests/e2e/native.rs), built once per clone by the command a
# user runs (`htfaas image build`: mmdebstrap, Debian's packages) and kept in .tools/images.
NUMPY_IMAGE=$ROOT/.tools/images/python3-numpy.tar
if [[ ! -s $NUMPY_IMAGE ]]; then
  echo "== native image python3-numpy (htfaas image build, mmdebstrap)" >&2
  mkdir -p "$(dirname "$NUMPY_IMAGE")"
  cargo run -q --bin htfaas -- image build --no-push --packages python3-minimal,python3-numpy \
    --out "$NUMPY_IMAGE.tmp" >&2
  mv "$NUMPY_IMAGE.tmp" "$NUMPY_IMAGE"
fi
export HTFAAS_NUMPY_IMAGE=${HTFAAS_NUMPY_IMAGE:-$NUMPY_IMAGE}
echo "== tests" >&2
# The Slurm annex test's batch jobs run the htfaas binary: the whole workspace's test build
# (re)builds it first (the root package's integration tests need it), so point the test at it
# rather than have it build its own (tests/src/lib.rs `htfaas_binary`).
if [[ $# -eq 0 && -z ${HTFAAS_BIN:-} ]]; then
  TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  export HTFAAS_BIN=$TARGET/debug/htfaas
fi
# `kafka`: the binary's dCache Kafka bridge (librdkafka), which the bridge tests drive.
cargo test --workspace --features htfaas/kafka --no-fail-fast "$@"
