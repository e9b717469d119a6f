"""Only the launcher the operator created is the run's (issue 33): a pod of the launcher's name with the run's
ownerReference and labels, put there by a namespace editor, neither starts the run's Running phase nor gives
its result. No cluster needed."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from datetime import datetime, timedelta
from typing import Any

import kopf
import pytest
import urllib3

from mlbench_api.runstatus import BenchmarkRunStatus
from mlbench_operator import runcontext, runpods
from mlbench_operator.kube import ApiError, may_have_applied
from mlbench_operator.podview import PodView
from mlbench_operator.run import daemon, results
from mlbench_operator.run.ownership import (
    UNANSWERED_KEPT,
    UnansweredCreate,
    held_launcher,
    launcher_refused,
    remember_unanswered,
)
from tests import factories
from tests.operator import helpers as h
from tests.operator.test_handlers import FakeKube, _reconciler
from tests.operator.test_reconcile import T0, admitted, cond, pod, step, terminated, workers


def _launcher(ctx: runcontext.RunContext, uid: str, created: str | None = None, **kw: Any) -> PodView:
    obj = runpods.launcher_pod(ctx, 0)
    obj["metadata"] = {**obj["metadata"], "uid": uid, "creationTimestamp": created}
    return pod(obj, **kw)


def _ready_status(ctx: runcontext.RunContext, body: dict[str, Any]) -> dict[str, Any]:
    """The run's status once every worker is Ready (at T0, when the operator creates the launcher)."""
    body, _ = step(body, ctx, workers(ctx))
    return body


ISO = "%Y-%m-%dT%H:%M:%SZ"


@pytest.mark.parametrize(
    ("record", "uid", "created", "refused"),
    [
        ({"uid": "u-op", "attempt": 0}, "u-op", None, None),  # the one the operator created
        ({"uid": "u-op", "attempt": 0}, "u-forged", None, "not the launcher the operator created"),
        (None, "u-any", (T0 + timedelta(seconds=1)).strftime(ISO), None),  # no record: created after Ready
        (None, "u-any", T0.strftime(ISO), None),
        (None, "u-early", (T0 - timedelta(seconds=5)).strftime(ISO), "before the attempt's workers were all Ready"),
        ({"uid": "u-old", "attempt": 1}, "u-early", (T0 - timedelta(seconds=5)).strftime(ISO), "before"),
    ],
)
def test_launcher_refused(record: dict[str, Any] | None, uid: str, created: str | None, refused: str | None) -> None:
    body, ctx = admitted(h.run())
    status = BenchmarkRunStatus.model_validate({**_ready_status(ctx, body)["status"], "launcher": record})
    why = launcher_refused(_launcher(ctx, uid, created), status, 0)
    assert (why is None) if refused is None else (why is not None and refused in why), why


def test_a_launcher_put_there_before_the_workers_were_ready_is_a_name_conflict() -> None:
    body, ctx = admitted(h.run())
    early = (T0 - timedelta(seconds=30)).strftime(ISO)
    body, _ = step(body, ctx, workers(ctx, ready=False))  # WorkersReady False
    forged = _launcher(ctx, "u-forged", early)
    body, plan = step(body, ctx, [*workers(ctx), forged])
    assert plan.status["phase"] != "Running"
    running = cond(plan.status, "Running")
    assert running["reason"] == "NameConflict"
    assert "r1-launcher" in running["message"]
    assert not plan.create_launcher  # the name is held: nothing created under it


def test_a_forged_launcher_with_a_recorded_one_is_not_the_run_s() -> None:
    body, ctx = admitted(h.run())
    body = _ready_status(ctx, body)
    body = {**body, "status": {**body["status"], "launcher": {"uid": "u-op", "attempt": 0}}}
    forged = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    forged = dataclasses.replace(forged, uid="u-forged")
    _, plan = step(body, ctx, [*workers(ctx), forged])
    assert plan.status["phase"] not in ("Succeeded", "Failed")  # its exit is not the run's result
    assert "result" not in plan.status
    assert results.launcher([forged], "", {"launcher": {"uid": "u-op", "attempt": 0}}) is None  # nor its results
    assert results.launcher([forged], "", {"launcher": {"uid": "u-forged", "attempt": 0}}) is forged


