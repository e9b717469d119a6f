"""The Kueue Workload of a queued run, built and read without a cluster (operator/mlbench_operator/run/kueue.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from mlbench_api.run import BenchmarkRunSpec
from mlbench_operator import runcontext, runpods
from mlbench_operator.run import admission, kueue
from tests.operator import helpers as h

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _ctx(**spec: Any) -> runcontext.RunContext:
    admitted = admission.admit(h.run(**spec), h.task(), policy=h.PERMISSIVE)
    assert not isinstance(admitted, admission.Rejection), admitted
    return admitted[0]


def _workload(**spec: Any) -> dict[str, Any]:
    ctx = _ctx(**spec)
    worker, launcher = runpods.worker_pod(ctx, 0, 0), runpods.launcher_pod(ctx, 0)
    return kueue.workload(
        ctx.name, ctx.namespace, ctx.uid, queue="team-a", worker=worker, launcher=launcher, count=ctx.spec.workers
    )


def test_queue_name_is_the_label() -> None:
    body = h.run()
    assert kueue.queue_name(body) is None
    body["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-a"}
    assert kueue.queue_name(body) == "team-a"


def test_the_workload_has_the_workers_and_the_launcher_with_their_requests() -> None:
    wl = _workload(workers=3, resources={"cpu": "2", "memory": "1Gi"})
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert wl["spec"]["queueName"] == "team-a"
    assert wl["metadata"]["name"] == "r1-uid-r1"
    owner = wl["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("BenchmarkRun", "r1", "uid-r1", True)
    workers, launcher = wl["spec"]["podSets"]
    assert (workers["name"], workers["count"], launcher["name"], launcher["count"]) == ("workers", 3, "launcher", 1)
    main = next(ct for ct in workers["template"]["spec"]["containers"] if ct["name"] == "worker")
    assert main["resources"]["requests"] == {"cpu": "2", "memory": "1Gi"}
    assert set(main) <= {"name", "image", "resources"}  # what Kueue reads, not the env or the volumes


def test_the_workload_carries_the_runs_node_selector() -> None:
    wl = _workload(scheduling={"nodeSelector": {"pool": "cpu"}})
    for pod_set in wl["spec"]["podSets"]:
        assert pod_set["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}


def _cond(type_: str, status: str, message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": "X", "message": message}


ADMITTED = {
    "status": {
        "conditions": [_cond("QuotaReserved", "True"), _cond("Admitted", "True")],
        "admission": {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "workers", "flavors": {"cpu": "default", "memory": "default"}},
                {"name": "launcher", "flavors": {"cpu": "small"}},
            ],
        },
    }
}


@pytest.mark.parametrize(
    ("workload", "admitted", "says", "flavors"),
    [
        (None, False, "creating Kueue Workload wl in queue q", ()),
        ({}, False, "waiting for Kueue", ()),
        (
            {"status": {"conditions": [_cond("QuotaReserved", "False", "couldn't assign flavors: insufficient cpu")]}},
            False,
            "insufficient cpu",
            (),
        ),
        (ADMITTED, True, "admitted by Kueue", ("default", "small")),
        (  # quota reserved but an admission check pending: not yet
            {"status": {"conditions": [_cond("QuotaReserved", "True", "reserved"), _cond("Admitted", "False", "")]}},
            False,
            "reserved",
            (),
        ),
        (  # preempted: Kueue took the admission back, the eviction says why
            {
                "status": {
                    "conditions": [
                        _cond("QuotaReserved", "False", "pending"),
                        _cond("Evicted", "True", "Preempted to accommodate a workload"),
                    ]
                }
            },
            False,
            "Preempted",
            (),
        ),
        (  # an old eviction (False) is not the story
            {"status": {"conditions": [_cond("Evicted", "False", "old"), _cond("QuotaReserved", "False", "now")]}},
            False,
            "now",
            (),
        ),
        (  # evicted while still admitted (waitForPodsReady's timeout): not admitted, whatever Admitted says
            {
                "status": {
                    **ADMITTED["status"],
                    "conditions": [
                        *ADMITTED["status"]["conditions"],
                        _cond("Evicted", "True", "Exceeded the PodsReady timeout ns/wl"),
                    ],
                }
            },
            False,
            "Exceeded the PodsReady timeout",
            (),
        ),
        (  # finished: admitted no more
            {"status": {**ADMITTED["status"], "conditions": [_cond("Admitted", "True"), _cond("Finished", "True")]}},
            False,
            "",
            (),
        ),
    ],
)
def test_admission_is_read_from_the_workloads_conditions(
    workload: dict[str, Any] | None, admitted: bool, says: str, flavors: tuple[str, ...]
) -> None:
    got = kueue.admission(workload, "wl", "q")
    assert got.admitted is admitted
    assert says in got.message
    assert got.flavors == flavors


def test_placement_merges_the_flavors_labels_and_tolerations() -> None:
    toleration = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    flavors = [
        {"spec": {"nodeLabels": {"pool": "a"}, "tolerations": [toleration]}},
        {"spec": {"nodeLabels": {"zone": "z1"}, "tolerations": [toleration]}},
        {},
    ]
    assert kueue.placement(flavors) == ({"pool": "a", "zone": "z1"}, [toleration])


def test_with_placement_adds_to_the_runs_scheduling() -> None:
    spec = BenchmarkRunSpec.model_validate(
        {
            "taskRef": {"name": "t"},
            "scheduling": {"nodeSelector": {"disk": "ssd"}, "tolerations": [{"key": "a", "operator": "Exists"}]},
        }
    )
    out = kueue.with_placement(
        spec, {"pool": "a"}, [{"key": "b", "operator": "Exists"}, {"key": "a", "operator": "Exists"}]
    )
    assert out.scheduling is not None
    assert out.scheduling.node_selector == {"disk": "ssd", "pool": "a"}
    assert [t.key for t in out.scheduling.tolerations or []] == ["a", "b"]
    assert spec.scheduling is not None
    assert spec.scheduling.node_selector == {"disk": "ssd"}
    assert kueue.with_placement(spec, {}, []) is spec


def test_finished_patch_is_an_apply_of_the_finished_condition() -> None:
    patch = kueue.finished_patch("Succeeded", NOW)
    (cond,) = patch["status"]["conditions"]
    assert (patch["kind"], cond["type"], cond["status"], cond["reason"]) == (
        "Workload",
        "Finished",
        "True",
        "Succeeded",
    )
    assert cond["lastTransitionTime"] == "2026-01-01T00:00:00Z"


EVICTED: dict[str, Any] = {
    "metadata": {"name": "wl", "resourceVersion": "42"},
    "status": {
        **ADMITTED["status"],
        "conditions": [
            *ADMITTED["status"]["conditions"],
            {"type": "PodsReady", "status": "False", "reason": "WaitForStart", "message": ""},
            {"type": "Evicted", "status": "True", "reason": "PodsReadyTimeout", "message": "Exceeded the timeout"},
        ],
    },
}


def test_an_evicted_workload_says_why_and_that_it_still_holds_its_quota() -> None:
    got = kueue.admission(EVICTED, "wl", "q")
    assert (got.admitted, got.evicted, got.reserved, got.pods_ready) == (False, "PodsReadyTimeout", True, False)
    released = {"status": {"conditions": kueue.release_patch(EVICTED, NOW)["status"]["conditions"]}}
    got = kueue.admission(released, "wl", "q")
    assert (got.admitted, got.evicted, got.reserved) == (False, "PodsReadyTimeout", False)
    ready = {
        "status": {**ADMITTED["status"], "conditions": [*ADMITTED["status"]["conditions"], _cond("PodsReady", "True")]}
    }
    assert kueue.admission(ready, "wl", "q").pods_ready
    assert not kueue.admission(ADMITTED, "wl", "q").pods_ready


@pytest.mark.parametrize(("eviction", "requeued"), [("PodsReadyTimeout", "False"), ("Preempted", "True")])
def test_release_patch_gives_the_quota_back_as_kueues_job_integrations_do(eviction: str, requeued: str) -> None:
    workload: dict[str, Any] = {
        **EVICTED,
        "status": {**EVICTED["status"], "conditions": list(EVICTED["status"]["conditions"])},
    }
    workload["status"]["conditions"][-1] = {**workload["status"]["conditions"][-1], "reason": eviction}
    patch = kueue.release_patch(workload, NOW)
    assert patch["metadata"] == {"resourceVersion": "42"}  # refused (409) if Kueue changed it meanwhile
    assert patch["status"]["admission"] is None
    conds = {x["type"]: x for x in patch["status"]["conditions"]}
    assert [x["type"] for x in patch["status"]["conditions"]].count("PodsReady") == 1
    assert {t: conds[t]["status"] for t in ("QuotaReserved", "Admitted", "PodsReady", "Evicted")} == {
        "QuotaReserved": "False",
        "Admitted": "False",
        "PodsReady": "False",
        "Evicted": "True",  # Kueue's own, kept: it resets it when it reserves quota again
    }
    assert (conds["Requeued"]["status"], conds["Requeued"]["reason"]) == (requeued, eviction)
    assert conds["QuotaReserved"]["message"] == "Exceeded the timeout"


def test_pods_ready_patch_is_an_apply_of_pods_ready_true() -> None:
    (cond,) = kueue.pods_ready_patch(NOW)["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("PodsReady", "True", "Started")
