"""The run's status is built as the typed ``BenchmarkRunStatus`` and serialized once, as the wire had it.

Covers the boundary (camelCase, RFC 3339 times, plain strings, no nulls but the one that deletes), the
tolerant parsing of a stored status that no longer validates, and that Events are planned only for a
condition (or the phase) that changed.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from mlbench_api.runstatus import BenchmarkRunStatus, Phase
from mlbench_operator import conditions as c
from mlbench_operator import runcontext, runpods, runtime
from mlbench_operator.conditions import DatasetReason, Reason
from mlbench_operator.datasets import FetchAction, FetchState
from mlbench_operator.podview import PodView
from mlbench_operator.run import admission, lifecycle, policies
from mlbench_operator.run import status as run_status
from tests import factories
from tests.operator import helpers as h
from tests.operator.test_reconcile import T0, admitted, cond, pod, step, terminated, workers

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def _times(status: dict[str, Any]) -> list[str]:
    """Every time of a status (top level, progress, conditions)."""
    out = [status[k] for k in ("startTime", "completionTime") if k in status]
    out += [v for k, v in (status.get("progress") or {}).items() if k.endswith("At")]
    return out + [x["lastTransitionTime"] for x in status.get("conditions") or []]


def _no_nulls(data: Any) -> bool:
    if isinstance(data, dict):
        return all(v is not None and _no_nulls(v) for v in data.values())
    if isinstance(data, list):
        return all(_no_nulls(v) for v in data)
    return True


def _lifecycle() -> list[dict[str, Any]]:
    """The statuses of a run from admission to success, each finalized as it is written."""
    body, ctx = admitted(h.run())
    out = [run_status.finalize(body["status"], T0)]
    launcher = pod(runpods.launcher_pod(ctx, 0))
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    for pods in ([], workers(ctx, ready=False), workers(ctx), [*workers(ctx), launcher], [*workers(ctx), done]):
        body, plan = step(body, ctx, pods)
        out.append(run_status.finalize(plan.status, T0))
        body = {**body, "status": out[-1]}
    assert out[-1]["phase"] == "Succeeded"
    return out


# -- the boundary: what the API server gets --------------------------------------------------------------------
def test_the_wire_form_is_camel_case_rfc3339_plain_strings_and_no_nulls() -> None:
    fields = {info.alias for info in BenchmarkRunStatus.model_fields.values()}
    for status in _lifecycle():
        assert set(status) <= fields, set(status) - fields
        assert _no_nulls(status), status
        assert all(RFC3339.match(t) for t in _times(status)), _times(status)
        # Reason and Phase members become the plain strings the API server stores
        assert json.loads(json.dumps(status)) == status
        assert type(status["phase"]) is str
        assert all(type(x["reason"]) is str for x in status["conditions"])
        BenchmarkRunStatus.model_validate(status)  # and it reads back as the typed model


def test_a_status_round_trips_through_the_typed_model_unchanged() -> None:
    for status in _lifecycle():
        again = run_status.StoredStatus.parse(status)
        assert again.unparsed == {}
        assert again.model.to_api() == status


def test_an_untouched_field_is_written_exactly_as_stored() -> None:
    """A time written in another RFC 3339 form (e.g. by an older version) is not rewritten by a pass that does
    not set it, so the status patch carries only what the pass decided."""
    body, ctx = admitted(h.run())
    body["status"]["startTime"] = "2026-01-01T12:00:00.000+00:00"
    _, plan = step(body, ctx, [])
    assert plan.status["startTime"] == "2026-01-01T12:00:00.000+00:00"
    assert "startTime" not in runtime.status_patch(body["status"], run_status.finalize(plan.status, T0))


def test_a_cleared_field_is_sent_as_null_to_delete_it() -> None:
    """The one explicit None: a field the pass cleared (observedGeneration of a run without a generation)
    is null, so the merge patch removes it; a field that was never there is not sent at all."""
    body, ctx = admitted(h.run())
    del body["metadata"]["generation"]
    _, plan = step(body, ctx, [])
    assert plan.status["observedGeneration"] is None
    assert runtime.status_patch(body["status"], run_status.finalize(plan.status, T0))["observedGeneration"] is None
    del body["status"]["observedGeneration"]
    _, plan = step(body, ctx, [])
    assert "observedGeneration" not in plan.status


# -- a stored status that no longer validates -------------------------------------------------------------------
def _legacy(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with a status as an older operator (or a bad write) might have left it."""
    status = dict(body["status"])
    status["restarts"] = -1  # out of range
    status["legacyField"] = {"anything": True}  # a field the model does not know
    status["results"] = {"files": ["f"] * 20}  # over maxItems
    status["conditions"] = [
        *status["conditions"],
        {"type": "Custom", "status": "Maybe", "reason": "Other Tool!", "lastTransitionTime": "yesterday"},
    ]
    return {**body, "status": status}