def test_the_operator_records_the_uid_its_launcher_create_was_answered_with(monkeypatch: pytest.MonkeyPatch) -> None:
    body, ctx = admitted(h.run())
    body = _ready_status(ctx, body)

    class Uids(FakeKube):
        def create_many_now(self, objs: list[dict[str, Any]]) -> list[Any]:
            done = super().create_many_now(objs)
            return [f"uid-{o['metadata']['name']}" if r is True else r for o, r in zip(objs, done, strict=True)]

    kube = Uids()
    rec = _reconciler(body, kube, monkeypatch)
    rec.service_ensured = True
    asyncio.run(rec.step(workers(ctx)))
    assert ("create", "Pod", "r1-launcher") in kube.calls
    assert rec.status["launcher"] == {"uid": "uid-r1-launcher", "attempt": 0, "imageId": None}
    assert {"launcher": {"uid": "uid-r1-launcher", "attempt": 0, "imageId": None}} in kube.patches()


def _taken(ctx: runcontext.RunContext, uid: str, created: datetime = T0 + timedelta(seconds=1)) -> dict[str, Any]:
    """A pod under the launcher's name with the run's ownerReference and labels, created once the workers were Ready
    (between WorkersReady and the operator's create): only its UID tells it from the operator's."""
    obj = runpods.launcher_pod(ctx, 0)
    meta = {**obj["metadata"], "uid": uid, "creationTimestamp": created.strftime(ISO)}
    return {**obj, "metadata": meta, "status": {"phase": "Succeeded"}}


def test_a_forged_launcher_that_answers_the_operator_s_create_with_409_fails_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 33: a namespace editor creates ``<run>-launcher`` with the run's marks after WorkersReady, before the
    operator's create (answered 409). No record names it: the run fails with NameConflict naming the pod, and the
    pod neither runs the run nor gives its results, in that pass or a later one."""
    body, ctx = admitted(h.run())
    body = _ready_status(ctx, body)
    kube = FakeKube()
    kube.existing[("Pod", "r1-launcher")] = _taken(ctx, "u-forged")
    kube.log = "\n"
    rec = _reconciler(body, kube, monkeypatch)
    rec.service_ensured = True
    asyncio.run(rec.step(workers(ctx)))
    assert ("create", "Pod", "r1-launcher") in kube.calls
    assert rec.status["phase"] == "Failed"
    failed = cond(rec.status, "Failed")
    assert failed["reason"] == "NameConflict"
    assert failed["message"].startswith("Pod r1-launcher already exists and was not created by the operator")
    assert "uid u-forged, none recorded" in failed["message"]
    assert ("Warning", "Failed", failed["message"]) in rec.events
    assert "launcher" not in rec.status
    forged = _launcher(ctx, "u-forged", (T0 + timedelta(seconds=1)).strftime(ISO), phase="Succeeded", ready=False)
    assert results.launcher([forged], "", rec.status) is None  # its log is never the run's results
    assert not any(call[0] == "read_log" for call in kube.calls)
    assert rec.status["results"]["message"].startswith("no launcher ran")


def test_the_operator_s_recorded_launcher_answering_its_create_with_409_is_the_run_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The legitimate 409: the operator created the launcher and recorded its UID, then (restarted, its pod watch
    behind) asked again: the recorded pod is accepted, the run goes on."""
    body, ctx = admitted(h.run())
    body = _ready_status(ctx, body)
    body = {**body, "status": {**body["status"], "launcher": {"uid": "u-op", "attempt": 0}}}
    kube = FakeKube()
    kube.existing[("Pod", "r1-launcher")] = _taken(ctx, "u-op")
    rec = _reconciler(body, kube, monkeypatch)
    rec.service_ensured = True
    asyncio.run(rec.step(workers(ctx)))
    assert ("create", "Pod", "r1-launcher") in kube.calls
    assert rec.status["phase"] not in ("Failed", "Succeeded")
    assert cond(rec.status, "Running")["reason"] == "CreatingLauncher"
    assert rec.status["launcher"] == {"uid": "u-op", "attempt": 0}
    mine = _launcher(ctx, "u-op", (T0 + timedelta(seconds=1)).strftime(ISO))
    _, plan = step(rec.view(), ctx, [*workers(ctx), mine])
    assert plan.status["phase"] == "Running"
    assert cond(plan.status, "Running")["reason"] == "LauncherRunning"


