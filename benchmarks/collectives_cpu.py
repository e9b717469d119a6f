"""Task 0a on this machine: all-reduce, all-gather and broadcast timed at 2 and 4 local ranks, gloo vs mpi.

Each configuration is a real multi-process run of ``mlbench-runner collectives`` (gloo: torch-style
environment; mpi: under ``mpirun`` with mpi4py), so the figures are those a cluster run would report, here
over CPU loopback (shared memory / TCP on one host, no network). Sizes run from 4 B to ``--max-bytes``
(default 64 MiB) in steps of ``--factor``; per size, nccl-tests' time per iteration (ranks' mean),
algbw = S/t, busbw = algbw x 2(n-1)/n, (n-1)/n or 1, and the p50 latency of iterations timed alone. The
table puts the backends side by side per (op, size); nothing is asserted.

    .venv/bin/python benchmarks/collectives_cpu.py --ranks 2 4 --backends gloo mpi --max-bytes 67108864
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mlbench_api import BenchmarkRun, BenchmarkTaskSpec
from mlbench_api.config import effective_config
from mlbench_api.results import CollectiveMeasurement, CollectiveResult
from mlbench_runner.tools.collective_table import format_rate, format_size
from mlbench_runner.tools.processes import importable_env, run_processes


def task(max_bytes: int, factor: int, iterations: int, warmup: int) -> BenchmarkTaskSpec:
    return BenchmarkTaskSpec.model_validate(
        {
            "division": "open",
            "collectives": {
                "minBytes": 4,
                "maxBytes": max_bytes,
                "factor": factor,
                "iterations": iterations,
                "warmupIterations": warmup,
                "maxSecondsPerSize": 20,
            },
            "runner": {"image": "local", "command": ["mlbench-runner", "collectives"]},
        }
    )


def run_once(spec: BenchmarkTaskSpec, backend: str, ranks: int, out: Path) -> CollectiveResult:
    run = BenchmarkRun.model_validate(
        {
            "metadata": {"name": f"coll-{backend}-{ranks}"},
            "spec": {"taskRef": {"name": "bench"}, "workers": ranks, "backend": backend},
        }
    )
    config = effective_config(run, "bench", spec, output_dir=str(out), metrics_port=0)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(config.dump())
    base = importable_env(dict(os.environ))
    base["MLBENCH_THREADS"] = "1"
    rank_cmd = [sys.executable, "-m", "mlbench_runner.cli", "collectives", "--config", str(path)]
    if backend == "mpi":
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", *root, *rank_cmd]
        proc = subprocess.run(cmd, env=base, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise SystemExit(f"mpi with {ranks} ranks failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    else:
        output: list[str] = []
        code = run_processes(path, ranks, base, output.append, spec.runner.command)
        if code:
            raise SystemExit(f"{backend} with {ranks} ranks failed (exit {code}):\n" + "\n".join(output[-30:]))
    return CollectiveResult.model_validate_json((out / "collectives.json").read_text())


def table(ranks: int, results: dict[str, CollectiveResult]) -> str:
    """One line per (op, size): busbw, algbw and p50 of each backend side by side."""
    backends = list(results)
    head = f"{'op':<11} {'size':>9}"
    for b in backends:
        head += f" | {b + ' algbw':>12} {'busbw':>8} {'p50 us':>9}"
    lines = [f"## {ranks} ranks (GB/s = 1e9 B/s)", head]
    keys: list[tuple[str, int]] = []
    for result in results.values():
        for row in result.rows:
            if (row.op, row.bytes) not in keys:
                keys.append((row.op, row.bytes))
    rows: dict[str, dict[tuple[str, int], CollectiveMeasurement]] = {
        b: {(r.op, r.bytes): r for r in res.rows} for b, res in results.items()
    }
    for op, nbytes in keys:
        line = f"{op:<11} {format_size(nbytes):>9}"
        for b in backends:
            r = rows[b].get((op, nbytes))
            if r is None:
                line += f" | {'-':>12} {'-':>8} {'-':>9}"
            else:
                line += (
                    f" | {format_rate(r.algorithm_bandwidth):>12} {format_rate(r.bus_bandwidth):>8} "
                    f"{r.latency_p50_seconds * 1e6:>9.1f}"
                )
        lines.append(line)
    peaks = "; ".join(
        f"{b}: " + ", ".join(f"{op} {v / 1e9:.2f}" for op, v in res.peak_bus_bandwidth().items())
        for b, res in results.items()
    )
    lines.append(f"peak busbw (GB/s) {peaks}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--backends", nargs="+", choices=("gloo", "mpi"), default=["gloo", "mpi"])
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--keep", help="keep every run's result files under this folder")
    args = p.parse_args()
    backends = list(args.backends)
    if "mpi" in backends and shutil.which("mpirun") is None:
        print("# skipping mpi: mpirun is not installed")
        backends.remove("mpi")
    spec = task(args.max_bytes, args.factor, args.iterations, args.warmup)
    print(
        f"# {os.cpu_count()} cores, CPU loopback (one host, no network); 1 thread/rank; {args.iterations} timed "
        f"iterations x2 loops after {args.warmup} warm-up per size; float32; backends {', '.join(backends)}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for ranks in args.ranks:
            results = {b: run_once(spec, b, ranks, root / f"{b}-{ranks}") for b in backends}
            print(table(ranks, results), flush=True)
            print()


if __name__ == "__main__":
    main()
