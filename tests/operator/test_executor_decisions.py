"""The executor's small decisions between the status it holds and the next one (mlbench_operator.run.status),
one table each: which status a failed pass plans from, whether a restart is new, whether the workers just
became ready."""

from __future__ import annotations

from typing import Any

import pytest

from mlbench_operator.run.status import first_ready, kept_after_failure, restarted


def _ready(value: str) -> list[dict[str, Any]]:
    return [{"type": "WorkersReady", "status": value, "reason": "r"}]


OURS = "ours"
LIVE = "live"


@pytest.mark.parametrize(
    ("ours", "live", "kept"),
    [
        pytest.param({"phase": "Running"}, {"phase": "Running"}, LIVE, id="nothing newer: the cluster's"),
        pytest.param({"phase": "Succeeded"}, {"phase": "Running"}, OURS, id="ours finished: ours"),
        pytest.param({"phase": "Failed"}, {"phase": "Running"}, OURS, id="ours failed: ours"),
        pytest.param({"restarts": 2}, {"restarts": 1}, OURS, id="ours counts more restarts: ours"),
        pytest.param({"restarts": 1}, {"restarts": 1}, LIVE, id="as many restarts: the cluster's"),
        pytest.param({"restarts": 1}, {"restarts": 2}, LIVE, id="the cluster's counts more: the cluster's"),
        pytest.param({"phase": "Running"}, {"phase": "Succeeded"}, LIVE, id="the cluster's finished: the cluster's"),
        pytest.param({}, {}, LIVE, id="both empty: the cluster's"),
    ],
)
def test_the_status_a_failed_pass_plans_from(ours: dict[str, Any], live: dict[str, Any], kept: str) -> None:
    assert kept_after_failure(ours, live) is (ours if kept == OURS else live)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({}, {}, False),
        ({}, {"restarts": 1}, True),
        ({"restarts": 1}, {"restarts": 1}, False),
        ({"restarts": 1}, {"restarts": 2}, True),
        ({"restarts": 2}, {"restarts": 1}, False),
    ],
)
def test_a_restart_is_new_once(old: dict[str, Any], new: dict[str, Any], expected: bool) -> None:
    assert restarted(old, new) is expected


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param({}, {"conditions": _ready("True")}, True, id="first ready"),
        pytest.param({"conditions": _ready("False")}, {"conditions": _ready("True")}, True, id="false to true"),
        pytest.param({"conditions": _ready("True")}, {"conditions": _ready("True")}, False, id="already ready"),
        pytest.param({}, {"conditions": _ready("False")}, False, id="not ready"),
        pytest.param({}, {"conditions": _ready("True"), "restarts": 1}, False, id="ready again after a restart"),
    ],
)
def test_the_workers_became_ready_for_the_first_time(old: dict[str, Any], new: dict[str, Any], expected: bool) -> None:
    assert first_ready(old, new) is expected
