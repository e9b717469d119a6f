"""Every pod the operator creates passes the ``restricted`` Pod Security Standard (checked offline).

The rules follow https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline +
restricted, latest). The cluster test (test_cluster_datasets.py) shows the real admission plugin agrees. The
operator's own namespace enforces restricted and its Deployment's pod passes it (offline, and by the API server).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_operator import fetchjob, runpods
from mlbench_operator.run import admission
from mlbench_operator.runcontext import RunContext
from mlbench_operator.settings import DatasetSettings
from tests.cluster.plugin import KubeCluster, pod_security_labels
from tests.operator import helpers as h

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What the ``restricted`` profile would refuse in a pod spec (empty: admitted)."""
    out: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"spec.{key}")
    for vol in spec.get("volumes") or []:
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {vol['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    if pod_sc.get("runAsUser") == 0:
        out.append("spec.securityContext.runAsUser=0")
    seccomp_ok = (pod_sc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    for group in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(group) or []:
            where = f"{group}[{container['name']}]"
            sc = container.get("securityContext") or {}
            if sc.get("privileged"):
                out.append(f"{where}: privileged")
            if sc.get("allowPrivilegeEscalation") is not False:
                out.append(f"{where}: allowPrivilegeEscalation must be false")
            caps = sc.get("capabilities") or {}
            if "ALL" not in (caps.get("drop") or []):
                out.append(f"{where}: capabilities must drop ALL")
            if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
                out.append(f"{where}: capabilities.add {caps['add']}")
            if not (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot")) or sc.get("runAsNonRoot") is False:
                out.append(f"{where}: runAsNonRoot must be true")
            if sc.get("runAsUser") == 0:
                out.append(f"{where}: runAsUser=0")
            own = (sc.get("seccompProfile") or {}).get("type")
            if not (own in ("RuntimeDefault", "Localhost") or (own is None and seccomp_ok)):
                out.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
            if any(p.get("hostPort") for p in container.get("ports") or []):
                out.append(f"{where}: hostPort")
    return out


def ctx_for(task: dict[str, Any], run_as_user: int | None = 1000) -> RunContext:
    result = admission.admit(h.run(), task, run_as_user, policy=h.PERMISSIVE)
    assert not isinstance(result, admission.Rejection), result
    return result[0]


def every_pod_spec(ctx: RunContext) -> dict[str, dict[str, Any]]:
    specs = {
        "worker": runpods.worker_pod(ctx, 0, 0)["spec"],
        "launcher": runpods.launcher_pod(ctx, 0)["spec"],
    }
    if ctx.task.dataset.source is not None:
        specs["fetch job"] = fetchjob.fetch_job(ctx, DatasetSettings())["spec"]["template"]["spec"]
    return specs


@pytest.mark.parametrize("task", [h.task(), h.sourced_task()], ids=["plain", "sourced"])
def test_every_pod_the_operator_builds_is_restricted(task: dict[str, Any]) -> None:
    specs = every_pod_spec(ctx_for(task))
    assert len(specs) == (3 if "source" in task["spec"]["dataset"] else 2)
    for what, spec in specs.items():
        assert restricted_violations(spec) == [], what


def test_the_checker_catches_violations() -> None:
    # MLBENCH_RUNNER_UID=image: the image's own user (maybe root) cannot be restricted; documented.
    specs = every_pod_spec(ctx_for(h.sourced_task(), run_as_user=None))
    assert all("runAsNonRoot must be true" in " ".join(restricted_violations(s)) for s in specs.values())
    task = h.task()
    task["spec"]["dataset"]["volume"] = {"hostPath": {"path": "/srv/data"}}
    worker = runpods.worker_pod(ctx_for(task), 0, 0)["spec"]
    assert restricted_violations(worker) == ["volume data: ['hostPath']"]


# -- the operator's own namespace and pod ---------------------------------------------------------------------
OPERATOR_MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "operator"


def _operator_manifest(kind: str, filename: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((OPERATOR_MANIFESTS / filename).read_text())
    return next(d for d in docs if d and d["kind"] == kind)


def test_the_operator_namespace_enforces_restricted_and_its_pod_passes() -> None:
    labels = _operator_manifest("Namespace", "namespace.yaml")["metadata"]["labels"]
    assert pod_security_labels("restricted").items() <= labels.items()
    template = _operator_manifest("Deployment", "deployment.yaml")["spec"]["template"]
    assert restricted_violations(template["spec"]) == []


@pytest.mark.cluster
def test_the_api_server_admits_the_operator_pod_where_restricted_is_enforced(
    kube_cluster: KubeCluster, namespace: str
) -> None:
    template = _operator_manifest("Deployment", "deployment.yaml")["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator", **template["metadata"]}}
    pod["spec"] = {**template["spec"], "serviceAccountName": "default"}  # its ServiceAccount lives elsewhere
    res = kube_cluster.kubectl("-n", namespace, "create", "--dry-run=server", "-f", "-", input=json.dumps(pod))
    assert res.returncode == 0, res.stderr
    assert "PodSecurity" not in res.stderr  # not even a warning