@pytest.mark.parametrize(
    ("record", "uid", "held"),
    [
        ({"uid": "u-op", "attempt": 0}, "u-op", None),
        ({"uid": "u-op", "attempt": 0}, "u-forged", "(uid u-forged, recorded u-op)"),
        ({"uid": "u-op", "attempt": 1}, "u-op", "(uid u-op, none recorded)"),  # another attempt's record
        (None, "u-any", "(uid u-any, none recorded)"),
    ],
)
def test_held_launcher(record: dict[str, Any] | None, uid: str, held: str | None) -> None:
    body, ctx = admitted(h.run())
    status = BenchmarkRunStatus.model_validate({**_ready_status(ctx, body)["status"], "launcher": record})
    why = held_launcher(_taken(ctx, uid), status, 0)
    assert (why is None) if held is None else (why is not None and held in why), why


def test_a_run_failed_on_a_taken_launcher_name_accepts_no_unrecorded_launcher() -> None:
    """Without the Failed/NameConflict check the pod would pass: no record, created after WorkersReady, before
    the run ended."""
    body, ctx = admitted(h.run())
    status = _ready_status(ctx, body)["status"]
    late = (T0 + timedelta(seconds=1)).strftime(ISO)
    conflict = {"type": "Failed", "status": "True", "reason": "NameConflict", "lastTransitionTime": late}
    other = {**conflict, "reason": "CreateFailed"}
    ready = [x for x in status["conditions"] if x["type"] not in ("Failed", "Running")]
    pod_ = _launcher(ctx, "u-forged", late)
    for failed, refused in ((conflict, True), (other, False)):
        model = BenchmarkRunStatus.model_validate({**status, "conditions": [*ready, failed]})
        assert (launcher_refused(pod_, model, 0) is not None) is refused


#: An unanswered create of attempt 0's launcher: sent at T0 + 10 s, given up 30 s later.
SENT = T0 + timedelta(seconds=10)
UNANSWERED = UnansweredCreate(0, SENT, SENT + timedelta(seconds=30))


@pytest.mark.parametrize(
    ("created", "unanswered", "held"),
    [
        (SENT + timedelta(seconds=5), [UNANSWERED], None),  # created while the create was under way
        (T0 + timedelta(seconds=10), [UNANSWERED], None),  # as it was sent
        (T0 + timedelta(seconds=40), [UNANSWERED], None),  # as it was given up
        (T0 + timedelta(seconds=9), [UNANSWERED], None),  # a second's margin before
        (T0 + timedelta(seconds=41), [UNANSWERED], None),  # a second's margin after
        (T0 + timedelta(seconds=8), [UNANSWERED], "(uid u-any, none recorded)"),  # before the create was sent
        (T0 + timedelta(seconds=42), [UNANSWERED], "(uid u-any, none recorded)"),  # after it was given up
        (SENT + timedelta(seconds=5), [], "(uid u-any, none recorded)"),  # no unanswered create
        (SENT + timedelta(seconds=5), [dataclasses.replace(UNANSWERED, attempt=1)], "none recorded"),  # another attempt
        (SENT + timedelta(seconds=5), [dataclasses.replace(UNANSWERED, attempt=1), UNANSWERED], None),
    ],
)
def test_held_launcher_made_by_an_unanswered_create(
    created: datetime, unanswered: list[UnansweredCreate], held: str | None
) -> None:
    body, ctx = admitted(h.run())
    status = BenchmarkRunStatus.model_validate(_ready_status(ctx, body)["status"])
    why = held_launcher(_taken(ctx, "u-any", created), status, 0, unanswered)
    assert (why is None) if held is None else (why is not None and held in why), why


