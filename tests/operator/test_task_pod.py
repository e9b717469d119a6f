"""A task's ``pod`` on the pods the operator builds, under the run's ``spec.pod``; the admission policy and the
closed division's rule at admission, each refusal naming its field (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from mlbench_api import contract
from mlbench_operator import runpods
from mlbench_operator.conditions import Reason
from mlbench_operator.policy import AdmissionPolicy
from mlbench_operator.run import admission
from tests.operator import helpers as h

Obj = dict[str, Any]
TASK_POD = {
    "env": [{"name": "NCCL_ALGO", "value": "Ring"}, {"name": "NCCL_DEBUG", "value": "WARN"}],
    "annotations": {"k8s.v1.cni.cncf.io/networks": "task-net"},
    "labels": {"suite": "mlbench"},
    "extendedResources": {"rdma/hca": 1},
    "hostIpc": True,
}


def task(pod: Obj, division: str = "closed") -> Obj:
    out = h.task()
    out["spec"]["pod"], out["spec"]["division"] = pod, division
    return out


def admitted(task_pod: Obj, run_pod: Obj | None = None, division: str = "closed") -> Any:
    extra: dict[str, Any] = {"pod": run_pod} if run_pod else {}
    body = h.run(name="bench", **extra)
    return admission.admit(body, task(task_pod, division), policy=h.PERMISSIVE)


def env_of(pod: Obj) -> dict[str, str | None]:
    (container,) = pod["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_task_s_settings_reach_the_pods_under_the_run_s() -> None:
    run_pod = {
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_SOCKET_IFNAME", "value": "eth1"}],
        "labels": {"team": "vision"},
    }
    result = admitted(TASK_POD, run_pod, division="open")
    assert not isinstance(result, admission.Rejection), result
    ctx = result[0]
    worker = runpods.worker_pod(ctx, 0, 0)
    env = env_of(worker)
    assert (env["NCCL_ALGO"], env["NCCL_DEBUG"], env["NCCL_SOCKET_IFNAME"]) == ("Ring", "INFO", "eth1")
    assert env[contract.ENV_FORWARD_ENV] == "NCCL_ALGO,NCCL_DEBUG,NCCL_SOCKET_IFNAME"
    assert worker["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/networks": "task-net"}
    assert {"suite": "mlbench", "team": "vision"}.items() <= worker["metadata"]["labels"].items()
    assert worker["spec"]["containers"][0]["resources"]["limits"] == {"rdma/hca": "1"}
    assert worker["spec"]["hostIPC"] is True
    assert env_of(runpods.launcher_pod(ctx, 0))[contract.ENV_FORWARD_ENV] == env[contract.ENV_FORWARD_ENV]


def test_the_task_s_settings_alone_reach_the_pods() -> None:
    result = admitted(TASK_POD)
    assert not isinstance(result, admission.Rejection), result
    assert env_of(runpods.worker_pod(result[0], 0, 0))["NCCL_ALGO"] == "Ring"


@pytest.mark.parametrize(
    ("run_pod", "field"),
    [
        ({"env": [{"name": "NCCL_ALGO", "value": "Tree"}]}, "spec.pod.env[NCCL_ALGO]"),
        ({"annotations": {"k8s.v1.cni.cncf.io/networks": "mine"}}, "spec.pod.annotations[k8s.v1.cni.cncf.io/networks]"),
        ({"hostIpc": False}, "spec.pod.hostIpc"),
    ],
)
def test_a_closed_run_that_changes_the_task_s_settings_is_refused(run_pod: Obj, field: str) -> None:
    result = admitted(TASK_POD, run_pod)
    assert isinstance(result, admission.Rejection), result
    assert result.reason == Reason.OVERRIDE_NOT_ALLOWED
    assert result.message.startswith(f"{field}: the task sets "), result.message


def test_a_closed_run_may_add_settings() -> None:
    result = admitted(TASK_POD, {"env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth1"}]})
    assert not isinstance(result, admission.Rejection), result


def test_the_policy_names_the_task_s_field() -> None:
    policy = AdmissionPolicy(images=("*",))  # the default pod settings policy
    result = admission.admit(h.run(name="bench"), task({"env": [{"name": "LD_PRELOAD", "value": "x"}]}), policy=policy)
    assert isinstance(result, admission.Rejection), result
    assert result.reason == Reason.POLICY_VIOLATION
    assert result.message.startswith(f"BenchmarkTask {h.TASK_NAME!r} spec.pod.env[0]: 'LD_PRELOAD' is not allowed")
