#!/usr/bin/env bash
# Profiles the stack's processes during the no-op throughput window of `htfaas bench --quick`
# (with its peer; no fsync run, no component benches, no scaling, no native guests, no flood;
# a 12 s window): attaches `perf record` to the gateway, scheduler, EP and storage once the
# window is under way, and writes, under OUT (default bench/results/):
#   profile-<label>-<component>.txt   perf report --no-children: where each process's CPU goes
#   profile-<label>-<component>.svg   a flamegraph (with inferno in .tools/inferno; stacks need
#                                     a build with frame pointers or debug info)
#   profile-<label>-<component>.folded.gz  with CALL_GRAPH: the collapsed stacks it is drawn from
#   profile-<label>-io.txt            bytes written (wchar) and context switches per second of
#                                     each process over the same 6 s (divide by the bench's
#                                     rate for per-event figures)
#   profile-<label>.jsonl             the bench's own figures of that run
# Usage: bench/profile.sh LABEL [OUT]   (needs a release build: cargo build --release)
# CALL_GRAPH=dwarf records stacks too (a build with CARGO_PROFILE_RELEASE_DEBUG=line-tables-only;
# HTFAAS_BIN names that binary when it is not target/release/htfaas).
set -euo pipefail
label=${1:?usage: bench/profile.sh LABEL [OUT]}
out=${2:-bench/results}
root=$(cd "$(dirname "$0")/.." && pwd)
bin="${HTFAAS_BIN:-$root/target/release/htfaas}"
inferno="$root/.tools/inferno/bin"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" bench --quick --no-fsync --no-components --no-scaling --no-native --flood 0 \
  --window-s 12 >"$out/profile-$label.jsonl" 2>"$tmp/bench.err" &
bench=$!

# The components are children of the bench: `htfaas <component> …`.
pid_of() { pgrep -P "$bench" -f "htfaas $1" | head -1; }
for _ in $(seq 1 600); do
  if grep -q "throughput_noop: window of" "$tmp/bench.err" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
sleep 1
pids=()
for c in gateway scheduler ep storage; do
  p=$(pid_of "$c" || true)
  [ -n "$p" ] && pids+=("$c:$p")
done
for cp in "${pids[@]}"; do
  c=${cp%%:*} p=${cp##*:}
  graph=()
  [ -n "${CALL_GRAPH:-}" ] && graph=(--call-graph "$CALL_GRAPH")
  perf record -q -F 999 "${graph[@]}" -p "$p" -o "$tmp/$c.data" -- sleep 6 2>/dev/null &
done
# What each process writes (every write(2)/pwrite(2), to any file or socket) and how often its
# threads are switched out, over the profiled seconds.
io_of() {
  local p=$1 w cs=0 t
  w=$(awk '/^wchar:/ {print $2}' "/proc/$p/io" 2>/dev/null || echo 0)
  for t in /proc/"$p"/task/*/status; do
    cs=$((cs + $(awk '/_ctxt_switches:/ {n += $2} END {print n + 0}' "$t" 2>/dev/null || echo 0)))
  done
  echo "$w $cs"
}
(
  declare -A before
  for cp in "${pids[@]}"; do before[$cp]=$(io_of "${cp##*:}"); done
  sleep 6
  for cp in "${pids[@]}"; do
    read -r w0 c0 <<<"${before[$cp]}"
    read -r w1 c1 <<<"$(io_of "${cp##*:}")"
    printf '%-10s wchar/s %10d   ctx switches/s %7d\n' "${cp%%:*}" $(((w1 - w0) / 6)) $(((c1 - c0) / 6))
  done >"$out/profile-$label-io.txt"
) &
wait "$bench" || { cat "$tmp/bench.err" >&2; exit 1; }
wait
for cp in "${pids[@]}"; do
  c=${cp%%:*}
  {
    echo "## by thread and object (kernel, htfaas, libc)"
    perf report -i "$tmp/$c.data" --stdio --no-children -g none --sort comm,dso --percent-limit 1 2>/dev/null | grep -v '^$' | grep -v '^#'
    echo "## by symbol"
    perf report -i "$tmp/$c.data" --stdio --no-children -g none --percent-limit 0.7 2>/dev/null | grep -v '^$' | grep -v '^#' | head -100
  } >"$out/profile-$label-$c.txt" || true
  if [ -x "$inferno/inferno-flamegraph" ]; then
    # Stacks are unwound once (with dwarf stacks that is the slow part): kept collapsed, one
    # line per stack, for scripts to sum a function's share; the flamegraph is drawn from them.
    perf script -i "$tmp/$c.data" 2>/dev/null | "$inferno/inferno-collapse-perf" >"$tmp/$c.folded" || true
    "$inferno/inferno-flamegraph" --title "htfaas $c ($label)" <"$tmp/$c.folded" >"$out/profile-$label-$c.svg" || true
    if [ -n "${CALL_GRAPH:-}" ]; then
      gzip -c "$tmp/$c.folded" >"$out/profile-$label-$c.folded.gz"
    fi
  fi
done
grep -E '"metric":"throughput_noop(\.cpu_ms_per_event\.[a-z_]+)?"|"system":"ratio"' "$out/profile-$label.jsonl" || true
