"""A task's ``pod`` (issue 29: "a run (or its task, for the closed division)"): merged under the run's
``spec.pod``; in the closed division a run may add settings, never change one the task sets (no cluster)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mlbench_api.config import OverrideNotAllowed, effective_config
from mlbench_api.pod import MAX_ENV, PodSettings, contradictions, merge
from mlbench_api.run import HOST_NETWORK_ONE_PER_NODE, BenchmarkRun
from mlbench_api.task import BenchmarkTaskSpec
from tests.operator import helpers as h

Obj = dict[str, Any]
ALGO = {"name": "NCCL_ALGO", "value": "Ring"}
TREE = {"name": "NCCL_ALGO", "value": "Tree"}
IFNAME = {"name": "NCCL_SOCKET_IFNAME", "value": "eth1"}
NET = "k8s.v1.cni.cncf.io/networks"
ZONE: Obj = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}}
OTHER: Obj = {"podAffinity": {}}


def pod(raw: Obj | None) -> PodSettings | None:
    return None if raw is None else PodSettings.model_validate(raw)


def wire(settings: PodSettings | None) -> Obj | None:
    return None if settings is None else settings.to_api()


MERGES: list[tuple[str, Obj | None, Obj | None, Obj | None]] = [
    # (id, the task's pod, the run's spec.pod, the merged pod)
    ("neither", None, None, None),
    ("task-only", {"env": [ALGO]}, None, {"env": [ALGO]}),
    ("run-only", None, {"env": [IFNAME]}, {"env": [IFNAME]}),
    ("env-by-name-task-first", {"env": [ALGO]}, {"env": [IFNAME]}, {"env": [ALGO, IFNAME]}),
    ("env-run-wins", {"env": [ALGO, IFNAME]}, {"env": [TREE]}, {"env": [TREE, IFNAME]}),
    (
        "annotations-by-key",
        {"annotations": {NET: "a", "x.io/k": "1"}},
        {"annotations": {NET: "b"}},
        {"annotations": {NET: "b", "x.io/k": "1"}},
    ),
    ("labels-by-key", {"labels": {"team": "a"}}, {"labels": {"tier": "b"}}, {"labels": {"team": "a", "tier": "b"}}),
    (
        "extended-resources-by-key",
        {"extendedResources": {"rdma/a": 1, "x.io/efa": 4}},
        {"extendedResources": {"rdma/a": 2}},
        {"extendedResources": {"rdma/a": 2, "x.io/efa": 4}},
    ),
    (
        "pull-secrets-union",
        {"imagePullSecrets": [{"name": "a"}]},
        {"imagePullSecrets": [{"name": "b"}, {"name": "a"}]},
        {"imagePullSecrets": [{"name": "a"}, {"name": "b"}]},
    ),
    ("affinity-run-replaces", {"affinity": ZONE}, {"affinity": OTHER}, {"affinity": OTHER}),
    ("affinity-task-kept", {"affinity": ZONE}, {"env": [IFNAME]}, {"affinity": ZONE, "env": [IFNAME]}),
    ("host-ipc-run-wins", {"hostIpc": True}, {"hostIpc": False}, {"hostIpc": False}),
    ("host-ipc-task-kept", {"hostIpc": True}, {"labels": {"a": "b"}}, {"hostIpc": True, "labels": {"a": "b"}}),
]


@pytest.mark.parametrize(("task", "run", "merged"), [m[1:] for m in MERGES], ids=[m[0] for m in MERGES])
def test_merge(task: Obj | None, run: Obj | None, merged: Obj | None) -> None:
    assert wire(merge(pod(task), pod(run))) == merged


CONTRADICTIONS: list[tuple[str, Obj | None, Obj | None, list[str]]] = [
    # (id, the task's pod, the run's spec.pod, the fields named: a closed-division run may not change them)
    ("adds-env", {"env": [ALGO]}, {"env": [IFNAME]}, []),
    ("same-value", {"env": [ALGO]}, {"env": [ALGO, IFNAME]}, []),
    ("changes-env", {"env": [ALGO]}, {"env": [TREE]}, ["spec.pod.env[NCCL_ALGO]"]),
    ("changes-annotation", {"annotations": {NET: "a"}}, {"annotations": {NET: "b"}}, [f"spec.pod.annotations[{NET}]"]),
    ("adds-annotation", {"annotations": {NET: "a"}}, {"annotations": {"x.io/y": "b"}}, []),
    ("changes-label", {"labels": {"team": "a"}}, {"labels": {"team": "b"}}, ["spec.pod.labels[team]"]),
    (
        "changes-resource",
        {"extendedResources": {"rdma/a": 1}},
        {"extendedResources": {"rdma/a": 2}},
        ["spec.pod.extendedResources[rdma/a]"],
    ),
    ("changes-affinity", {"affinity": ZONE}, {"affinity": OTHER}, ["spec.pod.affinity"]),
    ("adds-affinity", {"env": [ALGO]}, {"affinity": OTHER}, []),
    ("changes-host-ipc", {"hostIpc": True}, {"hostIpc": False}, ["spec.pod.hostIpc"]),
    ("pull-secrets-add", {"imagePullSecrets": [{"name": "a"}]}, {"imagePullSecrets": [{"name": "b"}]}, []),
    ("no-task-pod", None, {"env": [TREE]}, []),
    (
        "every-change-named",
        {"env": [ALGO], "labels": {"team": "a"}},
        {"env": [TREE], "labels": {"team": "b"}},
        ["spec.pod.env[NCCL_ALGO]", "spec.pod.labels[team]"],
    ),
]


@pytest.mark.parametrize(("task", "run", "fields"), [m[1:] for m in CONTRADICTIONS], ids=[m[0] for m in CONTRADICTIONS])
def test_contradictions(task: Obj | None, run: Obj | None, fields: list[str]) -> None:
    assert [x.split(": ")[0] for x in contradictions(pod(task), pod(run))] == fields


def task_with(pod_settings: Obj, division: str = "closed") -> BenchmarkTaskSpec:
    raw = copy.deepcopy(h.task()["spec"])
    raw["pod"], raw["division"] = pod_settings, division
    return BenchmarkTaskSpec.model_validate(raw)


def run_with(pod_settings: Obj | None = None, **spec: Any) -> BenchmarkRun:
    extra: dict[str, Any] = {"pod": pod_settings} if pod_settings else {}
    body = h.run(**extra, **spec)
    return BenchmarkRun.model_validate({k: v for k, v in body.items() if k != "apiVersion"})


def test_a_task_carries_pod_settings_on_the_wire() -> None:
    given = {"env": [ALGO], "annotations": {NET: "rdma"}, "extendedResources": {"rdma/a": 1}}
    assert task_with(given).to_api()["pod"] == given


def test_a_task_s_pod_is_checked_as_a_run_s() -> None:
    with pytest.raises(ValueError, match="env: 'MLBENCH_RUN'"):
        task_with({"env": [{"name": "MLBENCH_RUN"}]})


def test_closed_division_refuses_a_changed_setting_naming_the_field() -> None:
    with pytest.raises(OverrideNotAllowed, match=r"spec.pod.env\[NCCL_ALGO\]: the task sets 'Ring', the run 'Tree'"):
        effective_config(run_with({"env": [TREE]}), "t", task_with({"env": [ALGO]}))


def test_closed_division_takes_an_added_setting() -> None:
    run = run_with({"env": [IFNAME]})
    config = effective_config(run, "t", task_with({"env": [ALGO]}))
    assert wire(merge(config.task.pod, run.spec.pod)) == {"env": [ALGO, IFNAME]}


def test_open_division_lets_the_run_win() -> None:
    effective_config(run_with({"env": [TREE]}), "t", task_with({"env": [ALGO]}, division="open"))


def test_a_task_s_host_network_needs_what_a_run_s_does() -> None:
    with pytest.raises(ValueError, match="set by the task's pod") as err:
        effective_config(run_with(), "t", task_with({"hostNetwork": True}, division="open"))
    assert str(err.value) == f"pod.hostNetwork (set by the task's pod): {HOST_NETWORK_ONE_PER_NODE}"
    one_per_node = run_with(scheduling={"placement": "OneWorkerPerNode"})
    effective_config(one_per_node, "t", task_with({"hostNetwork": True}, division="open"))


def test_settings_within_bounds_on_each_side_may_not_exceed_them_together() -> None:
    half = MAX_ENV // 2 + 1
    task_env = [{"name": f"TASK_{i}", "value": "1"} for i in range(half)]
    run_env = [{"name": f"RUN_{i}", "value": "1"} for i in range(half)]
    with pytest.raises(ValueError, match=r"^pod \(the task's and the run's together\): env: ") as err:
        effective_config(run_with({"env": run_env}), "t", task_with({"env": task_env}, division="open"))
    assert str(MAX_ENV) in str(err.value)
    # the same names on both sides merge to one each: within the bound
    effective_config(run_with({"env": task_env}), "t", task_with({"env": task_env}, division="open"))
