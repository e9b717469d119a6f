"""Only the launcher the operator created is the run's (issue 33): a pod of the launcher's name with the run's
ownerReference and labels, put there by a namespace editor, neither starts the run's Running phase nor gives
its result. No cluster needed."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from mlbench_api.runstatus import BenchmarkRunStatus
from mlbench_operator import runcontext, runpods
from mlbench_operator.podview import PodView
from mlbench_operator.run import results
from mlbench_operator.run.ownership import launcher_refused
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