def test_a_stored_status_that_does_not_validate_is_parsed_as_far_as_it_does() -> None:
    body, _ = admitted(h.run())
    with capture_logs() as logged:
        stored = run_status.StoredStatus.parse(_legacy(body)["status"])
    assert set(stored.unparsed) == {"restarts", "legacyField", "results"}
    assert [x["type"] for x in stored.unparsed_conditions] == ["Custom"]
    assert stored.model.phase is Phase.PENDING  # the rest is typed
    assert stored.model.restarts is None
    assert c.find(stored.model.conditions, c.WORKERS_READY) is not None
    reported = {(e["event"], e.get("field") or e.get("type")) for e in logged}
    assert reported == {
        ("status_field_unparsed", "restarts"),
        ("status_field_unparsed", "legacyField"),
        ("status_field_unparsed", "results"),
        ("status_condition_unparsed", "Custom"),
    }
    assert all(e["log_level"] == "warning" and e["error"] for e in logged)


def test_a_bad_stored_value_is_logged_once_per_run_not_on_every_pass() -> None:
    body, ctx = admitted(h.run())
    legacy = _legacy(body)
    legacy["metadata"] = {**legacy["metadata"], "uid": f"uid-{uuid.uuid4()}"}
    with capture_logs() as first:
        policies.plan(legacy, ctx, [], T0)
    with capture_logs() as again:
        policies.plan(legacy, ctx, [], T0 + timedelta(seconds=5))
    unparsed = {"status_field_unparsed", "status_condition_unparsed"}
    reported = sorted((e["event"], e.get("field") or e.get("type")) for e in first if e["event"] in unparsed)
    assert reported == [
        ("status_condition_unparsed", "Custom"),
        ("status_field_unparsed", "legacyField"),
        ("status_field_unparsed", "restarts"),
        ("status_field_unparsed", "results"),
    ], "each once"
    assert not [e for e in again if e["event"] in unparsed], "the next pass is quiet"
    changed = {**legacy, "status": {**legacy["status"], "legacyField": {"anything": False}}}
    with capture_logs() as after_change:
        policies.plan(changed, ctx, [], T0 + timedelta(seconds=10))
    assert [e.get("field") for e in after_change if e["event"] in unparsed] == ["legacyField"], "a new value is news"
    other_run = {**legacy, "metadata": {**legacy["metadata"], "uid": f"uid-{uuid.uuid4()}"}}
    with capture_logs() as other:
        policies.plan(other_run, ctx, [], T0)
    assert len([e for e in other if e["event"] in unparsed]) == 4, "another run's status is its own"


def test_reported_once_forgets_the_oldest_beyond_its_bound() -> None:
    seen = run_status.ReportedOnce(size=2)
    assert [seen.first("r", "a", 1), seen.first("r", "a", 1), seen.first("r", "b", 1)] == [True, False, True]
    assert seen.first("r", "c", {"x": [1]})  # the third entry pushes out ("r", "a", 1)
    assert seen.first("r", "a", 1)
    assert not seen.first("r", "c", {"x": [1]})


