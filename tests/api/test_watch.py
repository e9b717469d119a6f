"""``mlbench watch``: the lines a run's status prints as and the exit code its events end the watch with."""

from __future__ import annotations

from typing import Any

import pytest

from mlbench_api.badinput import EXIT_BAD_INPUT
from mlbench_api.watch import (
    EXIT_DELETED,
    EXIT_FAILED,
    EXIT_SUCCEEDED,
    EXIT_UNAVAILABLE,
    follow_events,
    outcome,
    status_line,
)


def run(status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "r", "namespace": "ns"}, "spec": {"workers": 2}}
    if status is not None:
        obj["status"] = status
    return obj


RUNNING = run(
    {"phase": "Running", "workers": {"ready": 2, "total": 2}, "progress": {"epoch": 2.5, "lastAccuracy": 0.41234}}
)
SUCCEEDED = run(
    {
        "phase": "Succeeded",
        "progress": {"epoch": 8.0, "lastAccuracy": 0.8},
        "result": {"goalReached": True, "timeToGoalSeconds": 6.497854486000506},
    }
)
FAILED = run(
    {
        "phase": "Failed",
        "message": "worker 1 was OOMKilled",
        "conditions": [{"type": "Failed", "status": "True", "reason": "OOMKilled"}],
    }
)


def test_status_line_reads_at_a_glance() -> None:
    assert status_line(run()) == "Pending"
    assert status_line(RUNNING) == "Running  epoch 2.5  accuracy 41.2%  workers 2/2"
    assert status_line(SUCCEEDED) == "Succeeded  epoch 8  accuracy 80.0%  goal reached  time to goal 6.5s"
    translated = run({"phase": "Running", "progress": {"epoch": 3, "lastScore": 24.31, "score": "24.3 BLEU"}})
    assert status_line(translated) == "Running  epoch 3  score 24.3 BLEU"
    assert status_line(FAILED) == "Failed  reason OOMKilled  worker 1 was OOMKilled"
    midway = run({"phase": "Running", "progress": {"epoch": 2.96875}})
    assert status_line(midway) == "Running  epoch 2.9"  # as the EPOCH column: cut to tenths


@pytest.mark.parametrize(
    ("event", "obj", "code"),
    [
        ("ADDED", run(), None),
        ("MODIFIED", RUNNING, None),
        ("MODIFIED", SUCCEEDED, EXIT_SUCCEEDED),
        ("MODIFIED", FAILED, EXIT_FAILED),
        ("MODIFIED", run({"phase": "Suspended"}), None),
        ("MODIFIED", run({"phase": "Starting"}), None),
        ("DELETED", RUNNING, EXIT_DELETED),
        ("DELETED", SUCCEEDED, EXIT_DELETED),
    ],
)
def test_outcome_ends_the_watch_only_when_the_run_ends(event: str, obj: dict[str, Any], code: int | None) -> None:
    assert outcome(event, obj) == code


def test_follow_prints_each_change_once_and_stops_at_the_end() -> None:
    said: list[str] = []
    events = [
        ("ADDED", run()),
        ("MODIFIED", RUNNING),
        ("MODIFIED", RUNNING),
        ("MODIFIED", FAILED),
        ("MODIFIED", RUNNING),
    ]
    code, last = follow_events(events, lambda line, _obj: said.append(line))
    assert code == EXIT_FAILED
    assert said == [status_line(run()), status_line(RUNNING), status_line(FAILED)]
    assert last == status_line(FAILED)


def test_follow_without_an_end_asks_for_a_new_watch_and_remembers_the_last_line() -> None:
    said: list[str] = []
    code, last = follow_events([("MODIFIED", RUNNING)], lambda line, _obj: said.append(line), last=status_line(RUNNING))
    assert (code, said, last) == (None, [], status_line(RUNNING))


def test_each_outcome_has_its_own_exit_code() -> None:
    """A script tells a failed run from a deleted one, from a watch that could not read it, from bad input."""
    codes = [EXIT_SUCCEEDED, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DELETED, EXIT_UNAVAILABLE]
    assert len(set(codes)) == len(codes)
    assert EXIT_SUCCEEDED == 0


def test_a_deletion_ends_the_watch_with_its_own_line_and_code() -> None:
    said: list[str] = []
    code, _ = follow_events([("MODIFIED", RUNNING), ("DELETED", RUNNING)], lambda line, _obj: said.append(line))
    assert (code, said[-1]) == (EXIT_DELETED, "deleted while watched")
