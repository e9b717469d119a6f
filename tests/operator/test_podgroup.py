"""Gang scheduling (spec.scheduling.gang), pure: the run's PodGroup and what it changes on the workers (no cluster)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from typing import Any

import pytest

from mlbench_api.scheduling import Gang
from mlbench_operator import podgroup as pg
from mlbench_operator import runcontext, runobjects, runpods
from mlbench_operator.kube import ApiError
from mlbench_operator.settings import GANG_SCHEDULER_NAME, OperatorConfig, SettingsError
from tests.operator import helpers as h
from tests.operator.test_builders import ctx_for
from tests.operator.test_handlers import FakeKube, _reconciler
from tests.operator.test_reconcile import admitted

GANG = {"placement": "Spread", "gang": {"scheduleTimeoutSeconds": 120}}


@pytest.mark.parametrize(
    ("requests", "count", "expected"),
    [
        ({"cpu": "500m", "memory": "1Gi"}, 3, {"cpu": "1.5", "memory": "3221225472"}),
        ({"cpu": "2", "nvidia.com/gpu": "1"}, 4, {"cpu": "8", "nvidia.com/gpu": "4"}),
        ({"memory": "100M"}, 2, {"memory": "200000000"}),
        ({}, 5, {}),
    ],
)
def test_min_resources_sum_the_workers_requests(requests: dict[str, str], count: int, expected: dict[str, str]) -> None:
    assert pg.total(requests, count) == expected


def test_pod_group_of_a_gang_run() -> None:
    ctx = ctx_for(name="bench", namespace="team-a", workers=3, resources={"cpu": "1", "memory": "2Gi"}, scheduling=GANG)
    group = runobjects.pod_group(ctx)
    assert group is not None
    assert (group["apiVersion"], group["kind"]) == ("scheduling.x-k8s.io/v1alpha1", "PodGroup")
    assert group["metadata"]["name"] == "bench"
    assert group["metadata"]["namespace"] == "team-a"
    assert group["metadata"]["ownerReferences"] == [runcontext.owner_reference(ctx)]
    assert group["metadata"]["labels"] == runcontext.labels(ctx)
    # the workers only: the launcher is created once they are all Ready
    assert group["spec"] == {
        "minMember": 3,
        "minResources": {"cpu": "3", "memory": "6442450944"},
        "scheduleTimeoutSeconds": 120,
    }


def test_pod_group_without_timeout_or_resources_leaves_them_out() -> None:
    group = pg.pod_group("r", {"namespace": "ns"}, Gang(), 2, {})
    assert group["spec"] == {"minMember": 2}
    assert group["metadata"] == {"namespace": "ns", "name": "r"}


@pytest.mark.parametrize(
    ("gang", "operator_default", "expected"),
    [
        ({}, GANG_SCHEDULER_NAME, "scheduler-plugins-scheduler"),
        ({}, "coscheduler", "coscheduler"),
        ({"schedulerName": "my-gang"}, "coscheduler", "my-gang"),
    ],
)
def test_workers_name_the_group_and_the_scheduler(gang: dict[str, Any], operator_default: str, expected: str) -> None:
    ctx = ctx_for(name="bench", workers=2, scheduling={"gang": gang})
    ctx = dataclasses.replace(ctx, gang_scheduler_name=operator_default)
    for rank in (0, 1):
        pod = runpods.worker_pod(ctx, rank, 0)
        assert pod["spec"]["schedulerName"] == expected
        assert pod["metadata"]["labels"][pg.POD_GROUP_LABEL] == "bench"
    launcher = runpods.launcher_pod(ctx, 0)
    assert "schedulerName" not in launcher["spec"]
    assert pg.POD_GROUP_LABEL not in launcher["metadata"]["labels"]


def test_without_gang_nothing_changes() -> None:
    """A gang worker differs from the same run's worker without gang in exactly the label and schedulerName; a run
    without gang has no PodGroup."""
    plain = ctx_for(name="bench", workers=2, scheduling={"placement": "Spread"})
    gang = ctx_for(name="bench", workers=2, scheduling=GANG)
    assert runobjects.pod_group(plain) is None
    assert runobjects.pod_group(ctx_for(name="bench")) is None
    with_gang = copy.deepcopy(runpods.worker_pod(gang, 1, 2, 60))
    del with_gang["metadata"]["labels"][pg.POD_GROUP_LABEL]
    del with_gang["spec"]["schedulerName"]
    without = runpods.worker_pod(plain, 1, 2, 60)
    assert json.dumps(with_gang, sort_keys=False) == json.dumps(without, sort_keys=False)
    assert "schedulerName" not in json.dumps(without)
    assert "scheduling.x-k8s.io" not in json.dumps(without)


@pytest.mark.parametrize(
    ("kind", "status", "missing"),
    [("PodGroup", 404, True), ("PodGroup", 403, False), ("Service", 404, False), ("PodGroup", 409, False)],
)
def test_missing_crd_is_a_404_on_a_pod_group(kind: str, status: int, missing: bool) -> None:
    assert pg.is_missing_crd(kind, status) is missing
    assert pg.CRD_NAME in pg.MISSING_CRD


def test_gang_scheduler_setting() -> None:
    assert OperatorConfig.from_env({}).gang_scheduler_name == GANG_SCHEDULER_NAME
    assert OperatorConfig.from_env({"MLBENCH_GANG_SCHEDULER_NAME": "co"}).gang_scheduler_name == "co"
    with pytest.raises(SettingsError, match="MLBENCH_GANG_SCHEDULER_NAME"):
        OperatorConfig.from_env({"MLBENCH_GANG_SCHEDULER_NAME": "Not_A_Name"})


# -- the glue: the operator creates the PodGroup before any worker; no CRD is a condition, not a crash loop ----------
@pytest.mark.multiproc
def test_a_gang_run_creates_its_pod_group_before_any_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    body, _ = admitted(h.run(scheduling=GANG))
    kube = FakeKube()
    rec = _reconciler(body, kube, monkeypatch, ensured=False)
    asyncio.run(rec.step([]))
    creates = [(c[1], c[2]) for c in kube.calls if c[0] == "create"]
    assert ("PodGroup", "r1") in creates
    first_pod = next(i for i, (kind, _) in enumerate(creates) if kind == "Pod")
    assert creates.index(("PodGroup", "r1")) < first_pod
    workers = [o for o in kube.created if o["kind"] == "Pod"]
    assert workers
    assert all(o["spec"]["schedulerName"] == GANG_SCHEDULER_NAME for o in workers)


@pytest.mark.multiproc
def test_without_gang_no_pod_group_is_created(monkeypatch: pytest.MonkeyPatch) -> None:
    body, _ = admitted(h.run())
    kube = FakeKube()
    asyncio.run(_reconciler(body, kube, monkeypatch, ensured=False).step([]))
    assert [c for c in kube.calls if c[0] == "create" and c[1] == "Pod"]
    assert not [c for c in kube.calls if c[0] == "create" and c[1] == "PodGroup"]


@pytest.mark.multiproc
def test_a_missing_pod_group_crd_is_shown_and_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    body, _ = admitted(h.run(scheduling=GANG))
    kube = FakeKube()
    not_found = '{"message": "the server could not find the requested resource"}'
    kube.object_errors["PodGroup"] = ApiError(404, "POST", "/apis/scheduling.x-k8s.io/v1alpha1", not_found)
    rec = _reconciler(body, kube, monkeypatch, ensured=False)
    delay = asyncio.run(rec.step([]))
    text = f"creating PodGroup r1 was refused (HTTP 404): {pg.MISSING_CRD}"
    assert rec.status["message"] == text
    assert pg.CRD_NAME in text
    assert rec.status.get("phase") != "Failed"
    wr = {c["type"]: c for c in rec.status["conditions"]}["WorkersReady"]
    assert (wr["reason"], wr["message"]) == ("CreateFailed", text)
    assert not [c for c in kube.calls if c[0] == "create" and c[1] == "Pod"]  # no worker without its group
    assert delay is not None
    assert delay > 0
    assert ("Warning", "CreateFailed", text) in rec.events


@pytest.mark.multiproc
def test_gang_set_after_the_run_objects_exist_still_gets_its_pod_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.scheduling.gang set while suspended, after the ConfigMap, Secret and NetworkPolicy were ensured."""
    body, _ = admitted(h.run(scheduling=GANG))
    kube = FakeKube()
    asyncio.run(_reconciler(body, kube, monkeypatch, ensured=True).step([]))
    creates = [(c[1], c[2]) for c in kube.calls if c[0] == "create"]
    assert ("PodGroup", "r1") in creates
    assert creates.index(("PodGroup", "r1")) < next(i for i, (kind, _) in enumerate(creates) if kind == "Pod")