def test_reconciliation_goes_on_and_keeps_what_it_does_not_set() -> None:
    """Fallback: the unparsed parts are written back as stored until the operator sets that field itself."""
    body, ctx = admitted(h.run())
    legacy = _legacy(body)
    _, plan = step(legacy, ctx, [])
    assert plan.create_workers == [0, 1]
    status = plan.status
    assert status["legacyField"] == {"anything": True}
    assert status["results"] == {"files": ["f"] * 20}
    assert status["restarts"] == 0  # set by the pass: typed again (an unreadable count is attempt 0)
    custom = [x for x in status["conditions"] if x["type"] == "Custom"]
    assert custom == [legacy["status"]["conditions"][-1]]  # kept, in the order of condition types
    assert [x["type"] for x in status["conditions"]][-1] == "Custom"
    finalized = run_status.finalize(status, T0)
    assert finalized["legacyField"] == {"anything": True}
    assert {"Ready", "Reconciling", "Stalled", "Custom"} <= {x["type"] for x in finalized["conditions"]}
    # nothing of it is re-sent: the patch holds only what the pass decided
    assert not {"legacyField", "results"} & set(runtime.status_patch(legacy["status"], finalized))


@pytest.mark.parametrize(
    "function",
    [
        lambda body, ctx: run_status.failed_status(body, Reason.INVALID_CONFIG, "x", T0),
        lambda body, ctx: lifecycle.cleaned_up_status(body, [], T0),
        lambda body, ctx: lifecycle.creation_failed(body, [("pod r1-worker-0", 403, "quota")], T0).status,
        lambda body, ctx: lifecycle.object_conflict(body, "Service", "r1", "x", T0).status,
        lambda body, ctx: (
            lifecycle.dataset_plan(body, FetchState(FetchAction.WAIT, DatasetReason.FETCHING, "fetching"), T0).status
        ),
        lambda body, ctx: policies.plan(body, ctx, workers(ctx), T0).status,
    ],
    ids=["failed", "cleaned_up", "creation_failed", "object_conflict", "dataset", "plan"],
)
def test_every_builder_tolerates_a_legacy_status(function: Any) -> None:
    body, ctx = admitted(h.run())
    status = run_status.finalize(function(_legacy(body), ctx), T0)
    assert status["legacyField"] == {"anything": True}
    assert any(x["type"] == "Custom" for x in status["conditions"])


def test_a_kept_condition_gives_way_to_one_the_operator_sets() -> None:
    body, ctx = admitted(h.run())
    broken = {"type": c.WORKERS_READY, "status": "False", "reason": "not a reason", "lastTransitionTime": "x"}
    conds = [x for x in body["status"]["conditions"] if x["type"] != c.WORKERS_READY]
    body = {**body, "status": {**body["status"], "conditions": [broken, *conds]}}
    _, plan = step(body, ctx, workers(ctx))
    assert [x for x in plan.status["conditions"] if x["type"] == c.WORKERS_READY] == [cond(plan.status, "WorkersReady")]
    assert cond(plan.status, "WorkersReady")["reason"] == "AllWorkersReady"


def test_an_unreadable_phase_or_time_does_not_crash_the_planner() -> None:
    body, ctx = admitted(h.run(runPolicy={"activeDeadlineSeconds": 60}))
    body["status"].update(phase="Suspended", startTime="not a time", progress={"step": -5})
    body, plan = step(body, ctx, workers(ctx))
    assert plan.status["phase"] == "Starting"  # the pass sets the phase: typed again
    assert plan.status["startTime"] == "not a time"  # no deadline can be told from it: none is enforced
    assert plan.status["progress"] == {"step": -5}
    assert ("Normal", "Starting") in [e[:2] for e in plan.events]


def test_a_snapshot_that_does_not_validate_is_written_as_given() -> None:
    """admit() always passes a validated snapshot; another one is kept untyped (the next pass fails the run
    InvalidConfig when it cannot rebuild the configuration from it)."""
    body = h.run()
    result = admission.admit(body, h.task())
    assert not isinstance(result, admission.Rejection)
    status = admission.admitted_status(body, result[0], {"odd": 1}, T0)
    assert status["taskSnapshot"] == {"odd": 1}


def test_a_final_figure_the_status_cannot_hold_is_an_invalid_result() -> None:
    """An accuracy above 1 fits no status.progress: the run fails InvalidResult at once (before, the API
    server refused the write with a 422, which ended the run the same way)."""
    body, ctx = admitted(h.run())
    summary = factories.summary().model_copy(update={"final_accuracy": 1.5})
    done = terminated(runpods.launcher_pod(ctx, 0), 0, summary.termination_message())
    _, plan = step(body, ctx, [*workers(ctx), done])
    assert plan.status["phase"] == "Failed"
    assert cond(plan.status, "Failed")["reason"] == "InvalidResult"
    assert "lastAccuracy" in plan.status["message"]


