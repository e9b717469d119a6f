"""The launcher's verdict (:func:`mlbench_runner.pod.launch.verdict`): the termination message and exit status
from mpirun's exit code, whether the launcher passed on a stop signal, and what the ranks printed. A table of
hand-made cases; no process is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlbench_api.results import RunStatus, RunSummary, StopReason
from mlbench_runner.pod.launch import RankOutput, failure_reason, verdict
from tests.factories import summary_for

from .helpers import logreg_task, make_config


def _summary(status: RunStatus, reason: StopReason) -> RunSummary:
    summary = summary_for(make_config(logreg_task(), Path("/out"), 2), ttg=None)
    return summary.model_copy(update={"status": status, "stop_reason": reason})


def _out(*summaries: RunSummary, causes: tuple[str, ...] = ()) -> RankOutput:
    return RankOutput(found=list(summaries), causes=list(causes), tail=["last words"])


@pytest.mark.parametrize(
    ("summary", "code", "stopped", "status", "stop_reason"),
    [
        (("success", "goal"), 0, False, 0, "goal"),
        (("goal-not-reached", "max-epochs"), 0, False, 0, "max-epochs"),
        (("aborted", "interrupted"), 3, False, 3, "interrupted"),  # every rank exits 3 on an aborted run
        (("aborted", "diverged"), 0, False, 3, "diverged"),
        (("aborted", "interrupted"), 137, True, 3, "interrupted"),  # the launcher's stop: mpirun's own code aside
        (("aborted", "error"), 1, True, 3, "interrupted"),  # a peer took the stop first: the stop ended it
    ],
)
def test_a_summary_is_the_verdict(
    summary: tuple[RunStatus, StopReason], code: int, stopped: bool, status: int, stop_reason: str
) -> None:
    message, exit_code = verdict(_out(_summary(*summary)), code, stopped)
    assert exit_code == status
    data = json.loads(message)
    assert (data["status"], data["stopReason"]) == (summary[0], stop_reason)


@pytest.mark.parametrize(
    ("found", "code", "status", "reason"),
    [
        (False, 0, 1, "no run summary from rank 0"),
        (False, 1, 1, "mpirun exited with 1"),
        (False, -9, 137, "mpirun was killed by signal 9"),
        (True, 1, 1, "mpirun exited with 1"),  # an aborted summary, but a rank crashed: the crash is the verdict
        (True, 139, 139, "mpirun exited with 139"),
    ],
)
def test_a_failure_is_the_verdict(found: bool, code: int, status: int, reason: str) -> None:
    out = _out(*([_summary("aborted", "error")] if found else []), causes=("rank 1: RuntimeError: boom",))
    message, exit_code = verdict(out, code, stopped=False)
    data = json.loads(message)
    assert (exit_code, data["exitCode"]) == (status, status)
    assert data["error"].startswith(reason)
    assert "RuntimeError: boom" in data["error"]
    assert failure_reason(code) == reason


def test_the_last_summary_counts() -> None:
    """A summary line printed twice (a retried flush) or a stale one first: the last one is the run's."""
    message, code = verdict(_out(_summary("aborted", "interrupted"), _summary("success", "goal")), 0, False)
    assert (code, json.loads(message)["status"]) == (0, "success")
