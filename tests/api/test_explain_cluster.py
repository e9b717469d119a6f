"""``kubectl explain`` shows the models' descriptions, through a real API server.

The ``kube_cluster`` fixture installs the committed CRDs (``crds/bases``); the API server
publishes their schemas as OpenAPI v3, which is what ``kubectl explain`` reads. The server
refreshes that document a moment after a CRD changes, so the checks poll briefly, and every
kubectl call gets a fresh ``--cache-dir`` so that no cached document from an older CRD answers.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from mlbench_api.common import Condition
from mlbench_api.crdgen import KINDS
from mlbench_api.dataspec import DatasetSource
from mlbench_api.goal import Goal
from mlbench_api.run import BenchmarkRunSpec, TaskRef
from mlbench_api.runstatus import BenchmarkRunStatus, RunResult
from mlbench_api.scheduling import Toleration
from mlbench_api.task import BenchmarkTaskSpec
from tests.api.crdschema import committed_schema, properties, undescribed
from tests.cluster.plugin import KubeCluster

pytestmark = pytest.mark.cluster

GROUP_VERSION = "mlbench.io/v1alpha1"
#: How long the published OpenAPI may lag behind a CRD just applied.
PUBLISH_TIMEOUT = 60.0


def _words(text: str) -> str:
    """Whitespace collapsed: kubectl wraps descriptions at 80 columns and indents them."""
    return " ".join(text.split())


def _description(model: type[BaseModel], field: str) -> str:
    description = model.model_fields[field].description
    assert description, f"{model.__name__}.{field} has no description"
    return _words(description.replace("``", "`"))


def _kubectl(kube_cluster: KubeCluster, tmp_path: Path, *args: str) -> Any:
    cache = tmp_path / f"kubectl-cache-{time.monotonic_ns()}"
    return kube_cluster.kubectl(f"--cache-dir={cache}", *args)


def _explain_until(kube_cluster: KubeCluster, tmp_path: Path, path: str, expected: str) -> str:
    """``kubectl explain <path>``'s output once it shows ``expected`` (or the last one, for the message)."""
    deadline = time.monotonic() + PUBLISH_TIMEOUT
    while True:
        res = _kubectl(kube_cluster, tmp_path, "explain", path)
        output = res.stdout + res.stderr
        if (res.returncode == 0 and expected in _words(res.stdout)) or time.monotonic() > deadline:
            return str(output)
        time.sleep(1)


@pytest.mark.parametrize(
    ("path", "model", "field"),
    [
        ("benchmarkrun.spec.workers", BenchmarkRunSpec, "workers"),
        ("benchmarkrun.spec.algorithm", BenchmarkRunSpec, "algorithm"),
        ("benchmarkrun.spec.slotsPerWorker", BenchmarkRunSpec, "slots_per_worker"),
        ("benchmarkrun.spec.taskRef.name", TaskRef, "name"),
        ("benchmarkrun.spec.scheduling.tolerations.effect", Toleration, "effect"),
        ("benchmarkrun.status.phase", BenchmarkRunStatus, "phase"),
        ("benchmarkrun.status.conditions.lastTransitionTime", Condition, "last_transition_time"),
        ("benchmarkrun.status.result.timeToGoalSeconds", RunResult, "time_to_goal_seconds"),
        ("benchmarktask.spec.goal", BenchmarkTaskSpec, "goal_spec"),
        ("benchmarktask.spec.goal.target", Goal, "target"),
        ("benchmarktask.spec.dataset.source.sha256", DatasetSource, "sha256"),
    ],
)
def test_kubectl_explain_shows_the_model_description(
    kube_cluster: KubeCluster, tmp_path: Path, path: str, model: type[BaseModel], field: str
) -> None:
    expected = _description(model, field)
    output = _explain_until(kube_cluster, tmp_path, path, expected)
    assert f"FIELD: {path.rsplit('.', 1)[-1]} " in output, output
    assert expected in _words(output), f"kubectl explain {path} lacks {expected!r}:\n{output}"


def test_kubectl_explain_lists_nested_fields_with_their_descriptions(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    expected = _description(Goal, "light_target")
    output = _explain_until(kube_cluster, tmp_path, "benchmarktask.spec.goal", expected)
    assert "lightTarget\t<number>" in output, output
    assert expected in _words(output), output


def test_the_published_schema_describes_every_field(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    """What the server publishes (and kubectl explain reads) carries every description unchanged."""
    deadline = time.monotonic() + PUBLISH_TIMEOUT
    while True:
        res = _kubectl(kube_cluster, tmp_path, "get", "--raw", f"/openapi/v3/apis/{GROUP_VERSION}")
        assert res.returncode == 0, res.stderr
        schemas = json.loads(res.stdout)["components"]["schemas"]
        differences: list[str] = []
        for kind in KINDS:
            root = kind.kind.lower()
            published = schemas[f"io.mlbench.v1alpha1.{kind.kind}"]
            assert published["properties"]["metadata"].get("description"), "the server describes metadata itself"
            assert undescribed(published, root) == []
            theirs = {path: node.get("description") for path, node in properties(published, root)}
            ours = {path: node.get("description") for path, node in properties(committed_schema(kind), root)}
            ours.pop(f"{root}.metadata")
            differences += [
                f"{path}: {theirs.get(path)!r} != {text!r}" for path, text in ours.items() if theirs.get(path) != text
            ]
        if not differences or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not differences, "\n".join(differences)