# -- Events: only for what changed ------------------------------------------------------------------------------
def _worlds(ctx: runcontext.RunContext) -> dict[str, list[PodView]]:
    stuck = "0/3 nodes are available: 3 Insufficient cpu."
    return {
        "nothing yet": [],
        "unschedulable": [
            dataclasses.replace(w, ready=False, scheduled=False, unschedulable=stuck) for w in workers(ctx)
        ],
        "image pull": [dataclasses.replace(w, ready=False, waiting="ImagePullBackOff: \x1b[2Jx") for w in workers(ctx)],
        "starting": workers(ctx, ready=False),
        "ready": workers(ctx),
        "running": [*workers(ctx), pod(runpods.launcher_pod(ctx, 0))],
        "launcher pending": [*workers(ctx), pod(runpods.launcher_pod(ctx, 0), phase="Pending", ready=False)],
    }


@pytest.mark.parametrize(
    "world", ["nothing yet", "unschedulable", "image pull", "starting", "ready", "running", "launcher pending"]
)
@pytest.mark.parametrize("stalled", [False, True])
def test_a_pass_that_changes_nothing_plans_no_event(world: str, stalled: bool) -> None:
    body, ctx = admitted(h.run())
    pods = _worlds(ctx)[world]
    if stalled:
        body["status"]["progress"] = {"step": 3, "stepChangedAt": c.timestamp(T0 - timedelta(hours=1))}
    body, first = step(body, ctx, pods)
    if world == "running":  # the first pass does say what changed
        want = ("Warning", "NoProgress") if stalled else ("Normal", "Running")
        assert want in [e[:2] for e in first.events]
    body = {**body, "status": run_status.finalize(first.status, T0)}
    if stalled:
        body["status"]["progress"] = {"step": 3, "stepChangedAt": c.timestamp(T0 - timedelta(hours=1))}
    _, again = step(body, ctx, pods, T0 + timedelta(seconds=30))
    assert again.events == [], (world, first.events, again.events)


def test_the_same_refusal_or_conflict_plans_one_event() -> None:
    """Also when the refusal's text holds control characters: the stored (cleaned) message is compared with
    the one set now (cleaned alike), not with the raw text, which never matched it."""
    body, _ = admitted(h.run())
    for detail in ("exceeded quota", "quota \x1b[31mexceeded\x07"):
        failures = [("pod r1-worker-1", 403, detail)]
        first = lifecycle.creation_failed(body, failures, T0)
        assert [e[1] for e in first.events] == ["CreateFailed"]
        later = {**body, "status": run_status.finalize(first.status, T0)}
        assert lifecycle.creation_failed(later, failures, T0 + timedelta(seconds=5)).events == []
        other = [("pod r1-worker-1", 403, detail + " again")]
        assert [e[1] for e in lifecycle.creation_failed(later, other, T0).events] == ["CreateFailed"]
    first = lifecycle.object_conflict(body, "Service", "r1", "x", T0)
    assert [e[1] for e in first.events] == ["NameConflict"]
    later = {**body, "status": run_status.finalize(first.status, T0)}
    assert lifecycle.object_conflict(later, "Service", "r1", "x", T0).events == []


def test_a_dataset_event_only_when_its_condition_changes() -> None:
    body, _ = admitted(h.run())
    fetching = FetchState(FetchAction.WAIT, DatasetReason.FETCHING, "fetching (attempt 1)")
    first = lifecycle.dataset_plan(body, fetching, T0)
    assert [e[1] for e in first.events] == ["Fetching"]
    body = {**body, "status": run_status.finalize(first.status, T0)}
    retry = dataclasses.replace(fetching, message="fetching (attempt 2)")  # a new message, same condition
    assert lifecycle.dataset_plan(body, retry, T0).events == []
    done = FetchState(FetchAction.READY, DatasetReason.FETCHED, "fetched")
    assert [e[1] for e in lifecycle.dataset_plan(body, done, T0).events] == ["Fetched"]
