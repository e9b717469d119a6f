"""The local control plane behaves like a real cluster where the operator
depends on it: CRDs, printer columns, scheduling onto kwok nodes, pod
lifecycle on demand, garbage collection."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import DEFAULT_NODES
from tests.cluster.plugin import (
    RESTRICTED_CONTAINER_CONTEXT,
    RESTRICTED_POD_CONTEXT,
    KubeCluster,
    crd_files,
    get_json,
    pod_security_labels,
    wait_for,
)

pytestmark = pytest.mark.cluster

EXIT_CODE = "mlbench.io/kwok-exit-code"
TERM_MSG = "mlbench.io/kwok-termination-message"


def _pod(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod the ``restricted`` Pod Security level admits (the test namespaces enforce it)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.invalid/mlbench/worker:test",
        "securityContext": RESTRICTED_CONTAINER_CONTEXT,
    }
    if "resources" in spec:
        container["resources"] = spec.pop("resources")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "containers": [container],
            "restartPolicy": "Never",
            "securityContext": RESTRICTED_POD_CONTEXT,
            **spec,
        },
    }


def _create(kube_cluster: KubeCluster, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
    res = kube_cluster.kubectl("-n", ns, "create", "-f", "-", "-o", "json", input=json.dumps(obj))
    assert res.returncode == 0, res.stderr
    created: dict[str, Any] = json.loads(res.stdout)
    return created


def _pod_phase(kube_cluster: KubeCluster, ns: str, name: str, phase: str) -> dict[str, Any] | None:
    pod = get_json(kube_cluster, "-n", ns, "pod", name)
    return pod if pod and pod.get("status", {}).get("phase") == phase else None


# ------------------------------------------------------------------ CRDs
def test_crds_installed_and_established(kube_cluster: KubeCluster) -> None:
    files = crd_files()
    assert files, "no CRDs found in crds/bases"
    expected = {yaml.safe_load(f.read_text())["metadata"]["name"] for f in files}
    assert {n.split("/", 1)[1] for n in kube_cluster.crds} == expected
    for name in expected:
        crd = get_json(kube_cluster, "crd", name)
        conds = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conds.get("Established") == "True", crd["status"]
        assert conds.get("NamesAccepted") == "True", crd["status"]


def _crd(plural: str) -> dict[str, Any]:
    for f in crd_files():
        doc: dict[str, Any] = yaml.safe_load(f.read_text())
        if doc["spec"]["names"]["plural"] == plural:
            return doc
    raise AssertionError(f"no CRD for {plural}")


def _minimal_run(name: str, task: str, workers: int) -> dict[str, Any]:
    return {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkRun",
        "metadata": {"name": name},
        "spec": {"taskRef": {"name": task}, "workers": workers},
    }


def test_kubectl_get_mlbench_category(kube_cluster: KubeCluster, namespace: str) -> None:
    res = kube_cluster.kubectl("-n", namespace, "get", "mlbench")
    assert res.returncode == 0, res.stderr
    _create(kube_cluster, namespace, _minimal_run("cat-run", "some-task", 2))
    res = kube_cluster.kubectl("-n", namespace, "get", "mlbench", "-o", "name")
    assert res.returncode == 0, res.stderr
    assert "benchmarkrun.mlbench.io/cat-run" in res.stdout.split()
    res = kube_cluster.kubectl("-n", namespace, "get", "br", "cat-run", "-o", "name")
    assert res.returncode == 0, res.stderr


def test_benchmarkrun_printer_columns(kube_cluster: KubeCluster, namespace: str) -> None:
    columns = _crd("benchmarkruns")["spec"]["versions"][0]["additionalPrinterColumns"]
    created = _create(kube_cluster, namespace, _minimal_run("printer-run", "printer-task", 3))

    def table(*extra: str) -> tuple[list[str], list[str]]:
        res = kube_cluster.kubectl("-n", namespace, "get", "benchmarkruns", *extra)
        assert res.returncode == 0, res.stderr
        lines = res.stdout.splitlines()
        assert len(lines) == 2, res.stdout
        return lines[0].split(), lines[1].split()

    header, row = table()
    default_cols = [c["name"].upper() for c in columns if not c.get("priority")]
    assert header == ["NAME", *default_cols]
    values = dict(zip(header, row, strict=False))
    assert values["NAME"] == "printer-run"
    assert values["TASK"] == "printer-task"
    assert values["WORKERS"] == "3"
    if "BACKEND" in values and created["spec"].get("backend"):
        assert values["BACKEND"] == created["spec"]["backend"]
    for col in ("TASK", "WORKERS", "BACKEND", "PHASE"):
        assert col in header

    wide, _ = table("-o", "wide")
    assert wide == ["NAME", *[c["name"].upper() for c in columns]]


# ----------------------------------------------------------------- nodes
def test_fake_nodes_ready_with_capacity(kube_cluster: KubeCluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in get_json(kube_cluster, "nodes")["items"]}
    for spec in DEFAULT_NODES:
        node = nodes[spec.name]
        conds = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conds["Ready"] == "True"
        assert not node["spec"].get("taints")
        alloc = node["status"]["allocatable"]
        assert alloc["cpu"] == spec.cpu
        assert alloc["memory"] == spec.memory
        assert int(alloc["pods"]) >= 1000
        labels = node["metadata"]["labels"]
        assert labels["kubernetes.io/hostname"] == spec.name
        assert labels["topology.kubernetes.io/zone"] == spec.zone
        if spec.gpus:
            assert alloc["nvidia.com/gpu"] == str(spec.gpus)
            assert labels["nvidia.com/gpu.present"] == "true"


# ------------------------------------------------------------ Pod Security
def _privileged_pod() -> dict[str, Any]:
    pod = _pod("privileged")
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return pod


def test_namespaces_enforce_restricted_by_default(kube_cluster: KubeCluster, namespace: str) -> None:
    labels = get_json(kube_cluster, "namespace", namespace)["metadata"]["labels"]
    assert pod_security_labels("restricted").items() <= labels.items()
    refused = kube_cluster.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(_privileged_pod()))
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr
    _create(kube_cluster, namespace, _pod("compliant"))  # the tests' own pods are restricted


# a test of the opt-out itself: a privileged pod is admitted only where the test asked for it
@pytest.mark.pod_security("privileged", reason="checks that the marker opts the namespace out of restricted")
def test_pod_security_marker_opts_out(kube_cluster: KubeCluster, namespace: str) -> None:
    labels = get_json(kube_cluster, "namespace", namespace)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
    _create(kube_cluster, namespace, _privileged_pod())


# ------------------------------------------------------------------ pods
def test_plain_pod_runs_and_stays_ready(kube_cluster: KubeCluster, namespace: str) -> None:
    _create(kube_cluster, namespace, _pod("plain"))
    pod = wait_for(lambda: _pod_phase(kube_cluster, namespace, "plain", "Running"), what="Running")
    assert pod["spec"]["nodeName"] in {n.name for n in DEFAULT_NODES}
    assert pod["status"]["podIP"]
    conds = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conds["Ready"] == "True"
    (cs,) = pod["status"]["containerStatuses"]
    assert cs["ready"] is True
    assert "running" in cs["state"]


def test_gpu_pod_lands_on_gpu_node(kube_cluster: KubeCluster, namespace: str) -> None:
    gpu = {"nvidia.com/gpu": "8", "cpu": "4", "memory": "16Gi"}
    _create(kube_cluster, namespace, _pod("gpu", resources={"limits": gpu, "requests": gpu}))
    pod = wait_for(lambda: _pod_phase(kube_cluster, namespace, "gpu", "Running"), what="Running")
    gpu_nodes = {n.name for n in DEFAULT_NODES if n.gpus}
    assert pod["spec"]["nodeName"] in gpu_nodes


@pytest.mark.parametrize(("code", "phase", "reason"), [("0", "Succeeded", "Completed"), ("3", "Failed", "Error")])
def test_annotated_pod_completes(kube_cluster: KubeCluster, namespace: str, code: str, phase: str, reason: str) -> None:
    message = f"loss=0.25 phase={phase} {uuid.uuid4().hex[:6]}"
    name = f"exit-{code}"
    _create(kube_cluster, namespace, _pod(name, {EXIT_CODE: code, TERM_MSG: message}))
    pod = wait_for(lambda: _pod_phase(kube_cluster, namespace, name, phase), what=phase)
    (cs,) = pod["status"]["containerStatuses"]
    term = cs["state"]["terminated"]
    assert term["exitCode"] == int(code)
    assert term["reason"] == reason
    assert term["message"] == message


def test_deleted_pod_goes_away(kube_cluster: KubeCluster, namespace: str) -> None:
    _create(kube_cluster, namespace, _pod("doomed"))
    wait_for(lambda: _pod_phase(kube_cluster, namespace, "doomed", "Running"), what="Running")
    res = kube_cluster.kubectl("-n", namespace, "delete", "pod", "doomed", "--wait=false")
    assert res.returncode == 0, res.stderr
    wait_for(lambda: get_json(kube_cluster, "-n", namespace, "pod", "doomed") is None, what="pod gone")


# ---------------------------------------------------- garbage collection
def test_owner_deletion_cascades_to_pods(kube_cluster: KubeCluster, namespace: str) -> None:
    owner = _create(
        kube_cluster, namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}, "data": {}}
    )
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    for i in range(3):
        pod = _pod(f"child-{i}")
        pod["metadata"]["ownerReferences"] = [ref]
        _create(kube_cluster, namespace, pod)
    wait_for(
        lambda: all(_pod_phase(kube_cluster, namespace, f"child-{i}", "Running") for i in range(3)),
        what="children Running",
    )
    res = kube_cluster.kubectl("-n", namespace, "delete", "configmap", "owner", "--wait=false")
    assert res.returncode == 0, res.stderr
    wait_for(
        lambda: not get_json(kube_cluster, "-n", namespace, "pods")["items"],
        timeout=60,
        what="garbage collector to delete the children",
    )


def test_job_completes_and_cascades(kube_cluster: KubeCluster, namespace: str) -> None:
    template = _pod("ignored", {EXIT_CODE: "0", TERM_MSG: "done"})
    template = {"metadata": {"annotations": template["metadata"]["annotations"]}, "spec": template["spec"]}
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "job"},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": template,
        },
    }
    _create(kube_cluster, namespace, job)

    def complete() -> bool:
        status = (get_json(kube_cluster, "-n", namespace, "job", "job") or {}).get("status", {})
        return any(c["type"] == "Complete" and c["status"] == "True" for c in status.get("conditions", []))

    wait_for(complete, timeout=60, what="Job Complete")
    pods = get_json(kube_cluster, "-n", namespace, "pods", "-l", "job-name=job")["items"]
    assert len(pods) == 2
    assert all(p["status"]["phase"] == "Succeeded" for p in pods)
    res = kube_cluster.kubectl("-n", namespace, "delete", "job", "job", "--cascade=background", "--wait=false")
    assert res.returncode == 0, res.stderr
    wait_for(
        lambda: not get_json(kube_cluster, "-n", namespace, "pods", "-l", "job-name=job")["items"],
        timeout=60,
        what="Job pods garbage collected",
    )
