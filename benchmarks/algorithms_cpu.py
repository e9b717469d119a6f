"""Every distributed algorithm side by side on task 1a's smoke recipe, on 2 and 4 CPU ranks.

Each row is a real multi-process run of ``mlbench-runner train`` (gloo) of the catalog task
``cifar10-resnet20-smoke`` (ResNet-20, SGD with nesterov, batch 32 per rank) on the first
``--train-subset`` images of the JPEG copy of CIFAR-10 (shared/datasets), for a fixed
``--epochs`` with an unreachable target, so every algorithm trains the same number of steps.
Printed from rank 0's RunSummary: samples/s (of step time), the payload bytes each rank sends
per step (declared by the algorithm, and what the communicator counted), the compression
ratio against allreduce-sgd, communication / compute, and the test accuracy (whole 10 000-image
test split) after the last epoch. The ranks share this machine's cores (threads = cores // ranks).

    .venv/bin/python benchmarks/algorithms_cpu.py --ranks 2 4 --epochs 3 --train-subset 2560
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from mlbench_api import BenchmarkRun, BenchmarkTaskSpec, RunSummary
from mlbench_api.config import effective_config
from mlbench_api.training import Algorithm
from mlbench_runner.tools.processes import importable_env, run_processes
from mlbench_runner.tools.recipes import catalog_recipe, shared_cifar10

#: Parameters each algorithm runs with here (the API's defaults otherwise).
PARAMETERS: dict[Algorithm, dict[str, Any]] = {
    Algorithm.POWERSGD: {"rank": 2},
    Algorithm.DECENTRALIZED_SGD: {"topology": "ring"},
    Algorithm.SPARSIFIED_SGD: {"density": 0.01, "selection": "top-k"},
}


def run_once(spec: BenchmarkTaskSpec, algorithm: Algorithm, ranks: int, out: Path) -> RunSummary:
    doc: dict[str, Any] = {"taskRef": {"name": "bench"}, "workers": ranks, "algorithm": algorithm.value}
    if algorithm in PARAMETERS:
        doc["algorithmParameters"] = PARAMETERS[algorithm]
    run = BenchmarkRun.model_validate({"metadata": {"name": f"alg-{ranks}"}, "spec": doc})
    config = effective_config(run, "cifar10-resnet20-smoke", spec, output_dir=str(out), metrics_port=0)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(config.dump())
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    output: list[str] = []
    code = run_processes(path, ranks, dict(importable_env(dict(os.environ)), MLBENCH_THREADS=threads), output.append)
    if code:
        raise SystemExit(f"{algorithm.value} on {ranks} ranks failed (exit {code}):\n" + "\n".join(output[-30:]))
    return RunSummary.model_validate_json((out / "summary.json").read_text())


def row(algorithm: Algorithm, ranks: int, s: RunSummary) -> str:
    c = s.communication
    measured = f"{c.measured_bytes_per_step:,.0f}" if c and c.measured_bytes_per_step is not None else "n/a"
    declared = c.bytes_per_step if c else 0
    ratio = (c.compression_ratio or 0.0) if c else 0.0
    compression_ms = 1e3 * s.phases.compression / max(1, s.steps)
    return (
        f"{algorithm.value:18} {ranks:>5} {s.samples_per_second:>9.1f} {declared:>13,} "
        f"{measured:>13} {ratio:>7.1f} {compression_ms:>8.2f} "
        f"{(s.comm_compute_ratio or 0):>12.3f} {100 * (s.final_accuracy or 0):>8.1f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train-subset", type=int, default=2560)
    p.add_argument(
        "--algorithms", nargs="+", default=[a.value for a in Algorithm], choices=[a.value for a in Algorithm]
    )
    p.add_argument("--data", default=str(shared_cifar10()), help="the JPEG copy of CIFAR-10 (tarball)")
    args = p.parse_args()
    if not Path(args.data).exists():
        raise SystemExit(f"no CIFAR-10 JPEG tarball at {args.data} (pass --data)")
    spec = catalog_recipe(
        "cifar10-resnet20-smoke", data=args.data, train_subset=args.train_subset, max_epochs=args.epochs, target=1.0
    )
    print(
        f"# {os.cpu_count()} cores; cifar10-resnet20-smoke recipe on the first {args.train_subset} images of the JPEG "
        f"copy of CIFAR-10, {args.epochs} epochs, gloo; rank 0's figures; bytes = payload per rank per step"
    )
    print(
        f"{'algorithm':18} {'ranks':>5} {'samples/s':>9} {'bytes/step':>13} {'measured':>13} {'ratio':>7} "
        f"{'cmp ms':>8} {'comm/compute':>12} {'acc %':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in args.ranks:
            for name in args.algorithms:
                algorithm = Algorithm(name)
                summary = run_once(spec, algorithm, ranks, Path(tmp) / f"{name}-{ranks}")
                print(row(algorithm, ranks, summary), flush=True)


if __name__ == "__main__":
    main()
