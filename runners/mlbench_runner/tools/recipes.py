"""Catalog tasks pointed at local data: what the benchmarks train.

Benchmarks must measure the catalog's recipe, not a hand-copied one. These helpers change
only where the data lives and, for smoke runs, how much is trained; everything else (batch,
learning-rate rule, momentum, ...) comes from ``manifests/catalog``.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlbench_api.catalog import get_task
from mlbench_api.contract import ENV_DATA_DIR
from mlbench_api.task import BenchmarkTaskSpec


def shared_cifar10() -> Path:
    """The JPEG copy of CIFAR-10: ``$MLBENCH_DATA_DIR`` or the ``shared/`` beside the checkout."""
    data_dir = os.environ.get(ENV_DATA_DIR)
    root = Path(data_dir) if data_dir else Path(__file__).resolve().parents[4] / "shared" / "datasets"
    return root / "cifar10-jpeg.tar.gz"


def catalog_recipe(
    name: str,
    *,
    data: str | Path | None = None,
    train_subset: int | None = None,
    max_epochs: int | None = None,
    batch: int | None = None,
    target: float | None = None,
) -> BenchmarkTaskSpec:
    """Task ``name`` from the catalog with the data at ``data``; shortened only when asked.

    ``max_epochs`` drops the milestones past the end, and the warm-up is cut to end before it (a
    task's warm-up must be shorter than its maxEpochs): a run of N epochs warms up over at most N - 1.
    With k > 1 its first epochs then follow a steeper rate than the full recipe's; with k = 1 (the
    GPU benchmark) the warm-up starts at the peak rate, so nothing changes.
    """
    spec = get_task(name).spec.to_api()
    dataset, training, goal = spec["dataset"], spec["training"], spec["goal"]
    if data is not None:
        dataset["path"] = str(data)
        dataset.pop("source", None)  # the data is here already; a source would pin the path under /data
    if train_subset is not None:
        dataset["trainSubset"] = train_subset
    if batch is not None:
        training["batchSizePerWorker"] = batch
    if max_epochs is not None and max_epochs < training["maxEpochs"]:
        lr = training["learningRate"]
        training["maxEpochs"] = max_epochs
        lr["milestones"] = [m for m in lr.get("milestones", []) if m < max_epochs]
        lr["warmupEpochs"] = min(lr.get("warmupEpochs", 0), max_epochs - 1)
    if target is not None:
        goal["target"] = target
        if goal.get("lightTarget", 0) > target:
            goal["lightTarget"] = target
    return BenchmarkTaskSpec.model_validate(spec)
