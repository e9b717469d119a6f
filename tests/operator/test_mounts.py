"""A worker that cannot mount its volume: the kubelet says so only in Events; WorkersReady says it too."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mlbench_operator import conditions as c
from mlbench_operator import runcontext, runpods
from mlbench_operator.podview import PodView
from mlbench_operator.run import mounts, policies
from tests.operator import helpers as h
from tests.operator.test_reconcile import T0, admitted, cond, pod, workers

MISSING = 'MountVolume.SetUp failed for volume "data" : configmap "no-such-data" not found'


def _waiting(ctx: runcontext.RunContext, rank: int, age: float, **status: Any) -> PodView:
    """A scheduled worker, ContainerCreating for ``age`` seconds (as the kubelet reports it: Pending, no reason)."""
    obj = runpods.worker_pod(ctx, rank, 0)
    obj["metadata"]["creationTimestamp"] = c.timestamp(T0 - timedelta(seconds=age))
    obj["metadata"]["uid"] = f"uid-{rank}"
    creating = [{"name": "worker", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    return pod(obj, phase="Pending", ready=False, **{"containerStatuses": creating, **status})


@pytest.mark.parametrize(
    ("age", "status", "asked"),
    [
        (30, {}, True),
        (5, {}, False),  # a mount takes a moment: not yet
        (30, {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}, False),
        (
            30,
            {"containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]},
            False,  # the pod's status already says why
        ),
    ],
    ids=["waiting", "too-young", "unscheduled", "says-why"],
)
def test_which_workers_are_asked_about(age: float, status: dict[str, Any], asked: bool) -> None:
    _, ctx = admitted(h.run(workers=2))
    worker = _waiting(ctx, 0, age, **status)
    assert (mounts.to_check([worker], T0) == [worker]) is asked


def test_at_most_a_few_workers_are_asked_about_per_pass() -> None:
    _, ctx = admitted(h.run(workers=8))
    many = [_waiting(ctx, r, 30) for r in reversed(range(8))]
    assert [p.rank for p in mounts.to_check(many, T0)] == [0, 1, 2]
    assert mounts.field_selector(many[-1]) == "involvedObject.uid=uid-0,type=Warning"


def test_the_latest_volume_event_is_the_failure() -> None:
    events = [
        {"reason": "FailedMount", "message": "old", "lastTimestamp": "2026-01-01T11:59:00Z"},
        {"reason": "FailedScheduling", "message": "not a volume", "lastTimestamp": "2026-01-01T12:00:30Z"},
        {"reason": "FailedAttachVolume", "message": "Multi-Attach error", "lastTimestamp": "2026-01-01T12:00:00Z"},
    ]
    assert mounts.failure(events) == (c.Reason.FAILED_ATTACH_VOLUME, "Multi-Attach error")
    assert mounts.failure(events[1:2]) is None
    assert mounts.failure([]) is None


def test_workers_ready_names_the_volume_and_the_run_warns_once() -> None:
    body, ctx = admitted(h.run(workers=2))
    pods = [workers(ctx)[0], _waiting(ctx, 1, 30)]
    failure = {pods[1].name: (c.Reason.FAILED_MOUNT, MISSING)}
    plan = policies.plan(body, ctx, pods, T0, mounts=failure)
    wr = cond(plan.status, "WorkersReady")
    assert (wr["status"], wr["reason"]) == ("False", "FailedMount")
    assert wr["message"] == f"worker 1 (pod {pods[1].name}): {MISSING}"
    assert ("Warning", "FailedMount", wr["message"]) in plan.events
    assert plan.requeue_after is not None  # Events wake nobody: look again
    assert plan.requeue_after <= mounts.RECHECK_SECONDS
    again = policies.plan({**body, "status": plan.status}, ctx, pods, T0 + timedelta(seconds=10), mounts=failure)
    assert not [e for e in again.events if e[1] == "FailedMount"]  # said once, while it lasts
    # without the Events' word the worker is merely waited for
    quiet = policies.plan(body, ctx, pods, T0)
    assert cond(quiet.status, "WorkersReady")["reason"] == "WaitingForWorkers"
