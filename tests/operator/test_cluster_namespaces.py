"""The namespaced install with a namespace the operator cannot read (its RoleBinding deleted, or the namespace
missing): the operator serves the other namespaces within a bounded time, reports the broken one
(``mlbench_operator_namespace_ready`` 0, a Warning Event) and serves it once its RoleBinding is back."""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlbench_operator.nsready import PROBE_SECONDS
from tests.cluster.plugin import KubeCluster, create_namespace, wait_for
from tests.operator.conftest import SESSION, SESSION_LABEL, OperatorProcess, Runs, _operator_kubeconfig
from tests.operator.test_cluster_rbac import SA, namespaced_rbac, run_body

pytestmark = pytest.mark.cluster

#: How soon the served namespace's run must run although another namespace cannot be read (the sync's bound,
#: MLBENCH_NAMESPACE_SYNC_SECONDS, set below, plus the time a run takes when nothing is broken).
SERVED_WITHIN = 45.0


@pytest.fixture
def broken_namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    name = create_namespace(kube_cluster)
    try:
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def _role_and_binding_in(objs: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """The operator's Role and RoleBinding of ``objs`` (namespaced_rbac's), copied into ``namespace``."""
    out = []
    for obj in objs:
        if obj["kind"] in ("Role", "RoleBinding") and obj["metadata"]["name"] == "mlbench-operator":
            obj = copy.deepcopy(obj)
            obj["metadata"]["namespace"] = namespace
            out.append(obj)
    assert {o["kind"] for o in out} == {"Role", "RoleBinding"}
    return out


def _release(runs: Runs, name: str) -> None:
    """Delete the run; drop its finalizer if nobody did (the namespace must not stay Terminating)."""
    runs.kubectl("delete", "benchmarkrun", name, "--wait=false", check=False)
    deadline = time.monotonic() + 20
    while runs.get("benchmarkrun", name) is not None and time.monotonic() < deadline:
        time.sleep(0.3)
    if runs.get("benchmarkrun", name) is not None:
        patch = '{"metadata":{"finalizers":null}}'
        runs.kubectl("patch", "benchmarkrun", name, "--type=merge", "-p", patch, check=False)


@pytest.mark.usefixtures("test_task")
def test_a_namespace_without_its_rolebinding_does_not_stop_the_others(
    kube_cluster: KubeCluster,
    namespace: str,
    broken_namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objs, cluster_binding = namespaced_rbac(namespace)
    missing = f"t-missing-{uuid.uuid4().hex[:8]}"  # a watched namespace that does not exist at all
    monkeypatch.setenv("MLBENCH_LEADER_ELECTION_NAMESPACE", namespace)
    monkeypatch.setenv("MLBENCH_NAMESPACE_SYNC_SECONDS", "5")
    kube_cluster.kubectl("-n", namespace, "create", "serviceaccount", SA, check=True)
    items = {"kind": "List", "apiVersion": "v1", "items": objs}
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(items), check=True)
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(cluster_binding), check=True)
    broken_rbac = _role_and_binding_in(objs, broken_namespace)
    role = next(o for o in broken_rbac if o["kind"] == "Role")
    binding = next(o for o in broken_rbac if o["kind"] == "RoleBinding")
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(role), check=True)  # the Role, but no RoleBinding
    value = f"{SESSION}-nsb"
    served, broken = Runs(kube_cluster, namespace), Runs(kube_cluster, broken_namespace)
    try:
        kubeconfig = _operator_kubeconfig(kube_cluster, tmp_path / "kubeconfig", (namespace, SA))
        args = [f"--namespace={ns}" for ns in (namespace, broken_namespace, missing)]
        op = OperatorProcess(kubeconfig, tmp_path / "operator.log", [*args, f"--selector={SESSION_LABEL}={value}"])
        for runs in (served, broken):
            runs.kubectl("apply", "-f", "-", input=json.dumps(run_body("nsrun", {SESSION_LABEL: value})))
        op.start()
        try:
            started = time.monotonic()
            served.wait_phase("nsrun", "Running", timeout=SERVED_WITHIN)
            assert time.monotonic() - started < SERVED_WITHIN
            watched = (namespace, broken_namespace, missing)
            ready = {ns: op.metric("mlbench_operator_namespace_ready", namespace=ns) for ns in watched}
            assert ready == {namespace: 1.0, broken_namespace: 0.0, missing: 0.0}, op.log_tail(60)
            assert not broken.run("nsrun").get("status")  # it cannot even be read by the operator

            # Said where a user of the operator's namespace sees it: a Warning Event naming the namespace.
            def warned() -> bool:
                out = served.kubectl("get", "events", "-o", "json").stdout
                events = json.loads(out)["items"]
                return any(
                    e.get("reason") == "NamespaceUnavailable" and broken_namespace in (e.get("message") or "")
                    for e in events
                )

            wait_for(warned, timeout=20, what="a NamespaceUnavailable Event")
            assert op.proc is not None
            assert op.proc.poll() is None  # no crash (kopf's watchers never met the 403)

            # The RoleBinding comes back: the namespace is served without a restart.
            kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(binding), check=True)
            broken.wait_phase("nsrun", "Running", timeout=60)
            wait_for(
                lambda: op.metric("mlbench_operator_namespace_ready", namespace=broken_namespace) == 1.0,
                timeout=20,
                what="ready again",
            )

            # Deleted while the operator runs: found by the gate's probe (not at the watches' reconnect, 300 s
            # on, where kopf's watch would meet the 403), reported, and the other namespace is still served.
            binding_name = binding["metadata"]["name"]
            broken.kubectl("delete", "rolebinding", binding_name, check=True)
            wait_for(
                lambda: op.metric("mlbench_operator_namespace_ready", namespace=broken_namespace) == 0.0,
                timeout=PROBE_SECONDS + 10,
                what="unavailable again",
            )
            served.kubectl("apply", "-f", "-", input=json.dumps(run_body("nsrun2", {SESSION_LABEL: value})))
            served.wait_phase("nsrun2", "Running", timeout=30)
            assert op.starts == 1
            assert op.proc is not None
            assert op.proc.poll() is None
        finally:
            for runs, name in ((served, "nsrun"), (served, "nsrun2"), (broken, "nsrun")):
                _release(runs, name)
            op.stop()
    finally:
        kube_cluster.kubectl("delete", "clusterrolebinding", cluster_binding["metadata"]["name"], "--ignore-not-found")
