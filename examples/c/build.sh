#!/usr/bin/env bash
# Builds the C example guests (examples/c/<name>/<name>.c) for wasm32-wasi with clang and
# Debian's wasi-libc (apt: clang lld wasi-libc libclang-rt-14-dev-wasm32; scripts/install-deps.sh),
# into examples/target/wasm32-wasip1/release/<name>.wasm, next to the Rust guests.
# Rebuilds only what is older than its source. CC overrides clang.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=$HERE/../target/wasm32-wasip1/release
CC=${CC:-clang}
if ! command -v "$CC" >/dev/null 2>&1; then
  echo "examples/c/build.sh: $CC not found; run scripts/install-deps.sh (apt: clang lld wasi-libc libclang-rt-14-dev-wasm32)" >&2
  exit 1
fi
mkdir -p "$OUT"
for src in "$HERE"/*/*.c; do
  name=$(basename "$src" .c)
  wasm=$OUT/$name.wasm
  if [[ -f $wasm && $wasm -nt $src && $wasm -nt ${BASH_SOURCE[0]} ]]; then
    continue
  fi
  echo "examples/c/build.sh: $name.wasm" >&2
  "$CC" --target=wasm32-wasi -O2 -std=c11 -Wall -Wextra -Werror -o "$wasm.tmp" "$src" -lm -Wl,--strip-all
  mv "$wasm.tmp" "$wasm"
done
