#!/usr/bin/env python3
"""Peer figures for `htfaas bench`: Parsl's HighThroughputExecutor on this machine.

Runs HTEX locally (LocalProvider, one block, exactly --workers workers, loopback
only) and prints one JSON line per figure on stdout:
  {"system": "parsl-htex", "metric": ..., "value": ..., "unit": ..., "n": ...}
Logs and errors go to stderr. Exit status is non-zero on any failure.
Run with the venv made by install.sh:
  `$(bench/peer/install.sh | tail -1) bench/peer/parsl_bench.py --quick`
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable

import parsl
from parsl.app.app import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.providers import LocalProvider

SYSTEM = "parsl-htex"
LOOPBACK = "127.0.0.1"
CLEANUP_TIMEOUT = 30  # s


class BenchError(Exception):
    pass


def emit(metric: str, value: Any, unit: str, n: int, **extra: Any) -> None:
    print(json.dumps({"system": SYSTEM, "metric": metric, "value": value,
                      "unit": unit, "n": n, **extra}), flush=True)


def log(msg: str) -> None:
    print(f"parsl_bench: {msg}", file=sys.stderr, flush=True)


def percentile(sorted_ms: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    return sorted_ms[max(0, math.ceil(p / 100 * len(sorted_ms)) - 1)]


@python_app
def noop() -> None:
    return None


@python_app
def sha256_file(src: str, dst: str) -> None:
    import hashlib
    with open(src, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(dst, "w") as f:
        f.write(digest)


@python_app
def numpy_stats(src: str, dst: str) -> None:
    # The same work as htfaas's native numpy function (src/bench/native.rs, NUMPY_APP).
    import json
    import numpy as np
    a = np.fromfile(src, dtype="<f4")
    out = {"n": int(a.size), "mean": float(a.astype(np.float64).mean()), "std": float(a.std())}
    with open(dst, "w") as f:
        json.dump(out, f)


def run_numpy(args: argparse.Namespace, tmp: Path) -> None:
    """The numpy task: the first one on fresh workers (numpy imported), then warm ones."""
    n_lat = args.n_latency or (50 if args.quick else 200)
    src, dst = tmp / "input.f32", tmp / "stats.json"
    n = 1 << 18
    src.write_bytes(struct.pack(f"<{n}f", *range(n)))
    dfk = parsl.load(make_config(args.workers, tmp / "runinfo"))
    try:
        htex = dfk.executors["htex"]
        connected = wait_for_workers(htex, args.workers, args.startup_timeout)
        if connected != args.workers:
            raise BenchError(f"expected {args.workers} workers, {connected} connected")
        timed_sequential(noop, args.warmup, args.task_timeout)
        t0 = time.perf_counter()
        wait(numpy_stats(str(src), str(dst)), args.task_timeout, "first numpy task")
        emit("numpy_task_first", round((time.perf_counter() - t0) * 1e3, 3), "ms", 1)
        # Every worker imports numpy once before the warm samples.
        for f in [numpy_stats(str(src), str(dst)) for _ in range(4 * args.workers)]:
            wait(f, args.task_timeout, "numpy warm-up")
        lat = timed_sequential(lambda: numpy_stats(str(src), str(dst)), n_lat, args.task_timeout)
        emit("numpy_task_latency_p50", round(percentile(lat, 50), 3), "ms", n_lat,
             p99=round(percentile(lat, 99), 3))
    finally:
        signal.alarm(CLEANUP_TIMEOUT)
        try:
            dfk.cleanup()
        finally:
            parsl.clear()
            kill_leftovers(tmp / "runinfo")


def make_config(workers: int, run_dir: Path) -> Config:
    cores = os.cpu_count() or 1
    htex = HighThroughputExecutor(
        label="htex",
        address=LOOPBACK,            # interchange binds here; workers connect here
        loopback_address=LOOPBACK,   # driver <-> interchange
        max_workers_per_node=workers,
        cores_per_worker=min(1.0, cores / workers),  # so the pool starts exactly `workers`
        worker_logdir_root=str(run_dir),
        provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1),
    )
    return Config(executors=[htex], run_dir=str(run_dir), strategy=None, usage_tracking=0)


def wait(fut: Future, timeout: float, what: str) -> Any:
    try:
        return fut.result(timeout=timeout)
    except FutureTimeout:
        raise BenchError(f"{what} did not finish within {timeout:g}s") from None


def timed_sequential(submit: Callable[[], Any], n: int, timeout: float) -> list[float]:
    """Submit one task, wait for it, repeat; returns sorted round trips in ms."""
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        wait(submit(), timeout, "task")
        samples.append((time.perf_counter() - t0) * 1e3)
    return sorted(samples)


def wait_for_workers(htex: HighThroughputExecutor, workers: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        count = sum(m["worker_count"] for m in htex.connected_managers() if m["active"])
        if count >= workers:
            return count
        time.sleep(0.1)
    raise BenchError(f"{workers} workers did not connect within {timeout:.0f}s")


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every visible process."""
    procs = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                procs[int(d.name)] = (ppid, cmd)
            except (OSError, IndexError, ValueError):
                pass
    return procs


def our_pids(run_dir: Path) -> set[int]:
    """This process, processes naming our run dir (the detached worker pool), and their descendants."""
    procs = processes()
    tree = {os.getpid()} | {p for p, (_, cmd) in procs.items() if str(run_dir) in cmd}
    while True:
        new = {p for p, (pp, _) in procs.items() if pp in tree} - tree
        if not new:
            return tree
        tree |= new


