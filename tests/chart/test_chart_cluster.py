"""charts/mlbench on the test cluster's API server with a real helm: ``helm install`` creates the CRDs, the
operator's Deployment and its RBAC; ``helm upgrade`` with changed values (image tag, cluster-wide to namespaced
RBAC) applies them; ``helm uninstall`` leaves nothing of the release but the CRDs (Helm never deletes those).

The pods are not run (kwok nodes): that the operator image starts and runs the smoke task is the e2e's part. The
admission policy is left off so that other tests' runs in the shared cluster are not judged by it meanwhile; its
objects are compared with manifests/policy in test_chart.py. Objects of the chart that exist before (other tests
apply the user roles or the catalog) are adopted with ``--take-ownership`` and put back afterwards.

An upgrade with a run in flight keeps it (test_an_upgrade_keeps_a_run_in_flight): the operator runs as the chart's
Deployment says (its ServiceAccount's token, its env values and arguments, in the release's namespace), as a
process here since kwok nodes run no containers; the upgrade replaces it as a rolling update would."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import factories
from tests.cluster.helm import CHART, Helm
from tests.cluster.plugin import KubeCluster, create_namespace
from tests.operator import helpers as h
from tests.operator.conftest import OperatorProcess, Runs, _operator_kubeconfig

pytestmark = pytest.mark.cluster

RELEASE = "mlbench-chart"
OPERATOR = "mlbench-operator"
BASE_SETS = ("admissionPolicy.enabled=false",)
Obj = dict[str, Any]
VOLATILE = ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation")


def sets(*more: str) -> list[str]:
    return [a for s in (*BASE_SETS, *more) for a in ("--set", s)]


def present(cluster: KubeCluster, manifest: str) -> list[Obj]:
    """The objects named in ``manifest`` that exist on the server."""
    res = cluster.kubectl("get", "-f", "-", "--ignore-not-found", "-o", "json", input=manifest, check=True)
    if not res.stdout.strip():
        return []
    items: list[Obj] = json.loads(res.stdout).get("items", [])
    return items


def restore(cluster: KubeCluster, objs: list[Obj]) -> None:
    for obj in objs:
        meta = obj["metadata"]
        for field in VOLATILE:
            meta.pop(field, None)
        obj.pop("status", None)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(obj), check=True)


def get(cluster: KubeCluster, *args: str) -> Obj:
    obj: Obj = json.loads(cluster.kubectl("get", *args, "-o", "json", check=True).stdout)
    return obj


def can(cluster: KubeCluster, ns: str, verb: str, resource: str, where: str) -> bool:
    sa = f"system:serviceaccount:{ns}:{OPERATOR}"
    return cluster.kubectl("auth", "can-i", verb, resource, f"--as={sa}", "-n", where).stdout.strip() == "yes"


@pytest.fixture
def cluster_helm(kube_cluster: KubeCluster, helm: Helm) -> Helm:
    return Helm(helm.binary, helm.home, kube_cluster.kubeconfig)


@pytest.fixture
def namespaces(kube_cluster: KubeCluster) -> Iterator[tuple[str, str]]:
    """(the release's namespace, a namespace the operator watches once namespaced)."""
    names = (create_namespace(kube_cluster), create_namespace(kube_cluster))
    yield names
    for ns in names:
        kube_cluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")


def test_install_upgrade_uninstall(kube_cluster: KubeCluster, cluster_helm: Helm, namespaces: tuple[str, str]) -> None:
    ns, watched = namespaces
    upgrade_sets = sets("image.tag=9.9.9", "rbac.scope=namespaced", f"rbac.namespaces={{{watched}}}")
    rendered = "".join(
        cluster_helm("template", RELEASE, str(CHART), "-n", ns, *s).stdout for s in (sets(), upgrade_sets)
    )
    before = present(kube_cluster, rendered)
    try:
        cluster_helm("install", RELEASE, str(CHART), "-n", ns, "--take-ownership", *sets())
        installed(kube_cluster, ns, watched)
        cluster_helm("upgrade", RELEASE, str(CHART), "-n", ns, *upgrade_sets)
        upgraded(kube_cluster, ns, watched)
        manifest = cluster_helm("get", "manifest", RELEASE, "-n", ns).stdout
        assert len([d for d in yaml.safe_load_all(manifest) if d]) > 10
        cluster_helm("uninstall", RELEASE, "-n", ns, "--wait")
        left = [f"{o['kind']}/{o['metadata']['name']}" for o in present(kube_cluster, rendered)]
        assert left == [], f"left after helm uninstall: {left}"
        assert cluster_helm("list", "-n", ns, "-q").stdout.strip() == ""
        assert get(kube_cluster, "secrets", "-n", ns, "-l", f"owner=helm,name={RELEASE}")["items"] == []
        for crd in ("benchmarkruns", "benchmarktasks", "benchmarksweeps"):  # Helm keeps CRDs
            assert kube_cluster.kubectl("get", "crd", f"{crd}.mlbench.io").returncode == 0
    finally:
        cluster_helm("uninstall", RELEASE, "-n", ns, "--wait", check=False)
        restore(kube_cluster, before)


def installed(cluster: KubeCluster, ns: str, watched: str) -> None:
    """The CRDs, the operator's Deployment (default images), its cluster-wide RBAC and the catalog."""
    for crd in ("benchmarkruns", "benchmarktasks", "benchmarksweeps"):
        cond = get(cluster, "crd", f"{crd}.mlbench.io")["status"]["conditions"]
        assert any(c["type"] == "Established" and c["status"] == "True" for c in cond), crd
    dep = get(cluster, "deployment", OPERATOR, "-n", ns)
    assert dep["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    container = dep["spec"]["template"]["spec"]["containers"][0]
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container["image"].endswith(f"/mlbench-operator:{version}")
    binding = get(cluster, "clusterrolebinding", OPERATOR)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": ns}]
    assert can(cluster, ns, "list", "benchmarkruns.mlbench.io", watched)
    assert can(cluster, ns, "create", "pods", "default")
    assert get(cluster, "benchmarktasks")["items"], "the catalog's tasks"


def upgraded(cluster: KubeCluster, ns: str, watched: str) -> None:
    """The new tag on both images; RBAC in the watched namespace only, the cluster-wide binding gone."""
    container = get(cluster, "deployment", OPERATOR, "-n", ns)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].endswith("/mlbench-operator:9.9.9")
    runner = next(e["value"] for e in container["env"] if e["name"] == "MLBENCH_RUNNER_IMAGE")
    assert runner.endswith("/mlbench-runner:9.9.9")
    assert container["args"][-1] == f"--namespace={watched}"
    assert cluster.kubectl("get", "clusterrolebinding", OPERATOR).returncode != 0
    assert can(cluster, ns, "list", "benchmarkruns.mlbench.io", watched)
    assert not can(cluster, ns, "list", "benchmarkruns.mlbench.io", "default")
    assert can(cluster, ns, "get", "benchmarktasks.mlbench.io", "default")  # cluster-scoped: mlbench-operator-cluster


# -- an upgrade with a run in flight ---------------------------------------------------------------------------
#: The Deployment's arguments the test process sets itself (a free port, no liveness server).
OWN_ARGS = ("--metrics-port=", "--liveness=")


def deployed_operator(
    cluster: KubeCluster, ns: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, n: int
) -> OperatorProcess:
    """The operator as the release's Deployment describes it, started here: its ServiceAccount's token, its env
    values, its arguments, its namespace (the Lease's, POD_NAMESPACE)."""
    container = get(cluster, "deployment", OPERATOR, "-n", ns)["spec"]["template"]["spec"]["containers"][0]
    for env in container.get("env", []):
        if "value" in env:
            monkeypatch.setenv(env["name"], env["value"])
    monkeypatch.setenv("POD_NAMESPACE", ns)
    monkeypatch.setenv("MLBENCH_LEADER_ELECTION_NAMESPACE", ns)
    args = [a for a in container.get("args", []) if not a.startswith(OWN_ARGS)]
    kubeconfig = _operator_kubeconfig(cluster, tmp / f"kubeconfig-{n}", service_account=(ns, OPERATOR))
    proc = OperatorProcess(kubeconfig, tmp / f"operator-{n}.log", extra_args=args)
    proc.start()
    return proc


def world(runs: Runs, name: str) -> dict[str, tuple[str, Any]]:
    """The run's objects: (uid, content) of its Secret, ConfigMap and each pod (content: data, or the pod's phase)."""
    out: dict[str, tuple[str, Any]] = {}
    for kind, obj_name in (("secret", f"{name}-ssh"), ("configmap", f"{name}-config")):
        obj = runs.get(kind, obj_name)
        assert obj is not None, f"{kind} {obj_name} is gone"
        out[f"{kind}/{obj_name}"] = (obj["metadata"]["uid"], obj["data"])
    for pod_name, pod in runs.pods(name).items():
        out[f"pod/{pod_name}"] = (pod["metadata"]["uid"], pod["status"].get("phase"))
    return out


def release_run(runs: Runs, name: str) -> None:
    """The run deleted; its finalizer removed by hand if no operator released it."""
    runs.kubectl("delete", "benchmarkrun", name, "--wait=false", "--ignore-not-found", check=False)
    if runs.get("benchmarkrun", name) is not None:
        patch = json.dumps({"metadata": {"finalizers": None}})
        runs.kubectl("patch", "benchmarkrun", name, "--type=merge", "-p", patch, check=False)


def test_an_upgrade_keeps_a_run_in_flight(
    kube_cluster: KubeCluster,
    cluster_helm: Helm,
    namespaces: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``helm upgrade`` (a new tag and resources, cluster-wide -> namespaced RBAC watching the run's namespace)
    while a run's pods are Running: its Secret, ConfigMap and pods are the same objects after, its status is
    kept, and the upgraded operator reconciles it to the end (Succeeded from the launcher's summary)."""
    ns, watched = namespaces
    task = f"upgrade-{uuid.uuid4().hex[:8]}"
    upgrade_sets = sets(
        "image.tag=9.9.9",
        "operator.resources.limits.memory=2Gi",
        "rbac.scope=namespaced",
        f"rbac.namespaces={{{watched}}}",
    )
    rendered = "".join(
        cluster_helm("template", RELEASE, str(CHART), "-n", ns, *s).stdout for s in (sets(), upgrade_sets)
    )
    before = present(kube_cluster, rendered)
    runs, name = Runs(kube_cluster, watched), "inflight"
    procs: list[OperatorProcess] = []
    try:
        cluster_helm("install", RELEASE, str(CHART), "-n", ns, "--take-ownership", *sets())
        kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(h.task(task)), check=True)
        procs.append(deployed_operator(kube_cluster, ns, tmp_path, monkeypatch, 1))
        runs.apply(h.run(name, workers=2, task_name=task))
        started = runs.wait_phase(name, "Running")
        kept = world(runs, name)
        pods = {k: phase for k, (_, phase) in kept.items() if k.startswith("pod/")}
        assert set(pods) == {f"pod/{name}-launcher", f"pod/{name}-worker-0", f"pod/{name}-worker-1"}
        assert set(pods.values()) == {"Running"}

        cluster_helm("upgrade", RELEASE, str(CHART), "-n", ns, *upgrade_sets)
        procs.pop().stop()  # the rolling update: the old pod goes, the new one starts with the new settings
        upgraded(kube_cluster, ns, watched)
        procs.append(deployed_operator(kube_cluster, ns, tmp_path, monkeypatch, 2))
        assert world(runs, name) == kept

        runs.finish_launcher(name, 0, factories.summary(name, world_size=2).termination_message())
        done = runs.wait_phase(name, "Succeeded", timeout=90)
        assert done["startTime"] == started["startTime"]
        assert done["result"]["worldSize"] == 2
        assert done.get("restarts", 0) == started.get("restarts", 0)
        after = world(runs, name)
        for key in (f"secret/{name}-ssh", f"configmap/{name}-config", f"pod/{name}-launcher"):
            assert after[key][0] == kept[key][0], f"{key} was replaced"
        assert after[f"secret/{name}-ssh"] == kept[f"secret/{name}-ssh"]
        runs.kubectl("delete", "benchmarkrun", name, "--wait=true", "--timeout=60s")
    finally:
        release_run(runs, name)
        for proc in procs:
            proc.stop()
        kube_cluster.kubectl("delete", "benchmarktask", task, "--ignore-not-found")
        cluster_helm("uninstall", RELEASE, "-n", ns, "--wait", check=False)
        restore(kube_cluster, before)
