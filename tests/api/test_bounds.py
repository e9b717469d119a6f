"""Values the API server cannot store never reach a status, and time bounds are Kubernetes' own.

The API server refuses NaN and Infinity (not JSON) and integers beyond 2^53 in a status patch; an
operator that copied one there would retry the patch forever. ``activeDeadlineSeconds`` and
``ttlSecondsAfterFinished`` near 1e14 overflowed ``timedelta`` on every pass.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from mlbench_api.common import MAX_INT32, MAX_SAFE_INT
from mlbench_api.errors import format_errors
from mlbench_api.results import Environment, EpochRecord, PhaseTotals, RunSummary
from mlbench_api.runpolicy import RunPolicy
from mlbench_api.runstatus import Progress, RunResult
from tests.factories import summary

BASES = Path(__file__).resolve().parents[2] / "crds" / "bases"


def _summary() -> dict[str, Any]:
    """A valid termination message's data (history included, to reach EpochRecord too)."""
    return summary(
        comm_compute_ratio=0.25,
        phases=PhaseTotals(data=1, forward=4, backward=6, communication=3, optimizer=2, evaluation=1),
        environment=Environment(world_size=4, backend="gloo", seed=42),
        history=[EpochRecord(epoch=1, accuracy=0.5, loss=1.0, wall_seconds=5.0, lr=0.1)],
    ).model_dump(mode="json", by_alias=True, exclude_none=True)


def _numeric_leaves(data: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, bool):
        return []
    if isinstance(data, int | float):
        return [(path, data)]
    if isinstance(data, dict):
        return [leaf for k, v in data.items() for leaf in _numeric_leaves(v, f"{path}.{k}" if path else k)]
    if isinstance(data, list):
        return [leaf for i, v in enumerate(data) for leaf in _numeric_leaves(v, f"{path}.{i}")]
    return []


def _with(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(data))
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[last] = value
    return data


def _message(data: dict[str, Any]) -> str:
    # json.dumps writes NaN/Infinity as the bare tokens Python's json (and so the launcher's) would emit
    return json.dumps(data, separators=(",", ":"))


LEAVES = _numeric_leaves(_summary())
INT_LEAVES = [p for p, v in LEAVES if isinstance(v, int)]
FLOAT_LEAVES = [p for p, _ in LEAVES if p not in INT_LEAVES]


def test_every_numeric_field_of_the_summary_is_covered() -> None:
    assert set(INT_LEAVES) == {"steps", "samples", "environment.worldSize", "environment.seed", "history.0.epoch"}
    assert "phases.forward" in FLOAT_LEAVES
    assert "history.0.lr" in FLOAT_LEAVES
    assert len(FLOAT_LEAVES) >= 20


@pytest.mark.parametrize("path", INT_LEAVES)
@pytest.mark.parametrize("value", [10**30, 2**53, -(2**53)], ids=["1e30", "2^53", "-2^53"])
def test_termination_message_refuses_integers_beyond_2_53(path: str, value: int) -> None:
    with pytest.raises(ValueError, match=rf"termination message: {path}: Input should be"):
        RunSummary.from_termination_message(_message(_with(_summary(), path, value)))


@pytest.mark.parametrize("path", FLOAT_LEAVES)
@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_termination_message_refuses_non_finite_numbers(path: str, token: str) -> None:
    text = _message(_with(_summary(), path, "@@")).replace('"@@"', token)
    with pytest.raises(ValueError, match=rf"termination message: {path}: Input should be a finite number"):
        RunSummary.from_termination_message(text)


@pytest.mark.parametrize("path", INT_LEAVES)
def test_largest_safe_integer_is_accepted(path: str) -> None:
    data = _with(_summary(), path, MAX_SAFE_INT)
    summary = RunSummary.from_termination_message(_message(data))
    assert json.loads(summary.termination_message())  # strict JSON again


@pytest.mark.parametrize("value", [MAX_SAFE_INT, 5e-324, 1.7976931348623157e308, 0.0, -0.0])
def test_a_parsed_summary_always_dumps_to_strict_json(value: float) -> None:
    """Extreme finite numbers (the largest safe integer, the smallest subnormal, the largest double) come
    back from the termination message exactly and dump to strict JSON again."""
    summary = RunSummary.from_termination_message(_message(_with(_summary(), "wallClockSeconds", value)))
    dumped = json.dumps(summary.model_dump(mode="json", by_alias=True), allow_nan=False)
    assert json.loads(dumped)["wallClockSeconds"] == value


@pytest.mark.parametrize("text", ["1" * 5000, '{"steps": ' + "9" * 5000 + "}"])
def test_an_integer_python_refuses_to_convert_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="termination message is not JSON"):
        RunSummary.from_termination_message(text)


