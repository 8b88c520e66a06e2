#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for FUZZ_SECONDS each
# (default 600), one after the other, and fails if any target crashes.
#   - installs the nightly toolchain and cargo-fuzz when missing
#   - each target starts from its kept corpus (fuzz/corpus/<target>) plus the seeds
#     (fuzz/seeds/<target>); new inputs are added to the corpus, crashes go to
#     fuzz/artifacts/<target>/, the libFuzzer log to fuzz/logs/<target>.log
#   - runs under `nice -n 19`: other work on the machine keeps its CPU
# Usage: scripts/fuzz.sh [target...]   (default: every target; FUZZ_SECONDS=30 for a smoke run)
# Environment: FUZZ_SECONDS (600), FUZZ_RSS_MB (2048), FUZZ_JOBS (1: libFuzzer -jobs per target).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FUZZ=$ROOT/fuzz
SECONDS_EACH=${FUZZ_SECONDS:-600}
RSS_MB=${FUZZ_RSS_MB:-2048}

if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

cd "$FUZZ"
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
nice -n 19 cargo +nightly fuzz build

mkdir -p logs
failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  seeds=()
  [ -d "seeds/$t" ] && seeds=("seeds/$t")
  echo "== $t: ${SECONDS_EACH}s"
  if nice -n 19 cargo +nightly fuzz run "$t" "corpus/$t" "${seeds[@]}" -- \
      -max_total_time="$SECONDS_EACH" -rss_limit_mb="$RSS_MB" -print_final_stats=1 \
      ${FUZZ_JOBS:+-jobs=$FUZZ_JOBS -workers=$FUZZ_JOBS} >"logs/$t.log" 2>&1; then
    # The last status line: executions, coverage, features, corpus.
    grep -E '^#[0-9]+' "logs/$t.log" | tail -n 1 || true
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec)' "logs/$t.log" || true
  else
    echo "!! $t crashed: see fuzz/logs/$t.log and fuzz/artifacts/$t/"
    grep -E 'panicked at|ERROR: libFuzzer|SUMMARY' "logs/$t.log" | head -n 5 || true
    failed+=("$t")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "crashed: ${failed[*]}"
  exit 1
fi
echo "no crashes in: ${targets[*]}"