def test_remember_unanswered_keeps_the_attempt_s_last_few() -> None:
    kept: tuple[UnansweredCreate, ...] = ()
    for i in range(UNANSWERED_KEPT + 2):
        kept = remember_unanswered(kept, dataclasses.replace(UNANSWERED, sent=SENT + timedelta(seconds=i)))
    assert [u.sent for u in kept] == [SENT + timedelta(seconds=i) for i in range(2, UNANSWERED_KEPT + 2)]
    assert remember_unanswered(kept, dataclasses.replace(UNANSWERED, attempt=1)) == (
        dataclasses.replace(UNANSWERED, attempt=1),
    )  # a new attempt forgets the earlier one's


@pytest.mark.parametrize(
    ("err", "unknown"),
    [
        (TimeoutError("timed out"), True),
        (ConnectionResetError("reset"), True),
        (urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"), True),  # type: ignore[arg-type]
        (ApiError(504, "POST", "/pods", '{"message": "Timeout: request did not complete"}'), True),
        (ApiError(500, "POST", "/pods", '{"message": "etcdserver: request timed out"}'), True),
        (ApiError(429, "POST", "/pods", '{"message": "too many requests"}'), False),
        (ApiError(403, "POST", "/pods", '{"message": "exceeded quota"}'), False),
        (ValueError("a bug of ours"), False),
    ],
)
def test_may_have_applied(err: BaseException, unknown: bool) -> None:
    assert may_have_applied(err) is unknown


@pytest.mark.parametrize(("late", "fails"), [(0, False), (1, False), (-5, True), (5, True)])
def test_a_launcher_create_that_timed_out_is_the_run_s_when_a_later_create_is_answered_409(
    monkeypatch: pytest.MonkeyPatch, late: int, fails: bool
) -> None:
    """The create reached the API server but its answer did not come back (a timeout): no UID to record. The pod
    watch lags, so the next pass asks again and is answered 409. The pod made while the create was under way is
    the run's, recorded now; one made before it was sent, or after it was given up (at once here), still fails
    the run (NameConflict)."""
    body, ctx = admitted(h.run())
    body = _ready_status(ctx, body)
    sent = T0 + timedelta(seconds=20)
    monkeypatch.setattr(daemon, "clock", lambda: sent)
    kube = FakeKube()
    kube.create_error = TimeoutError("read timed out")
    rec = _reconciler(body, kube, monkeypatch)
    rec.service_ensured = True
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(rec.step(workers(ctx)))
    assert "launcher" not in rec.status
    kube.create_error = None
    kube.existing[("Pod", "r1-launcher")] = _taken(ctx, "u-op", sent + timedelta(seconds=late))
    rec.pacing.create_backoff_until = -math.inf  # the transient failure's backoff is over
    asyncio.run(rec.step(workers(ctx)))
    assert [c for c in kube.calls if c == ("create", "Pod", "r1-launcher")] == [("create", "Pod", "r1-launcher")] * 2
    if fails:
        assert rec.status["phase"] == "Failed"
        assert cond(rec.status, "Failed")["reason"] == "NameConflict"
        assert "launcher" not in rec.status
        return
    assert rec.status["phase"] not in ("Failed", "Succeeded")
    assert rec.status["launcher"] == {"uid": "u-op", "attempt": 0, "imageId": None}
    mine = _launcher(ctx, "u-op", (sent + timedelta(seconds=late)).strftime(ISO))
    _, plan = step(rec.view(), ctx, [*workers(ctx), mine])
    assert plan.status["phase"] == "Running"
