"""manifests/gitops: the argocd-cm it builds embeds health.lua byte for byte, the platform overlay orders
the CRDs first, and the example Argo CD Applications and Flux objects have the documented shape.

The Flux ``healthCheckExprs`` are checked for shape only: no CEL interpreter is installed here (the
``cel-python`` package is not in the environment), so the expressions are not evaluated. What is
checked: the schema of the entries (Flux 2.5's CustomHealthCheck), that they target the BenchmarkRun
CRD's served version, that every field they read exists in the CRD's schema, and that every phase and
condition type they compare with is one the operator writes.

manifests/policy (the API server's admission policy) builds, and so does the widening overlay docs/operator.md
shows; tests/operator/test_admission_policy.py runs the policy on the test cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_api.runstatus import Phase

REPO = Path(__file__).resolve().parents[2]
GITOPS = REPO / "manifests" / "gitops"
ARGOCD = GITOPS / "argocd"
COMPONENT = ARGOCD / "health-check"
SCRIPT = COMPONENT / "mlbench.io" / "BenchmarkRun" / "health.lua"
KEY = "resource.customizations.health.mlbench.io_BenchmarkRun"
SWEEP_SCRIPT = COMPONENT / "mlbench.io" / "BenchmarkSweep" / "health.lua"
#: argocd-cm's keys the component sets: one health check per kind applied from Git (a kind without one is
#: Healthy as soon as it exists)
SCRIPTS = {
    KEY: SCRIPT.read_text(),
    "resource.customizations.health.mlbench.io_BenchmarkSweep": SWEEP_SCRIPT.read_text(),
}
RUN_CRD = REPO / "crds" / "bases" / "mlbench.io_benchmarkruns.yaml"
SWEEP_CRD = REPO / "crds" / "bases" / "mlbench.io_benchmarksweeps.yaml"
#: condition types of the status contract (docs/operator.md, docs/gitops.md)
CONDITION_TYPES = {
    "DatasetReady",
    "WorkersReady",
    "Running",
    "GoalReached",
    "Succeeded",
    "Failed",
    "Restarted",
    "Ready",
    "Reconciling",
    "Stalled",
}
Obj = dict[str, Any]


def kubectl() -> str:
    """kubectl as the rest of the suite finds it ($MLBENCH_KUBECTL, the built one, PATH); skip without."""
    override = os.environ.get("MLBENCH_KUBECTL")
    if override:
        return override
    from tests.cluster.cluster import kubectl_path

    built = kubectl_path()
    if built.exists():
        return str(built)
    found = shutil.which("kubectl")
    if not found:
        pytest.skip(f"no kubectl: not built at {built} (`make k8s-bins`), none on PATH, MLBENCH_KUBECTL unset")
    return found


def kustomize(path: Path) -> list[Obj]:
    res = subprocess.run([kubectl(), "kustomize", str(path)], check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"kubectl kustomize {path} failed: {res.stderr}"
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


# ---------------------------------------------------------------- Argo CD


@pytest.mark.multiproc
def test_standalone_argocd_cm_embeds_the_script() -> None:
    (cm,) = kustomize(ARGOCD)
    assert (cm["kind"], cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("ConfigMap", "argocd-cm", "argocd")
    # Argo CD only reads ConfigMaps carrying this label
    assert cm["metadata"]["labels"]["app.kubernetes.io/part-of"] == "argocd"
    assert cm["data"] == SCRIPTS


@pytest.mark.multiproc
def test_component_merges_into_an_existing_argocd_cm(tmp_path: Path) -> None:
    """As in a kustomization that installs Argo CD: the other keys stay, no name suffix is added."""
    (tmp_path / "install.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "argocd-cm", "labels": {"app.kubernetes.io/part-of": "argocd"}},
                "data": {"url": "https://argocd.example.com", "resource.customizations.health.x_Y": "hs = {}"},
            }
        )
    )
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "namespace": "gitops",
                "resources": ["install.yaml"],
                "components": [os.path.relpath(COMPONENT, tmp_path)],
            }
        )
    )
    (cm,) = kustomize(tmp_path)
    assert cm["metadata"]["name"] == "argocd-cm"
    assert cm["metadata"]["namespace"] == "gitops"
    assert cm["data"] == {
        "url": "https://argocd.example.com",
        "resource.customizations.health.x_Y": "hs = {}",
        **SCRIPTS,
    }


@pytest.mark.multiproc
def test_platform_overlay_puts_the_crds_in_an_earlier_wave() -> None:
    def wave(obj: Obj) -> int:
        return int((obj["metadata"].get("annotations") or {}).get("argocd.argoproj.io/sync-wave", "0"))

    objs = kustomize(ARGOCD / "platform")
    default = kustomize(REPO / "manifests" / "default")
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in default
    )
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    assert {c["metadata"]["name"] for c in crds} == {
        "benchmarkruns.mlbench.io",
        "benchmarksweeps.mlbench.io",
        "benchmarktasks.mlbench.io",
    }
    last_crd_wave = max(wave(c) for c in crds)
    assert all(wave(o) > last_crd_wave for o in objs if o["kind"] != "CustomResourceDefinition")


def test_example_applications() -> None:
    apps = {a["metadata"]["name"]: a for a in docs(ARGOCD / "applications.yaml")}
    assert set(apps) == {"mlbench", "benchmark-runs"}
    for app in apps.values():
        assert (app["apiVersion"], app["kind"]) == ("argoproj.io/v1alpha1", "Application")
        assert {"project", "source", "destination"} <= set(app["spec"])
    assert (REPO / apps["mlbench"]["spec"]["source"]["path"]).is_dir()
    # the documented defaults for runs: neither delete a run (and its results) nor re-create a deleted one
    automated = apps["benchmark-runs"]["spec"]["syncPolicy"]["automated"]
    assert automated == {"prune": False, "selfHeal": False}


# ---------------------------------------------------------------- Flux


def flux() -> dict[tuple[str, str], Obj]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs(GITOPS / "flux" / "mlbench.yaml")}


def run_crd(path: Path = RUN_CRD) -> Obj:
    crd = yaml.safe_load(path.read_text())
    assert isinstance(crd, dict)
    return crd


def flux_check(kind: str) -> Obj:
    """The benchmark-runs Kustomization's healthCheckExprs entry for ``kind``."""
    checks = flux()[("Kustomization", "benchmark-runs")]["spec"]["healthCheckExprs"]
    (check,) = [c for c in checks if c["kind"] == kind]
    return dict(check)