def check_loopback(pids: set[int]) -> int:
    """Every TCP socket held by `pids` must be on 127.0.0.1 at both ends. Returns the count."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            pass
    checked, bad = 0, []
    for table, lo in (("tcp", {"0100007F"}), ("tcp6", {"0000000000000000FFFF00000100007F",
                                                        "00000000000000000000000001000000"})):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[9] not in inodes:
                continue
            local, remote, state = f[1].split(":")[0], f[2].split(":")[0], f[3]
            checked += 1
            # state 0A = LISTEN, whose remote is all zeros
            if local not in lo or (state != "0A" and remote not in lo):
                bad.append(f"{table} {f[1]} -> {f[2]} state {state}")
    if bad:
        raise BenchError("non-loopback sockets: " + "; ".join(bad))
    return checked


def kill_leftovers(run_dir: Path) -> None:
    """SIGKILL whatever we started that parsl's cleanup left running (worker pool, interchange)."""
    for pid in our_pids(run_dir) - {os.getpid()}:
        log(f"killing leftover process {pid}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def run(args: argparse.Namespace, tmp: Path) -> None:
    n_lat = args.n_latency or (200 if args.quick else 1000)
    n_tp = args.n_throughput or (2000 if args.quick else 20000)
    t_task = args.task_timeout
    src, dst = tmp / "input.bin", tmp / "digest.txt"
    payload = os.urandom(1 << 20)
    src.write_bytes(payload)
    expected = hashlib.sha256(payload).hexdigest()

    t_start = time.monotonic()
    run_dir = tmp / "runinfo"
    dfk = parsl.load(make_config(args.workers, run_dir))
    try:
        htex = dfk.executors["htex"]
        connected = wait_for_workers(htex, args.workers, args.startup_timeout)
        if connected != args.workers:
            raise BenchError(f"expected {args.workers} workers, {connected} connected")
        timed_sequential(noop, args.warmup, t_task)
        sockets = check_loopback(our_pids(run_dir))
        log(f"{connected} workers up after {time.monotonic() - t_start:.1f}s; "
            f"{sockets} TCP sockets, all on {LOOPBACK}")
        emit("workers", connected, "workers", 0, parsl_version=parsl.__version__,
             cpus=os.cpu_count(), loadavg_1m=round(os.getloadavg()[0], 2), encrypted=htex.encrypted)

        lat = timed_sequential(noop, n_lat, t_task)
        emit("noop_latency_p50", round(percentile(lat, 50), 3), "ms", n_lat)
        emit("noop_latency_p99", round(percentile(lat, 99), 3), "ms", n_lat)

        wait(sha256_file(str(src), str(dst)), t_task, "file task")
        if dst.read_text() != expected:
            raise BenchError(f"file task wrote {dst.read_text()!r}, expected {expected}")
        lat = timed_sequential(lambda: sha256_file(str(src), str(dst)), n_lat, t_task)
        emit("file_task_latency_p50", round(percentile(lat, 50), 3), "ms", n_lat)
        emit("file_task_latency_p99", round(percentile(lat, 99), 3), "ms", n_lat)

        t0 = time.perf_counter()
        futures = [noop() for _ in range(n_tp)]
        for fut in futures:
            wait(fut, args.timeout, "throughput task")
        elapsed = time.perf_counter() - t0
        emit("noop_throughput", round(n_tp / elapsed, 1), "tasks/s", n_tp)
        check_loopback(our_pids(run_dir))
    finally:
        signal.alarm(CLEANUP_TIMEOUT)  # bounded, even after the global timeout fired
        try:
            dfk.cleanup()
        finally:
            parsl.clear()
            kill_leftovers(run_dir)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="HTEX workers (default 2)")
    ap.add_argument("--n-latency", type=int, help="sequential samples per latency figure (1000)")
    ap.add_argument("--n-throughput", type=int, help="no-op tasks submitted at once (20000)")
    ap.add_argument("--warmup", type=int, default=50, help="no-op tasks before measuring")
    ap.add_argument("--quick", action="store_true", help="defaults of 200 latency samples, 2000 tasks")
    ap.add_argument("--timeout", type=float, default=600, help="global timeout, s (default 600)")
    ap.add_argument("--task-timeout", type=float, default=30, help="per-task wait, s")
    ap.add_argument("--startup-timeout", type=float, default=60, help="wait for workers, s")
    ap.add_argument("--numpy-only", action="store_true", help="only the numpy task's figures")
    args = ap.parse_args()
    if min(args.workers, args.n_latency or 1, args.n_throughput or 1) < 1:
        ap.error("--workers, --n-latency and --n-throughput must be >= 1")

    def on_signal(signum: int, frame: Any) -> None:
        if signum == signal.SIGALRM:
            raise BenchError(f"timeout (global {args.timeout:.0f}s, cleanup {CLEANUP_TIMEOUT}s)")
        raise BenchError(f"terminated by signal {signum}")

    # parsl starts interchange.py and process_worker_pool.py from PATH: use this venv's.
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    for sig in (signal.SIGALRM, signal.SIGTERM):
        signal.signal(sig, on_signal)
    signal.alarm(max(1, math.ceil(args.timeout)))
    tmp = Path(tempfile.mkdtemp(prefix="htfaas-parsl-bench-"))
    t0 = time.monotonic()
    try:
        (run_numpy if args.numpy_only else run)(args, tmp)
    except Exception as e:  # report any failure as one clear line
        log(f"FAILED: {type(e).__name__}: {e}")
        return 1
    finally:
        signal.alarm(0)
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"done in {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
