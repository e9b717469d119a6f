"""Steps/s and the compute/communication split for 1/2/4 local CPU ranks.

Each configuration is a real multi-process run of ``mlbench-runner train`` (gloo,
reference all-reduce SGD, by-model bucket) stopped after ``--steps`` steps
(``MLBENCH_MAX_STEPS``, no evaluation); figures come from rank 0's RunSummary.
Threads per rank = cores // ranks, so the ranks share the machine's cores.

    .venv/bin/python benchmarks/runner_cpu_scaling.py --ranks 1 2 4 --steps 40
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from mlbench_api import BenchmarkRun, BenchmarkTaskSpec, RunSummary
from mlbench_api.config import effective_config
from mlbench_runner.tools.processes import importable_env, run_processes
from mlbench_runner.tools.recipes import catalog_recipe, shared_cifar10


def task(model: str, data: str, batch: int) -> BenchmarkTaskSpec:
    """Task 1a's recipe on 10000 images, or 2a's on the synthetic epsilon stand-in."""
    if model == "resnet20":
        return catalog_recipe("cifar10-resnet20", data=data, train_subset=10000, batch=batch)
    return catalog_recipe("epsilon-logreg-synthetic")


def run_once(spec: BenchmarkTaskSpec, ranks: int, steps: int, out: Path) -> RunSummary:
    run = BenchmarkRun.model_validate(
        {"metadata": {"name": f"scale-{ranks}"}, "spec": {"taskRef": {"name": "bench"}, "workers": ranks}}
    )
    config = effective_config(run, "bench", spec, output_dir=str(out), metrics_port=0)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(config.dump())
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    env = dict(importable_env(dict(os.environ)), MLBENCH_MAX_STEPS=str(steps), MLBENCH_THREADS=threads)
    output: list[str] = []
    code = run_processes(out / "config.json", ranks, env, output.append)
    if code:
        raise SystemExit(f"run with {ranks} ranks failed (exit {code}):\n" + "\n".join(output[-30:]))
    return RunSummary.model_validate_json((out / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--model", choices=("resnet20", "logreg"), nargs="+", default=["resnet20", "logreg"])
    p.add_argument("--data", default=str(shared_cifar10()), help="CIFAR-10 JPEG tarball (resnet20)")
    args = p.parse_args()
    models = list(args.model)
    if "resnet20" in models and not Path(args.data).exists():
        print(f"# skipping resnet20: no CIFAR-10 tarball at {args.data} (pass --data)")
        models.remove("resnet20")
    print(f"# {os.cpu_count()} cores; {args.steps} steps per run; gloo, allreduce-sgd by-model; rank 0's figures")
    print(
        f"{'model':9} {'ranks':>5} {'steps/s':>8} {'samples/s':>10} {'step ms':>8} {'fwd ms':>7} {'bwd ms':>7} "
        f"{'comm ms':>8} {'opt ms':>7} {'data ms':>8} {'comm/compute':>12}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            spec = task(model, args.data, args.batch)
            for ranks in args.ranks:
                s = run_once(spec, ranks, args.steps, Path(tmp) / f"{model}-{ranks}")
                ph, n = s.phases, s.steps
                print(
                    f"{model:9} {ranks:>5} {n / s.train_seconds:>8.2f} {s.samples_per_second:>10.1f} "
                    f"{1000 * s.train_seconds / n:>8.1f} {1000 * ph.forward / n:>7.1f} {1000 * ph.backward / n:>7.1f} "
                    f"{1000 * ph.communication / n:>8.2f} {1000 * ph.optimizer / n:>7.2f} {1000 * ph.data / n:>8.2f} "
                    f"{(s.comm_compute_ratio or 0):>12.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