def test_flux_checks_every_mlbench_kind_applied_from_git() -> None:
    """Runs and sweeps: Flux's kstatus fallback reads Reconciling before Stalled, so a stalled sweep would be
    InProgress until the timeout without its own expressions."""
    checks = flux()[("Kustomization", "benchmark-runs")]["spec"]["healthCheckExprs"]
    assert sorted(c["kind"] for c in checks) == ["BenchmarkRun", "BenchmarkSweep"]


def test_flux_objects() -> None:
    objs = flux()
    for (kind, name), obj in objs.items():
        want = {
            "GitRepository": "source.toolkit.fluxcd.io/v1",
            "Kustomization": "kustomize.toolkit.fluxcd.io/v1",
            "Namespace": "v1",
        }[kind]
        assert obj["apiVersion"] == want, name
        if kind == "Kustomization":
            spec = obj["spec"]
            assert {"interval", "sourceRef", "prune"} <= set(spec), name
            assert isinstance(spec["prune"], bool)
            assert ("GitRepository", spec["sourceRef"]["name"]) in objs, name
            for dep in spec.get("dependsOn", []):
                assert ("Kustomization", dep["name"]) in objs, name
    platform = objs[("Kustomization", "mlbench")]["spec"]
    assert (REPO / platform["path"]).is_dir()
    runs = objs[("Kustomization", "benchmark-runs")]["spec"]
    assert runs["dependsOn"] == [{"name": "mlbench"}], "runs must wait for the CRDs and the catalog"
    assert runs["wait"] is True
    assert runs["prune"] is False


def pod_security_labels() -> dict[str, str]:
    """The Pod Security labels of the operator's own namespace: what a runs' namespace gets too."""
    (ns,) = docs(REPO / "manifests" / "operator" / "namespace.yaml")
    labels = {k: v for k, v in ns["metadata"]["labels"].items() if k.startswith("pod-security.kubernetes.io/")}
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    return labels


def test_the_runs_namespace_is_created_restricted() -> None:
    """Nothing else creates the namespace the runs are synced into: the GitOps tool must, restricted."""
    app = {a["metadata"]["name"]: a for a in docs(ARGOCD / "applications.yaml")}["benchmark-runs"]["spec"]
    assert "CreateNamespace=true" in app["syncPolicy"]["syncOptions"]
    assert app["syncPolicy"]["managedNamespaceMetadata"]["labels"] == pod_security_labels()

    objs = flux()
    target = objs[("Kustomization", "benchmark-runs")]["spec"]["targetNamespace"]
    ns = objs[("Namespace", target)]["metadata"]
    assert {k: v for k, v in ns["labels"].items() if k.startswith("pod-security.")} == pod_security_labels()
    # removing it from Git must not delete every run in it, with its results
    assert ns["annotations"]["kustomize.toolkit.fluxcd.io/prune"] == "disabled"


