"""Keeping a finished run's results: the pure decisions (mlbench_operator.run.results), one table each."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mlbench_api import bundle
from mlbench_api.results import RankHardware, RunSummary
from mlbench_operator.podview import PodView
from mlbench_operator.run import results as r
from mlbench_operator.settings import RESULTS_WAIT_SECONDS

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


def _ago(seconds: float) -> str:
    return (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def launcher(phase: str = "Succeeded", **kw: Any) -> PodView:
    return PodView(name="r1-launcher", role="launcher", rank=None, attempt=0, phase=phase, owner_uid="u1", **kw)


DONE = {"phase": "Succeeded", "completionTime": _ago(1)}


@pytest.mark.parametrize(
    ("status", "pod", "action"),
    [
        ({"phase": "Running"}, launcher("Running"), r.Action.NONE),  # not finished: nothing yet
        ({**DONE, "results": {"configMap": "r1-results"}}, launcher(), r.Action.NONE),  # recorded once
        ({**DONE, "results": {"message": "gone"}}, launcher(), r.Action.NONE),  # a recorded failure is final too
        (DONE, None, r.Action.GIVE_UP),  # rejected run: no launcher ever ran, said once
        (DONE, launcher("Succeeded"), r.Action.COLLECT),
        ({**DONE, "phase": "Failed"}, launcher("Failed"), r.Action.COLLECT),  # a crash still has events
        ({"phase": "Failed", "completionTime": _ago(5)}, launcher("Running"), r.Action.WAIT),  # mpirun aborting
        ({"phase": "Failed", "completionTime": _ago(61)}, launcher("Running"), r.Action.GIVE_UP),
        ({"phase": "Failed", "completionTime": _ago(1)}, launcher("Pending"), r.Action.GIVE_UP),  # never started
        ({"phase": "Failed", "completionTime": _ago(5)}, launcher("Running", terminating=True), r.Action.GIVE_UP),
    ],
)
def test_decide(status: dict[str, Any], pod: PodView | None, action: r.Action) -> None:
    decision = r.decide(status, pod, NOW)
    assert decision.action is action
    assert decision.holds_launcher is (action in (r.Action.WAIT, r.Action.COLLECT))
    if action is r.Action.WAIT:
        assert decision.retry_after is not None
        assert 0 < decision.retry_after <= RESULTS_WAIT_SECONDS + 1
    assert decision.spares_worker0 is (action is r.Action.WAIT)
    if action is r.Action.GIVE_UP:
        assert "no results were kept" in decision.message or "nothing to keep" in decision.message


@pytest.mark.parametrize(
    ("results", "gone", "action", "message"),
    [
        (None, False, r.Action.WAIT, ""),  # the first failure: look again soon (a kubelet restarting)
        ({"failingSince": _ago(2)}, False, r.Action.WAIT, ""),
        ({"failingSince": _ago(90)}, False, r.Action.GIVE_UP, "cannot read the launcher's log (retried for 90s): boom"),
        (None, True, r.Action.GIVE_UP, "the launcher's log is gone: boom"),
    ],
)
def test_after_error(results: dict[str, Any] | None, gone: bool, action: r.Action, message: str) -> None:
    """The window counts from the first failed read, not from the launcher's end: an operator that was down
    for longer than the window (the launcher finished 10 min ago) still retries a transient error."""
    status = {"phase": "Succeeded", "completionTime": _ago(600), **({"results": results} if results else {})}
    decision = r.after_error(status, "boom", gone, NOW)
    assert decision.action is action
    assert decision.message == message
    if action is r.Action.WAIT:
        assert decision.retry_after is not None
        assert 0 < decision.retry_after <= 5
        assert r.decide(status, launcher(finished_at=_ago(600)), NOW).action is r.Action.COLLECT  # not recorded yet


def test_retrying_status_keeps_the_first_failure() -> None:
    assert r.retrying_status(DONE, NOW) == {"failingSince": "2026-11-23T12:00:00Z"}
    first = {**DONE, "results": {"failingSince": _ago(30)}}
    assert r.retrying_status(first, NOW) == {"failingSince": _ago(30)}
    assert r.after_error(first, "boom", False, NOW, doing="keep the results in ConfigMap x").action is r.Action.WAIT
    late = {**DONE, "results": {"failingSince": _ago(61)}}
    gave_up = r.after_error(late, "boom", False, NOW, doing="keep the results in ConfigMap x")
    assert gave_up.message == "cannot keep the results in ConfigMap x (retried for 61s): boom"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"workers": {"ready": 0, "total": 2}}, {}),  # a recount after the end: dropped
        (
            {"results": {"configMap": "r1-results", "truncated": ["a"] * 9}},
            {
                "results": {
                    "message": "the API server refused status.results (HTTP 422): too many",
                    "collectedAt": "2026-11-23T12:00:00Z",
                }
            },
        ),
    ],
)
def test_a_refused_write_after_the_end_keeps_the_outcome(changes: dict[str, Any], expected: dict[str, Any]) -> None:
    out = r.refused_write(changes, "too many", NOW)
    assert out == expected
    assert "phase" not in out


def test_launcher_is_the_runs_own() -> None:
    foreign = PodView(name="r1-launcher", role="launcher", rank=None, attempt=0, owner_uid="old-run")
    worker = PodView(name="r1-worker-0", role="worker", rank=0, attempt=0, owner_uid="u1")
    assert r.launcher([foreign, worker], "u1") is None
    assert r.launcher([worker, launcher()], "u1") == launcher()


def test_from_log_says_why_there_is_nothing() -> None:
    assert r.from_log("mpirun output\n")[1].startswith("the launcher's log has no results line")
    bad = '{"event": "run_results", "schema": "other"}'
    assert r.from_log(bad)[1].startswith("the launcher's results line is unreadable: unknown results schema")
    # a log read up to its limit: the reason says the tail was too long, not only that the line is broken
    giant = "x" * r.LOG_BYTES
    said = r.from_log(giant)[1]
    assert said.startswith("the launcher's log has no results line")
    assert said.endswith(f"of which only the first {r.LOG_BYTES} are read (lines that long are not the runner's)")
    assert "over" not in r.from_log("mpirun output\n")[1]


def test_status_records_size_and_truncation() -> None:
    found = bundle.Bundle({bundle.EVENTS: b"{}\n"}, truncated=(bundle.EVENTS,))
    st = r.kept_status("r1", found, NOW)
    assert st == {
        "configMap": "r1-results",
        "files": ["events.jsonl"],
        "compressedBytes": found.compressed_size(),
        "sha256": {"events.jsonl": hashlib.sha256(b"{}\n").hexdigest()},
        "collectedAt": "2026-11-23T12:00:00Z",
        "truncated": ["events.jsonl"],
    }
    assert r.missing_status("x" * 5000, NOW)["message"] == "x" * 4096


def test_log_tail_for_an_event_drops_the_results_line_and_escapes() -> None:
    from mlbench_operator.run.results import log_tail

    lines = [f"line {i}" for i in range(100)]
    line = bundle.results_line(bundle.Bundle({bundle.SUMMARY: b"{}" * 3000}))
    text = "\n".join([*lines, "boom \x1b[31mred\x1b[0m", line])
    out = log_tail(text, 200)
    assert out.endswith("boom [31mred[0m")
    assert "run_results" not in out
    assert "\x1b" not in out
    assert len(out) <= 200
    assert out.startswith("line ")
    assert log_tail("short", 200) == "short"


@pytest.mark.parametrize(
    ("network", "wait"),
    [
        (None, 60.0),
        ({"bandwidthMbit": 100}, 60.0),
        ({"latencyMs": 5000}, 140.0),  # two reads of rank 0's files, each 40 s slower to connect
        ({"latencyMs": 20, "jitterMs": 5}, 62.0),
        ({"jitterMs": 5}, 60.0),  # invalid (jitter needs latency): admission refused it; nothing changes here
    ],
)
def test_the_results_wait_grows_with_the_emulated_delay(network: dict[str, float] | None, wait: float) -> None:
    """The launcher's ssh reads of rank 0's files take longer under spec.network: the operator must not delete
    it (and worker 0) while it still reads them."""
    assert r.wait_for(60.0, network) == wait


def test_kept_results_join_the_nodes_labels_to_each_rank_s_hardware() -> None:
    summary = RunSummary.model_validate(
        {
            "run": "r",
            "task": "t",
            "status": "success",
            "goalReached": True,
            "epochs": 1,
            "steps": 1,
            "samples": 1,
            "wallClockSeconds": 1,
            "trainSeconds": 1,
            "computeSeconds": 1,
            "communicationSeconds": 0,
            "samplesPerSecond": 1,
            "phases": {},
            "environment": {"worldSize": 2, "backend": "nccl", "nodes": ["gpu-1", "gpu-2"]},
        }
    )
    found = bundle.Bundle({bundle.SUMMARY: summary.model_dump_json(by_alias=True).encode(), bundle.EVENTS: b"{}"})
    assert r.nodes_to_read(found) == ["gpu-1", "gpu-2"]
    labels = {"gpu-2": {"nvidia.com/gpu.product": "NVIDIA-H200", "node.kubernetes.io/instance-type": "p5en"}}
    joined = r.with_hardware(found, labels)
    assert joined.files[bundle.EVENTS] == b"{}"
    kept = joined.summary
    assert kept is not None
    assert kept.environment.hardware == [
        RankHardware(node="gpu-1"),
        RankHardware(node="gpu-2", gpu_product="NVIDIA-H200", instance_type="p5en"),
    ]
    assert r.with_hardware(bundle.Bundle({bundle.EVENTS: b"{}"}), labels).files == {bundle.EVENTS: b"{}"}