# -- status.result and status.progress: the models the status patch is built from -----------------------------
RESULT_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("worldSize 1e30", {"worldSize": 10**30}, "worldSize: Input should be less than or equal to 9007199254740991"),
    ("worldSize 2^53", {"worldSize": 2**53}, "worldSize: Input should be less than or equal to"),
    ("NaN accuracy", {"bestAccuracy": math.nan}, "bestAccuracy: Input should be a finite number"),
    ("infinite epochs", {"epochs": math.inf}, "epochs: Input should be a finite number"),
    ("-inf wall clock", {"wallClockSeconds": -math.inf}, "wallClockSeconds: Input should be a finite number"),
    ("NaN throughput", {"samplesPerSecond": math.nan}, "samplesPerSecond: Input should be a finite number"),
]


@pytest.mark.parametrize(("fields", "problem"), [c[1:] for c in RESULT_CASES], ids=[c[0] for c in RESULT_CASES])
def test_run_result_refuses_what_the_api_server_cannot_store(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        RunResult.model_validate({"goalReached": True, **fields})
    assert any(p.startswith(problem) for p in format_errors(info.value)), format_errors(info.value)


PROGRESS_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("step 2^53", {"step": 2**53}, "step: Input should be less than or equal to"),
    ("NaN epoch", {"epoch": math.nan}, "epoch: Input should be a finite number"),
    ("infinite throughput", {"samplesPerSecond": math.inf}, "samplesPerSecond: Input should be a finite number"),
]


@pytest.mark.parametrize(("fields", "problem"), [c[1:] for c in PROGRESS_CASES], ids=[c[0] for c in PROGRESS_CASES])
def test_progress_refuses_what_the_api_server_cannot_store(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        Progress.model_validate(fields)
    assert any(p.startswith(problem) for p in format_errors(info.value)), format_errors(info.value)


# -- runPolicy: bounded like a Pod's activeDeadlineSeconds and a Job's ttlSecondsAfterFinished (int32) --------
POLICY_CASES: list[tuple[str, int, bool]] = [
    ("activeDeadlineSeconds", 1, True),
    ("activeDeadlineSeconds", MAX_INT32, True),
    ("activeDeadlineSeconds", MAX_INT32 + 1, False),
    ("activeDeadlineSeconds", 10**14, False),
    ("activeDeadlineSeconds", 0, False),
    ("ttlSecondsAfterFinished", 0, True),
    ("ttlSecondsAfterFinished", MAX_INT32, True),
    ("ttlSecondsAfterFinished", MAX_INT32 + 1, False),
    ("ttlSecondsAfterFinished", 10**14, False),
    ("ttlSecondsAfterFinished", -1, False),
]


@pytest.mark.parametrize(("field", "value", "valid"), POLICY_CASES, ids=[f"{f}={v}" for f, v, _ in POLICY_CASES])
def test_run_policy_time_bounds(field: str, value: int, valid: bool) -> None:
    if valid:
        assert RunPolicy.model_validate({field: value}).to_api()[field] == value
        return
    with pytest.raises(ValidationError) as info:
        RunPolicy.model_validate({field: value})
    assert format_errors(info.value)[0].startswith(f"{field}: Input should be")


def test_max_int32_is_kubernetes_bound() -> None:
    assert MAX_INT32 == 2_147_483_647


def _crd_schema() -> dict[str, Any]:
    doc = yaml.safe_load((BASES / "mlbench.io_benchmarkruns.yaml").read_text())
    schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_crd_bounds_run_policy_like_kubernetes() -> None:
    policy = _crd_schema()["properties"]["spec"]["properties"]["runPolicy"]["properties"]
    assert (policy["activeDeadlineSeconds"]["minimum"], policy["activeDeadlineSeconds"]["maximum"]) == (1, MAX_INT32)
    assert (policy["ttlSecondsAfterFinished"]["minimum"], policy["ttlSecondsAfterFinished"]["maximum"]) == (
        0,
        MAX_INT32,
    )


@pytest.mark.parametrize("part", ["result", "progress"])
def test_crd_bounds_every_integer_of_result_and_progress(part: str) -> None:
    props = _crd_schema()["properties"]["status"]["properties"][part]["properties"]
    integers = {name: p for name, p in props.items() if p.get("type") == "integer"}
    assert integers
    for name, prop in integers.items():
        assert prop.get("maximum", math.inf) <= MAX_SAFE_INT, name
        assert prop.get("minimum", -math.inf) >= -MAX_SAFE_INT, name