@pytest.mark.parametrize(("kind", "crd_file"), [("BenchmarkRun", RUN_CRD), ("BenchmarkSweep", SWEEP_CRD)])
def test_flux_health_check_exprs_shape(kind: str, crd_file: Path) -> None:
    crd = run_crd(crd_file)
    served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    check = flux_check(kind)
    assert set(check) <= {"apiVersion", "kind", "current", "inProgress", "failed"}
    assert {"apiVersion", "kind", "current"} <= set(check)
    group, version = check["apiVersion"].split("/")
    assert group == crd["spec"]["group"]
    assert version in served
    assert check["kind"] == crd["spec"]["names"]["kind"]
    for key in ("current", "inProgress", "failed"):
        assert isinstance(check[key], str)
        assert check[key].strip()
        assert check[key].count("(") == check[key].count(")"), key
        assert check[key].count("[") == check[key].count("]"), key


def _schema_has(schema: Obj, path: list[str]) -> bool:
    for part in path:
        props = schema.get("properties") or {}
        if part not in props:
            return False
        schema = props[part]
    return True


@pytest.mark.parametrize(("kind", "crd_file"), [("BenchmarkRun", RUN_CRD), ("BenchmarkSweep", SWEEP_CRD)])
def test_flux_health_check_exprs_read_only_real_fields_and_values(kind: str, crd_file: Path) -> None:
    crd = run_crd(crd_file)
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    schema = version["schema"]["openAPIV3Schema"]
    check = flux_check(kind)
    exprs = " ".join(check[k] for k in ("current", "inProgress", "failed"))

    fields = re.findall(r"\b((?:status|metadata)(?:\.\??[A-Za-z]+\b(?!\())+)", exprs)  # not .orValue(
    assert fields
    for field in fields:
        path = field.replace("?", "").split(".")
        if path[0] == "metadata":
            assert path == ["metadata", "generation"], field
        else:
            assert _schema_has(schema, path), f"{field}: not in the {kind} CRD's schema"
    condition_fields = set(re.findall(r"\bc\.([A-Za-z]+)", exprs))
    assert condition_fields
    assert condition_fields <= set(schema["properties"]["status"]["properties"]["conditions"]["items"]["properties"])

    phases = {p.value for p in Phase}
    literals = set(re.findall(r"'([^']*)'", exprs)) - {""}
    compared_types = set(re.findall(r"c\.type == '([^']*)'", exprs))
    assert compared_types <= CONDITION_TYPES
    assert literals - compared_types - {"True", "False", "Unknown"} <= phases
    if kind == "BenchmarkSweep":  # no phase: its kstatus conditions decide
        assert "'Stalled'" in check["failed"]
        assert "'Ready'" in check["current"]
        assert "'Stalled'" in check["inProgress"]
        return
    # the three outcomes are all there: Succeeded is current, Failed failed, the live phases in progress
    assert "'Succeeded'" in check["current"]
    assert "'Failed'" in check["failed"]
    assert all(f"'{p}'" in check["inProgress"] for p in ("Pending", "Starting", "Running"))
    assert "'Stalled'" in check["failed"]


# ---------------------------------------------------------------- the API server's admission policy

POLICY = REPO / "manifests" / "policy"


@pytest.mark.multiproc
def test_policy_kustomization_builds() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in kustomize(POLICY)}
    assert set(objs) == {
        ("ValidatingAdmissionPolicy", "mlbench-admission-policy"),
        ("ValidatingAdmissionPolicyBinding", "mlbench-admission-policy"),
    }
    assert all(o["apiVersion"] == "admissionregistration.k8s.io/v1" for o in objs.values())
    # cluster-scoped objects, kept apart from manifests/default (an admin's decision, Kubernetes 1.30+)
    assert all("namespace" not in o["metadata"] for o in objs.values())
    assert not set(objs) & {(o["kind"], o["metadata"]["name"]) for o in kustomize(REPO / "manifests" / "default")}


def _documented_overlay() -> str:
    """The widening overlay of docs/operator.md ("Admission policy at the API server")."""
    text = (REPO / "docs" / "operator.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    (overlay,) = [b for b in blocks if "kind: Kustomization" in b and "mlbench-admission-policy" in b]
    return str(overlay)


@pytest.mark.multiproc
@pytest.mark.parametrize("order_changed", [False, True])
def test_documented_policy_widening_builds(tmp_path: Path, order_changed: bool) -> None:
    overlay = _documented_overlay().replace("../mlbench/manifests/policy", os.path.relpath(POLICY, tmp_path))
    if order_changed:  # the patch's `test` op refuses to patch another variable than it names
        overlay = overlay.replace("value: allowedImages", "value: allowedPriorityClasses")
    (tmp_path / "kustomization.yaml").write_text(overlay)
    if order_changed:
        res = subprocess.run([kubectl(), "kustomize", str(tmp_path)], check=False, capture_output=True, text=True)
        assert res.returncode != 0
        return
    (policy,) = [o for o in kustomize(tmp_path) if o["kind"] == "ValidatingAdmissionPolicy"]
    first = policy["spec"]["variables"][0]
    assert first == {"name": "allowedImages", "expression": "['registry.example.com/ml/*', 'mlbench/mlbench-runner:*']"}
