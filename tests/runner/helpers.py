"""Tiny generated tasks and runs for the runner tests (no real dataset needed)."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from mlbench_api import BenchmarkRun, BenchmarkTaskSpec, RunConfig
from mlbench_api.config import effective_config

REPO = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join(str(REPO / p) for p in ("crds", "runners", "."))


def env(**extra: str) -> dict[str, str]:
    """Subprocess environment: repo on PYTHONPATH, one thread per rank, a temp-safe cache."""
    e = dict(os.environ)
    e["PYTHONPATH"] = PYTHONPATH + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("MLBENCH_THREADS", "1")
    e.setdefault("OMP_NUM_THREADS", "1")
    e.update(extra)
    return e


def write_cifar_python(root: Path, n_train: int = 200, n_test: int = 50, seed: int = 0) -> Path:
    """A fake ``cifar-10-batches-py`` folder (class-dependent colour so it is learnable)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def batch(n: int) -> dict[bytes, Any]:
        labels = rng.integers(0, 10, n)
        base = (labels[:, None] * 25).astype(np.int64)
        data = np.clip(base + rng.integers(0, 40, (n, 3072)), 0, 255).astype(np.uint8)
        return {b"data": data, b"labels": labels.tolist()}

    per = -(-n_train // 5)
    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch(per)))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(n_test)))
    return folder


def resnet_task(
    data: Path,
    *,
    batch: int = 8,
    epochs: int = 2,
    subset: int | None = 64,
    target: float = 0.99,
    warmup: int = 1,
    milestones: list[int] | None = None,
) -> dict[str, Any]:
    return {
        "division": "open",
        "model": {"name": "resnet", "version": "m1", "depth": 20},
        "dataset": {
            "name": "cifar10-fake",
            "format": "cifar10-python",
            "path": str(data),
            **({"trainSubset": subset} if subset else {}),
        },
        "training": {
            "batchSizePerWorker": batch,
            "maxEpochs": epochs,
            "momentum": 0.9,
            "nesterov": True,
            "weightDecay": 1e-4,
            "learningRate": {
                "schedule": "multistep",
                "perSample": 0.1 / 256,
                "warmupEpochs": warmup,
                "milestones": milestones if milestones is not None else [epochs - 1],
            },
        },
        "goal": {"target": target},
        "runner": {"image": "mlbench/runner:test"},
    }


def logreg_task(
    *,
    batch: int = 10,
    epochs: int = 2,
    train: int = 400,
    test: int = 200,
    features: int = 20,
    target: float = 0.999,
    alpha: float = 2.0,
    l2: float = 1e-3,
) -> dict[str, Any]:
    return {
        "division": "open",
        "model": {"name": "logistic-regression"},
        "dataset": {
            "name": "epsilon-synthetic",
            "format": "synthetic",
            "synthetic": {"trainSamples": train, "testSamples": test, "features": features, "seed": 3},
        },
        "training": {
            "batchSizePerWorker": batch,
            "maxEpochs": epochs,
            "l2Regularization": l2,
            "learningRate": {"schedule": "inverse-sqrt", "alphaByWorkers": [{"minWorkers": 1, "alpha": alpha}]},
        },
        "goal": {"target": target, "metric": "test-accuracy"},
        "runner": {"image": "mlbench/runner:test"},
    }


def run_doc(name: str, task: str, ranks: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkRun",
        "metadata": {"name": name},
        "spec": {"taskRef": {"name": task}, "workers": ranks, **spec},
    }


def make_config(task: dict[str, Any], out: Path, ranks: int, name: str = "t", **spec: Any) -> RunConfig:
    run = BenchmarkRun.model_validate(run_doc(name, "test-task", ranks, **spec))
    return effective_config(
        run, "test-task", BenchmarkTaskSpec.model_validate(task), output_dir=str(out), metrics_port=0
    )


def launch_processes(
    config: RunConfig, ranks: int, timeout: float = 240, rank_env: Sequence[dict[str, str]] = (), **extra: str
) -> list[dict[str, Any]]:
    """Run ``ranks`` processes of ``mlbench-runner train`` (torch-style env, plus ``rank_env[r]`` for rank ``r``);
    return rank records."""
    out = Path(config.output_dir)
    procs = start_processes(config, ranks, rank_env, extra=extra)
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    if failed:  # show the first rank that failed on its own (others often just lost their peer)
        first = min(failed, key=lambda r: "Connection reset" in outputs[r] or "Connection closed" in outputs[r])
        raise AssertionError(f"rank(s) {failed} failed; rank {first}:\n{outputs[first][-3000:]}")
    return read_ranks(out, ranks)


def start_processes(
    config: RunConfig,
    ranks: int,
    rank_env: Sequence[dict[str, str]] = (),
    *,
    logs: Path | None = None,
    extra: dict[str, str] | None = None,
) -> list[subprocess.Popen[str]]:
    """Start ``ranks`` processes of ``mlbench-runner train`` (see :func:`launch_processes`); do not wait. With
    ``logs``, rank r's output goes to ``logs/rank-<r>.log`` (no pipe to fill while nobody reads it)."""
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(config.dump())
    from mlbench_runner.world import free_port

    port = str(free_port())
    return [
        subprocess.Popen(
            [sys.executable, "-m", "mlbench_runner.cli", "train", "--config", str(path)],
            env=env(
                RANK=str(r),
                WORLD_SIZE=str(ranks),
                LOCAL_RANK=str(r),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
                **(extra or {}),
                **(rank_env[r] if r < len(rank_env) else {}),
            ),
            stdout=(logs / f"rank-{r}.log").open("a") if logs else subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(ranks)
    ]


def read_ranks(out: Path, ranks: int) -> list[dict[str, Any]]:
    return [json.loads((out / "ranks" / f"rank-{r}.json").read_text()) for r in range(ranks)]


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def spawn_ranks(target: Callable[..., None], *args: object, ranks: int = 2) -> list[BaseProcess]:
    """``ranks`` spawned processes, each running ``target(rank, port, *args)``: one rendezvous port for all."""
    from mlbench_runner.world import free_port

    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs: list[BaseProcess] = [ctx.Process(target=target, args=(rank, port, *args)) for rank in range(ranks)]
    for p in procs:
        p.start()
    return procs


def join_all(procs: list[BaseProcess], timeout: float) -> None:
    """Wait for each process; every one must have exited 0."""
    for p in procs:
        p.join(timeout)
        assert p.exitcode == 0, f"{p.name} exited {p.exitcode}"
