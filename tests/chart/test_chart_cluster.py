"""charts/mlbench on the test cluster's API server with a real helm: ``helm install`` creates the CRDs, the
operator's Deployment and its RBAC; ``helm upgrade`` with changed values (image tag, cluster-wide to namespaced
RBAC) applies them; ``helm uninstall`` leaves nothing of the release but the CRDs (Helm never deletes those).

The pods are not run (kwok nodes): that the operator image starts and runs the smoke task is the e2e's part. The
admission policy is left off so that other tests' runs in the shared cluster are not judged by it meanwhile; its
objects are compared with manifests/policy in test_chart.py. Objects of the chart that exist before (other tests
apply the user roles or the catalog) are adopted with ``--take-ownership`` and put back afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.cluster.helm import CHART, Helm
from tests.cluster.plugin import KubeCluster, create_namespace

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
