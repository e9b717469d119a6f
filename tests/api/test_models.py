"""Rules of the smaller models that the YAML examples do not reach."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from mlbench_api.common import Condition
from mlbench_api.config import RunConfig
from mlbench_api.errors import format_errors
from mlbench_api.results import RunSummary
from mlbench_api.run import DDP_NEEDS_TORCH_BACKEND, Backend, BenchmarkRunSpec, RunOverrides
from mlbench_api.runstatus import BenchmarkRunStatus
from mlbench_api.task import Overridable
from mlbench_api.training import Algorithm


def _problems(model: type[BaseModel], data: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return format_errors(info.value)


def test_overridable_names_are_exactly_the_override_fields() -> None:
    fields = {info.alias for info in RunOverrides.model_fields.values()}
    assert {o.value for o in Overridable} == fields


def test_condition_status_must_be_true_false_unknown() -> None:
    now = datetime.now(UTC).isoformat()
    problems = _problems(Condition, {"type": "Ready", "status": "Maybe", "reason": "X", "lastTransitionTime": now})
    assert problems[0].startswith("status: Input should be 'True', 'False' or 'Unknown'")


def test_condition_reason_is_camel_case_identifier() -> None:
    now = datetime.now(UTC).isoformat()
    problems = _problems(Condition, {"type": "Ready", "status": "True", "reason": "not ok", "lastTransitionTime": now})
    assert problems[0].startswith("reason: String should match pattern")


def test_status_rejects_unknown_phase() -> None:
    assert _problems(BenchmarkRunStatus, {"phase": "Done"})[0].startswith("phase: Input should be")


def test_run_config_needs_a_positive_world_size() -> None:
    problems = _problems(RunConfig, {"worldSize": 0})
    assert any(p.startswith("worldSize: Input should be greater than or equal to 1") for p in problems)
    assert any(p.startswith("taskName: Field required") for p in problems)


def test_summary_names_missing_fields() -> None:
    problems = _problems(RunSummary, {"run": "r", "task": "t", "status": "exploded"})
    assert any(p.startswith("status: Input should be") for p in problems)
    assert any(p.startswith("goalReached: Field required") for p in problems)


def test_override_names_use_wire_names() -> None:
    assert RunOverrides(max_epochs=3, batch_size_per_worker=8).names() == ["batchSizePerWorker", "maxEpochs"]


@pytest.mark.parametrize("backend", list(Backend))
@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_ddp_is_refused_with_backend_mpi_only(algorithm: Algorithm, backend: Backend) -> None:
    data = {"taskRef": {"name": "t"}, "algorithm": algorithm.value, "backend": backend.value, "resources": {"gpu": 1}}
    if algorithm is Algorithm.DDP and backend is Backend.MPI:
        assert _problems(BenchmarkRunSpec, data) == [f"algorithm: {DDP_NEEDS_TORCH_BACKEND}"]
    else:
        assert BenchmarkRunSpec.model_validate(data).algorithm is algorithm


def test_ddp_with_mpi_names_the_field_in_a_whole_run() -> None:
    from mlbench_api.catalog import parse_run
    from mlbench_api.errors import InvalidObject

    doc = {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkRun",
        "metadata": {"name": "r"},
        "spec": {"taskRef": {"name": "t"}, "algorithm": "ddp", "backend": "mpi"},
    }
    with pytest.raises(InvalidObject) as info:
        parse_run(doc)
    assert info.value.problems == ["spec.algorithm: ddp needs backend gloo or nccl (torch.distributed), not mpi"]


@pytest.mark.parametrize(
    ("quantity", "valid"),
    [
        ("2", True),
        ("500m", True),
        ("1.5", True),
        (".5", True),
        ("8Gi", True),
        ("1Ki", True),
        ("1Ei", True),
        ("100k", True),  # decimal SI kilo is a lowercase k
        ("1M", True),
        ("1E", True),  # exa
        ("10n", True),
        ("10u", True),
        ("1e3", True),  # decimal exponent
        ("1E-2", True),
        ("+4", True),
        ("1K", False),  # Kubernetes has no K: k or Ki
        ("1Mb", False),
        ("1mi", False),
        ("1ki", False),
        ("1KiB", False),
        ("Gi", False),
        ("1 Gi", False),
        ("-1", False),
    ],
)
def test_resource_quantities_follow_the_kubernetes_grammar(quantity: str, valid: bool) -> None:
    data = {"taskRef": {"name": "t"}, "resources": {"memory": quantity}}
    if valid:
        BenchmarkRunSpec.model_validate(data)
    else:
        assert _problems(BenchmarkRunSpec, data)[0].startswith("resources.memory: ")


@pytest.mark.parametrize(("length", "valid"), [(1, True), (63, True), (64, False), (253, False)])
def test_task_ref_name_fits_a_label_value(length: int, valid: bool) -> None:
    """taskRef.name becomes the mlbench.io/task label of the run's pods: a longer one fails every create."""
    data = {"taskRef": {"name": "t" * length}}
    if valid:
        BenchmarkRunSpec.model_validate(data)
    else:
        assert _problems(BenchmarkRunSpec, data) == ["taskRef.name: String should have at most 63 characters"]


def test_a_task_name_longer_than_a_label_value_is_refused() -> None:
    from mlbench_api.task import BenchmarkTask
    from tests.operator import helpers as h

    task = h.task()
    task["metadata"]["name"] = "t" * 63
    BenchmarkTask.model_validate(task)
    task["metadata"]["name"] = "t" * 64
    assert _problems(BenchmarkTask, task) == [
        "metadata.name: at most 63 characters, as runs label their pods with it (mlbench.io/task)"
    ]


@pytest.mark.parametrize(
    ("volume", "problem"),
    [
        ({"nfs": {"server": "s", "path": "/x"}}, None),
        (
            {"name": "x", "nfs": {"server": "s", "path": "/x"}},
            "dataset.volume.name: must not be set: volume is a VolumeSource, the operator names the volume itself",
        ),
        ({"name": "data", "emptyDir": {}}, "dataset.volume.name: must not be set"),
    ],
)
def test_dataset_volume_has_no_name(volume: dict[str, Any], problem: str | None) -> None:
    """The operator mounts the volume named data; a name of its own would rename it away from its mount."""
    from mlbench_api.task import BenchmarkTaskSpec
    from tests.operator import helpers as h

    spec = h.task()["spec"]
    spec["dataset"] = {"name": "epsilon", "format": "libsvm", "path": "/data/epsilon", "volume": volume}
    if problem is None:
        BenchmarkTaskSpec.model_validate(spec)
    else:
        assert _problems(BenchmarkTaskSpec, spec)[0].startswith(problem)
