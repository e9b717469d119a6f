"""Shared test data for the operator tests: a task, runs, pods, summaries."""

from __future__ import annotations

import copy
from typing import Any

from mlbench_operator.policy import DEFAULT_VOLUME_TYPES, AdmissionPolicy
from tests.factories import TASK_NAME

#: For tests of builders with other images or volumes than the default policy admits.
PERMISSIVE = AdmissionPolicy(
    images=("*",),
    volume_types=(*DEFAULT_VOLUME_TYPES, "hostPath"),
    priority_classes=("*",),
    node_selector_keys=("*",),
    toleration_keys=("*",),
    env_names=("*",),
    pod_annotations=("*",),
    pod_labels=("*",),
    extended_resources=("*",),
    allow_host_network=True,
    allow_host_ipc=True,
    scheduler_names=("*",),
)

TASK: dict[str, Any] = {
    "apiVersion": "mlbench.io/v1alpha1",
    "kind": "BenchmarkTask",
    "metadata": {"name": TASK_NAME},
    "spec": {
        "division": "closed",
        "model": {"name": "resnet", "version": "m1", "depth": 20},
        "dataset": {
            "name": "cifar10",
            "format": "cifar10-python",
            "path": "/data/cifar10",
        },
        "training": {
            "batchSizePerWorker": 32,
            "learningRate": {
                "schedule": "multistep",
                "perSample": 0.000390625,
                "warmupEpochs": 5,
                "milestones": [82, 109],
            },
            "momentum": 0.9,
            "nesterov": True,
            "maxEpochs": 164,
        },
        "goal": {"target": 0.8, "lightTarget": 0.7},
        "runner": {"image": "localhost/mlbench/mlbench-runner:test"},
        "overridable": ["model", "dataset"],
    },
}


def task(name: str = TASK_NAME) -> dict[str, Any]:
    out = copy.deepcopy(TASK)
    out["metadata"]["name"] = name
    return out


def run(
    name: str = "r1",
    namespace: str = "ns",
    workers: int = 2,
    task_name: str = TASK_NAME,
    **spec: Any,
) -> dict[str, Any]:
    """A BenchmarkRun body as the API server would return it."""
    return {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkRun",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
        "spec": {"taskRef": {"name": task_name}, "workers": workers, **spec},
    }


#: The smoke tarball's sha256 (shared/datasets/cifar10-jpeg.tar.gz).
JPEG_SHA256 = "0493b9c94c62a5e8a6b98a28016b4eebed4fa9aac8154143eead5d26fc94fabb"


def sourced_task(name: str = TASK_NAME, url: str = "http://datasets.example/cifar10-jpeg.tar.gz") -> dict[str, Any]:
    """The test task with a dataset the operator fetches into the namespace's dataset volume."""
    out = task(name)
    out["spec"]["dataset"] = {
        "name": "cifar10-jpeg",
        "format": "image-tarball",
        "path": "/data/cifar10/cifar10-jpeg.tar.gz",
        "source": {"url": url, "sha256": JPEG_SHA256},
    }
    return out
