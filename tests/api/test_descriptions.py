"""Every field of both CRDs has a description, taken from the pydantic models, so that
``kubectl explain`` documents the whole API (spec and status, nested objects included).

A field is described by a docstring right under it (``use_attribute_docstrings`` on
``ApiModel``) or by ``Field(description=...)``; ``mlbench_api.crdgen`` carries it through
``$ref``, ``allOf`` and optional ``anyOf`` into the generated schema.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import BaseModel

from mlbench_api.common import Condition
from mlbench_api.crdgen import KINDS, CrdSpec
from mlbench_api.dataspec import DatasetSource
from mlbench_api.goal import Goal
from mlbench_api.run import BenchmarkRunSpec, Resources, TaskRef
from mlbench_api.runstatus import BenchmarkRunStatus, RunResult
from mlbench_api.schedule import LearningRate
from mlbench_api.scheduling import Toleration
from mlbench_api.task import BenchmarkTaskSpec
from tests.api.crdschema import committed_schema, properties, undescribed

#: Longest description allowed: they are meant to be one or two sentences.
MAX_DESCRIPTION = 320


def _by_path(kind: CrdSpec) -> dict[str, dict[str, Any]]:
    return dict(properties(committed_schema(kind), kind.kind.lower()))


def _text(model: type[BaseModel], field: str) -> str:
    """A field's description as crdgen writes it (whitespace collapsed, ``x`` as `x`)."""
    description = model.model_fields[field].description
    assert description, f"{model.__name__}.{field} has no description"
    return " ".join(description.replace("``", "`").split())


RUN, TASK = (next(k for k in KINDS if k.kind == name) for name in ("BenchmarkRun", "BenchmarkTask"))


@pytest.mark.parametrize("kind", KINDS, ids=[k.kind for k in KINDS])
def test_every_field_has_a_description(kind: CrdSpec) -> None:
    missing = undescribed(committed_schema(kind), kind.kind.lower())
    assert not missing, (
        f"{len(missing)} field(s) of {kind.kind} have no description; add a docstring under the field "
        "in crds/mlbench_api and run `make crds`:\n  " + "\n  ".join(missing)
    )


def test_the_check_lists_every_undescribed_field() -> None:
    schema = copy.deepcopy(committed_schema(RUN))
    spec = schema["properties"]["spec"]["properties"]
    del spec["workers"]["description"]
    spec["scheduling"]["properties"]["tolerations"]["items"]["properties"]["key"]["description"] = " "
    del schema["properties"]["status"]["properties"]["result"]["properties"]["worldSize"]["description"]
    assert undescribed(schema, "benchmarkrun") == [
        "benchmarkrun.spec.workers",
        "benchmarkrun.spec.scheduling.tolerations[].key",
        "benchmarkrun.status.result.worldSize",
    ]


@pytest.mark.parametrize("kind", KINDS, ids=[k.kind for k in KINDS])
def test_the_walk_reaches_nested_objects_arrays_and_the_status(kind: CrdSpec) -> None:
    paths = set(_by_path(kind))
    if kind is RUN:
        assert {
            "benchmarkrun.spec.scheduling.tolerations[].tolerationSeconds",
            "benchmarkrun.status.conditions[].lastTransitionTime",
            "benchmarkrun.status.taskSnapshot.training.learningRate.alphaByWorkers[].minWorkers",
        } <= paths
    elif kind is TASK:
        assert "benchmarktask.spec.dataset.source.stripComponents" in paths
    else:
        assert "benchmarksweep.spec.template.scheduling.tolerations[].key" in paths


@pytest.mark.parametrize(
    ("kind", "path", "model", "field"),
    [
        # a plain field, described by the docstring under it
        (RUN, "spec.workers", BenchmarkRunSpec, "workers"),
        # a required nested model ($ref): the field's docstring, not the class docstring
        (RUN, "spec.taskRef", BenchmarkRunSpec, "task_ref"),
        (RUN, "spec.taskRef.name", TaskRef, "name"),
        # an optional nested model (anyOf [$ref, null])
        (RUN, "spec.resources", BenchmarkRunSpec, "resources"),
        # an int-or-string quantity
        (RUN, "spec.resources.cpu", Resources, "cpu"),
        # an enum ($ref to the enum's definition)
        (RUN, "spec.backend", BenchmarkRunSpec, "backend"),
        (RUN, "spec.algorithm", BenchmarkRunSpec, "algorithm"),
        # Field(description=...)
        (RUN, "spec.slotsPerWorker", BenchmarkRunSpec, "slots_per_worker"),
        # items of an array of models
        (RUN, "spec.scheduling.tolerations[].effect", Toleration, "effect"),
        # the status, conditions included
        (RUN, "status.phase", BenchmarkRunStatus, "phase"),
        (RUN, "status.conditions[].reason", Condition, "reason"),
        (RUN, "status.result.timeToGoalSeconds", RunResult, "time_to_goal_seconds"),
        # the task's spec, also as the run's snapshot of it
        (RUN, "status.taskSnapshot.goal.target", Goal, "target"),
        (TASK, "spec.goal", BenchmarkTaskSpec, "goal_spec"),
        (TASK, "spec.goal.target", Goal, "target"),
        (TASK, "spec.goal.timeBudgetSeconds", Goal, "time_budget_seconds"),
        (TASK, "spec.training.learningRate.milestones", LearningRate, "milestones"),
        (TASK, "spec.dataset.source.sha256", DatasetSource, "sha256"),
    ],
)
def test_descriptions_come_from_the_models(kind: CrdSpec, path: str, model: type[BaseModel], field: str) -> None:
    node = _by_path(kind)[f"{kind.kind.lower()}.{path}"]
    assert node["description"] == _text(model, field)


def test_a_field_docstring_wins_over_its_type_docstring() -> None:
    runs = _by_path(RUN)
    assert TaskRef.__doc__ is not None
    assert runs["benchmarkrun.spec.taskRef"]["description"] != " ".join(TaskRef.__doc__.split())


@pytest.mark.parametrize("kind", KINDS, ids=[k.kind for k in KINDS])
def test_descriptions_are_short_plain_text(kind: CrdSpec) -> None:
    for path, node in properties(committed_schema(kind), kind.kind.lower()):
        text = node.get("description", "")
        assert len(text) <= MAX_DESCRIPTION or path.split(".")[-1] in {"apiVersion", "kind"}, (path, len(text))
        assert "``" not in text, path
        assert "\n" not in text, path
