"""The monitoring kustomize layer: it builds, carries the release label, and its PodMonitor / ServiceMonitor
select exactly the rank endpoints of the pods the operator builds, with the documented target labels.

The selection is computed twice: by the pure-Python Prometheus model in tests/monitoring/relabel.py (fast,
exact expectations) and by Debian's real Prometheus fed the same discovered labels through file SD (so the
Python model cannot drift from Prometheus' relabeling).  The scrape config comes from promconfig.py, the
translation of the monitors that a plain Prometheus (and the lead's real-cluster scrape test) uses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_operator import runpods
from mlbench_operator.run import admission
from mlbench_operator.runcontext import RunContext
from tests.monitoring import promconfig, prometheus
from tests.monitoring.k8s_sd import DiscoveryServer, as_group, endpoints_targets, pod_targets
from tests.monitoring.relabel import relabel, scrape_target
from tests.operator import helpers as h

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "monitoring"
WITH_MONITORING = REPO / "manifests" / "with-monitoring"
RELEASE = {"release": "kube-prometheus-stack"}
Obj = dict[str, Any]


def kubectl_bin() -> str:
    """kubectl as tests/cluster finds it ($MLBENCH_KUBECTL, the built one, PATH); skip when there is none."""
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
    res = subprocess.run(
        [kubectl_bin(), "kustomize", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, f"kubectl kustomize {path} failed: {res.stderr}"
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.fixture(scope="module")
def monitoring() -> list[Obj]:
    return kustomize(MONITORING)


def one(objs: list[Obj], kind: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def ctx_for(**kwargs: object) -> RunContext:
    result = admission.admit(h.run(**kwargs), h.task())  # type: ignore[arg-type]
    assert not isinstance(result, admission.Rejection), result
    return result[0]


def running(pod: Obj, ip: str, phase: str = "Running") -> Obj:
    """The pod as the API would report it once scheduled (loopback IPs: the real-Prometheus check may dial them)."""
    return {**pod, "spec": {**pod["spec"], "nodeName": "node-a"}, "status": {"phase": phase, "podIP": ip}}


def targets(cfg: Obj, pods: list[Obj]) -> list[Obj]:
    out = [t for pod in pods for d in pod_targets(pod) if (t := scrape_target(cfg, d)) is not None]
    return sorted(out, key=lambda t: (t["pod"], t["instance"]))


# --- the kustomize layer ---------------------------------------------------------------------------------


@pytest.mark.multiproc
def test_monitoring_layer_builds_with_release_label(monitoring: list[Obj]) -> None:
    kinds = sorted(o["kind"] for o in monitoring if o["kind"] != "ConfigMap")
    assert kinds == ["PodMonitor", "PrometheusRule", "ServiceMonitor"]
    for obj in monitoring:
        meta = obj["metadata"]
        assert meta["namespace"] == "mlbench-system", meta["name"]
        assert meta["labels"]["release"] == "kube-prometheus-stack", meta["name"]
    # a label, never a selector: the monitors still select MLBench's own objects only
    pm, sm = one(monitoring, "PodMonitor"), one(monitoring, "ServiceMonitor")
    assert "release" not in pm["spec"]["selector"]["matchLabels"]
    assert "release" not in sm["spec"]["selector"]["matchLabels"]


def test_dashboards_are_listed() -> None:
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert "dashboards.yaml" in kustomization["resources"]
    assert kustomization["labels"] == [{"pairs": RELEASE, "includeSelectors": False}]


def test_the_stack_values_fit_the_layer() -> None:
    """The chart values the docs install with: the sidecar searches the layer's namespace and reads its folder
    annotation, and the documented release name is the layer's release label (each set in one place)."""
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    values_file = MONITORING / "kube-prometheus-stack-values.yaml"
    sidecar = yaml.safe_load(values_file.read_text())["grafana"]["sidecar"]["dashboards"]
    searched = {ns.strip() for ns in str(sidecar["searchNamespace"]).split(",")}
    assert "ALL" in searched or kustomization["namespace"] in searched
    configmap = yaml.safe_load_all((MONITORING / "dashboards.yaml").read_text())
    annotation = next(iter(next(c for c in configmap if c)["metadata"]["annotations"]))
    assert sidecar["folderAnnotation"] == annotation
    assert sidecar["provider"]["foldersFromFilesStructure"] is True
    release = kustomization["labels"][0]["pairs"]["release"]
    docs = (REPO / "docs" / "monitoring.md").read_text()
    assert f"helm install {release} prometheus-community/kube-prometheus-stack" in docs
    assert f"-f manifests/monitoring/{values_file.name}" in docs


@pytest.mark.multiproc
def test_with_monitoring_is_default_plus_monitoring(monitoring: list[Obj]) -> None:
    default = kustomize(REPO / "manifests" / "default")
    combined = kustomize(WITH_MONITORING)

    def ids(objs: list[Obj]) -> set[tuple[str, str, str]]:
        return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs}

    assert ids(combined) == ids(default) | ids(monitoring)
    assert len(combined) == len(default) + len(monitoring)
    for obj in combined:  # the release label stays on the monitoring objects
        labelled = (obj["metadata"].get("labels") or {}).get("release") == "kube-prometheus-stack"
        ident = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        assert labelled == (ident in ids(monitoring)), ident


@pytest.mark.multiproc
def test_release_label_is_changed_by_an_overlay(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(MONITORING, overlay)],
                "labels": [{"pairs": {"release": "prom"}, "includeSelectors": False}],
            }
        )
    )
    objs = kustomize(overlay)
    assert objs
    assert {o["metadata"]["labels"]["release"] for o in objs} == {"prom"}


@pytest.mark.multiproc
def test_runbook_urls_come_from_the_one_setting(monitoring: list[Obj], tmp_path: Path) -> None:
    """kustomize writes runbooks.yaml's base into every alert's runbook_url; the setting itself is never applied."""
    setting = yaml.safe_load((MONITORING / "runbooks.yaml").read_text())
    assert setting["metadata"]["annotations"]["config.kubernetes.io/local-config"] == "true"
    assert all(o["metadata"]["name"] != setting["metadata"]["name"] for o in monitoring)

    def urls(objs: list[Obj]) -> dict[str, str]:
        rules = [r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"] if "alert" in r]
        return {r["alert"]: r["annotations"]["runbook_url"] for r in rules}

    built = urls(monitoring)
    assert built == {name: f"{setting['data']['base']}#{name.lower()}" for name in built}
    copy = tmp_path / "monitoring"
    shutil.copytree(MONITORING, copy)
    mirror = "https://git.example.com/ml/mlbench/-/blob/v1/docs/monitoring.md"
    (copy / "runbooks.yaml").write_text(
        (MONITORING / "runbooks.yaml").read_text().replace(setting["data"]["base"], mirror)
    )
    assert urls(kustomize(copy)) == {name: f"{mirror}#{name.lower()}" for name in built}


# --- what the PodMonitor selects -------------------------------------------------------------------------


def matches(selector: Obj, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (what the Prometheus Operator turns into keep rules)."""
    ok = all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
    for exp in selector.get("matchExpressions") or []:
        key, op, values = exp["key"], exp["operator"], exp.get("values") or []
        ok = (
            ok
            and {
                "In": labels.get(key) in values,
                "NotIn": labels.get(key) not in values,
                "Exists": key in labels,
                "DoesNotExist": key not in labels,
            }[op]
        )
    return ok


@pytest.mark.multiproc
def test_podmonitor_selects_workers_not_the_launcher(monitoring: list[Obj]) -> None:
    pm = one(monitoring, "PodMonitor")
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    ctx = ctx_for(name="bench", namespace="team-a", workers=2)
    assert matches(pm["spec"]["selector"], runpods.worker_pod(ctx, 1, 0)["metadata"]["labels"])
    assert not matches(pm["spec"]["selector"], runpods.launcher_pod(ctx, 0)["metadata"]["labels"])
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    assert "port" not in ep, "a fixed port would scrape one rank per pod"
    assert ep["interval"] == "15s"


@pytest.mark.multiproc
def test_translated_podmonitor_scrapes_every_rank(monitoring: list[Obj], tmp_path: Path) -> None:
    cfg = promconfig.scrape_config(one(monitoring, "PodMonitor"), kubeconfig=str(tmp_path / "kubeconfig"))
    assert cfg["job_name"] == "podMonitor/mlbench-system/mlbench-workers/0"
    assert cfg["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": str(tmp_path / "kubeconfig")}]
    assert cfg["scrape_interval"] == "15s"
    assert cfg["honor_labels"] is False

    ctx = ctx_for(name="bench", namespace="team-a", workers=2, slotsPerWorker=2)
    pods = [
        running(runpods.worker_pod(ctx, 0, 0), "127.0.0.11"),
        running(runpods.worker_pod(ctx, 1, 0), "127.0.0.12"),
        running(runpods.launcher_pod(ctx, 0), "127.0.0.13"),
    ]
    common = {"job": "mlbench-runner", "namespace": "team-a", "container": "worker", "run": "bench"}
    common["task"] = h.TASK_NAME
    assert targets(cfg, pods) == [
        {**common, "pod": "bench-worker-0", "worker": "0", "rank": "0", "instance": "127.0.0.11:9400"},
        {**common, "pod": "bench-worker-0", "worker": "0", "rank": "1", "instance": "127.0.0.11:9401"},
        {**common, "pod": "bench-worker-1", "worker": "1", "rank": "2", "instance": "127.0.0.12:9400"},
        {**common, "pod": "bench-worker-1", "worker": "1", "rank": "3", "instance": "127.0.0.12:9401"},
    ]


@pytest.mark.multiproc
@pytest.mark.parametrize("phase", ["Pending", "Succeeded", "Failed", "Unknown"])
def test_workers_that_are_not_running_are_not_scraped(monitoring: list[Obj], phase: str) -> None:
    cfg = promconfig.scrape_config(one(monitoring, "PodMonitor"), kubeconfig="/k")
    ctx = ctx_for(name="bench", namespace="team-a", workers=1)
    pod = running(runpods.worker_pod(ctx, 0, 0), "127.0.0.11", phase=phase)
    assert pod_targets(pod), "the pod is discovered ..."
    assert targets(cfg, [pod]) == [], "... and dropped"


@pytest.mark.multiproc
def test_other_pods_with_rank_ports_are_not_scraped(monitoring: list[Obj]) -> None:
    cfg = promconfig.scrape_config(one(monitoring, "PodMonitor"), kubeconfig="/k")
    ctx = ctx_for(name="bench", namespace="team-a", workers=1)
    pod = running(runpods.worker_pod(ctx, 0, 0), "127.0.0.11")
    labels = dict(pod["metadata"]["labels"])
    del labels["app.kubernetes.io/managed-by"]
    assert targets(cfg, [{**pod, "metadata": {**pod["metadata"], "labels": labels}}]) == []


# --- the operator's ServiceMonitor ----------------------------------------------------------------------


def operator_service() -> Obj:
    docs = yaml.safe_load_all((REPO / "manifests" / "operator" / "deployment.yaml").read_text())
    service = next(d for d in docs if d and d["kind"] == "Service")
    assert service["metadata"]["name"] == "mlbench-operator-metrics"
    return service


def operator_endpoints(service: Obj, pod: str, ip: str) -> tuple[Obj, Obj]:
    """The Endpoints object and the pod behind ``service`` (what the endpoints controller would write)."""
    meta = service["metadata"]
    port = {"name": "metrics", "containerPort": 8080, "protocol": "TCP"}
    pod_obj = {
        "metadata": {
            "name": pod,
            "namespace": meta["namespace"],
            "labels": {"app.kubernetes.io/name": "mlbench-operator"},
        },
        "spec": {
            "containers": [
                {
                    "name": "operator",
                    "image": "op:1",
                    "ports": [port, {**port, "name": "health", "containerPort": 8081}],
                }
            ]
        },
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    endpoints = {
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": meta.get("labels", {})},
        "subsets": [
            {
                "addresses": [{"ip": ip, "targetRef": {"kind": "Pod", "name": pod, "namespace": meta["namespace"]}}],
                "ports": [{"name": "metrics", "port": 8080, "protocol": "TCP"}],
            }
        ],
    }
    return endpoints, pod_obj


def operator_targets(service: Obj, pod: str, ip: str) -> list[dict[str, str]]:
    endpoints, pod_obj = operator_endpoints(service, pod, ip)
    key = (service["metadata"]["namespace"], service["metadata"]["name"])
    return endpoints_targets(endpoints, {key: service}, {(key[0], pod): pod_obj})


@pytest.mark.multiproc
def test_translated_servicemonitor_scrapes_the_operator(monitoring: list[Obj]) -> None:
    cfg = promconfig.scrape_config(one(monitoring, "ServiceMonitor"), kubeconfig="/k")
    assert cfg["honor_labels"] is True
    assert cfg["scrape_interval"] == "30s"
    assert cfg["kubernetes_sd_configs"] == [
        {"role": "endpoints", "namespaces": {"names": ["mlbench-system"]}, "kubeconfig_file": "/k"}
    ]
    service = operator_service()
    discovered = operator_targets(service, "mlbench-operator-abc", "127.0.0.20")
    assert len(discovered) == 2  # the endpoint port, and (as Prometheus does) the pod's other declared port
    got = [t for d in discovered if (t := scrape_target(cfg, d)) is not None]
    assert got == [
        {
            "job": "mlbench-operator-metrics",
            "namespace": "mlbench-system",
            "service": "mlbench-operator-metrics",
            "pod": "mlbench-operator-abc",
            "container": "operator",
            "endpoint": "metrics",
            "instance": "127.0.0.20:8080",
        }
    ]
    other = {**service, "metadata": {**service["metadata"], "labels": {"app.kubernetes.io/name": "else"}}}
    assert [scrape_target(cfg, d) for d in operator_targets(other, "x", "127.0.0.21")] == [None, None]


# --- promconfig itself ----------------------------------------------------------------------------------


@pytest.mark.multiproc
def test_scrape_config_needs_exactly_one_way_to_the_api(monitoring: list[Obj]) -> None:
    pm = one(monitoring, "PodMonitor")
    with pytest.raises(ValueError, match="exactly one of kubeconfig"):
        promconfig.scrape_config(pm)
    with pytest.raises(ValueError, match="exactly one of kubeconfig"):
        promconfig.scrape_config(pm, kubeconfig="/k", api_server="https://127.0.0.1:6443")
    cfg = promconfig.scrape_config(pm, api_server="https://127.0.0.1:6443")
    assert cfg["kubernetes_sd_configs"] == [{"role": "pod", "api_server": "https://127.0.0.1:6443"}]
    cfg = promconfig.scrape_config(pm, http_sd_url="http://127.0.0.1:1/")
    assert "kubernetes_sd_configs" not in cfg
    assert cfg["http_sd_configs"] == [{"url": "http://127.0.0.1:1/pod", "refresh_interval": "5s"}]
    sm = promconfig.scrape_config(one(monitoring, "ServiceMonitor"), http_sd_url="http://127.0.0.1:1")
    assert sm["http_sd_configs"][0]["url"] == "http://127.0.0.1:1/endpoints?namespace=mlbench-system"


@pytest.mark.multiproc
def test_untranslated_fields_are_refused(monitoring: list[Obj]) -> None:
    pm = one(monitoring, "PodMonitor")
    ep = {**pm["spec"]["podMetricsEndpoints"][0], "tlsConfig": {"insecureSkipVerify": True}}
    bad = {**pm, "spec": {**pm["spec"], "podMetricsEndpoints": [ep]}}
    with pytest.raises(promconfig.Unsupported, match="tlsConfig"):
        promconfig.scrape_config(bad, kubeconfig="/k")


#: a PodMonitor using what the shipped ones do not (NotIn, podTargetLabels, a port, filterRunning: false)
SYNTHETIC_PODMONITOR: Obj = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PodMonitor",
    "metadata": {"name": "m", "namespace": "ns"},
    "spec": {
        "selector": {
            "matchLabels": {"b.io/x": "1", "a": "2"},
            "matchExpressions": [{"key": "c", "operator": "NotIn", "values": ["u", "v"]}],
        },
        "podTargetLabels": ["app.kubernetes.io/name"],
        "podMetricsEndpoints": [{"port": "web", "filterRunning": False}],
    },
}


def synthetic_pods() -> list[Obj]:
    """Pods that SYNTHETIC_PODMONITOR selects (p1, p4) or not (p2: c=u, p3: no b.io/x), none of them runners."""

    def pod(name: str, ip: str, labels: dict[str, str], phase: str = "Running") -> Obj:
        ports = [{"name": "web", "containerPort": 8080}, {"name": "rank-0", "containerPort": 9400}]
        return {
            "metadata": {"name": name, "namespace": "other", "labels": labels},
            "spec": {"containers": [{"name": "app", "image": "app:1", "ports": ports}]},
            "status": {"phase": phase, "podIP": ip},
        }

    selected = {"a": "2", "b.io/x": "1", "app.kubernetes.io/name": "web-app"}
    return [
        pod("p1", "127.0.0.31", selected),
        pod("p2", "127.0.0.32", {**selected, "c": "u"}),
        pod("p3", "127.0.0.33", {"a": "2"}),
        pod("p4", "127.0.0.34", selected, phase="Succeeded"),
    ]


def test_selector_and_port_rules_follow_the_operator() -> None:
    """Spot checks against promcfg.go's output shape (keep on label + labelpresent, port name, default job)."""
    pm = SYNTHETIC_PODMONITOR
    rules = promconfig.scrape_config(pm, kubeconfig="/k")["relabel_configs"]
    assert rules == [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_label_a", "__meta_kubernetes_pod_labelpresent_a"],
            "regex": "(2);true",
        },
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_label_b_io_x", "__meta_kubernetes_pod_labelpresent_b_io_x"],
            "regex": "(1);true",
        },
        {
            "action": "drop",
            "source_labels": ["__meta_kubernetes_pod_label_c", "__meta_kubernetes_pod_labelpresent_c"],
            "regex": "(u|v);true",
        },
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "web"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {
            "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
            "target_label": "app_kubernetes_io_name",
            "regex": "(.+)",
            "replacement": "${1}",
        },
        {"target_label": "job", "replacement": "ns/m"},
        {"target_label": "endpoint", "replacement": "web"},
    ]


def test_relabel_expands_like_go() -> None:
    rule = {"source_labels": ["a", "b"], "regex": "(x)-(?P<n>y);(.*)", "target_label": "t"}
    assert relabel({"a": "x-y", "b": "z"}, [{**rule, "replacement": "$1.${n}.$3.$$.$4.$1z"}]) == {
        "a": "x-y",
        "b": "z",
        "t": "x.y.z.$..",  # $4: no such group; $1z: a group named "1z" -> empty
    }
    # no match: unchanged; empty result: the target label is removed
    assert relabel({"a": "q", "t": "old"}, [{**rule, "source_labels": ["a"]}]) == {"a": "q", "t": "old"}
    assert relabel({"a": "", "t": "old"}, [{"source_labels": ["a"], "target_label": "t"}]) == {"a": ""}
    assert relabel({"a": "1"}, [{"action": "keep", "source_labels": ["a"], "regex": "1|2"}]) == {"a": "1"}
    assert relabel({"a": "12"}, [{"action": "keep", "source_labels": ["a"], "regex": "1|2"}]) is None  # anchored


# --- against real Prometheus ----------------------------------------------------------------------------


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.skip("promtool not installed (Debian: prometheus; `make system-deps`)")
    return found


@pytest.mark.multiproc
@pytest.mark.parametrize("sd", ["kubeconfig", "http_sd_url"])
def test_translated_config_passes_promtool(monitoring: list[Obj], tmp_path: Path, sd: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    where = {"kubeconfig": str(kubeconfig), "http_sd_url": "http://127.0.0.1:9/"}[sd]
    config = {
        "global": {"scrape_interval": "30s"},
        "scrape_configs": [
            promconfig.scrape_config(one(monitoring, kind), **{sd: where}) for kind in ("PodMonitor", "ServiceMonitor")
        ],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    res = subprocess.run(
        [promtool(), "check", "config", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    out = res.stdout + res.stderr
    if sd == "kubeconfig" and "field kubernetes_sd_configs not found" in out:
        pytest.skip(
            "this promtool is built without Kubernetes SD (Debian's): use http_sd_url= and tests/monitoring/k8s_sd.py"
        )
    assert res.returncode == 0, out
    assert "SUCCESS" in out


def prometheus_targets(config: Obj, tmp_path: Path, expected: int, timeout: float = 60) -> Obj:
    """Run Debian's Prometheus on ``config`` until it reports ``expected`` (active + dropped) targets."""
    with prometheus.running(config, tmp_path) as prom:
        deadline = time.monotonic() + timeout
        data: Obj = {}
        while time.monotonic() < deadline:
            try:
                data = prom.get("/api/v1/targets", state="any")
            except OSError:
                data = {}
            if len(data.get("activeTargets", [])) + len(data.get("droppedTargets", [])) >= expected:
                return data
            time.sleep(0.5)
        raise AssertionError(f"Prometheus did not report {expected} targets in {timeout}s: {data}")


@pytest.mark.multiproc
@pytest.mark.slow
def test_real_prometheus_relabels_like_the_python_model(monitoring: list[Obj], tmp_path: Path) -> None:
    """The same discovered labels, served by k8s_sd's HTTP SD to Debian's Prometheus: its own relabeling
    must keep the same targets with the same labels as the Python model."""
    ctx = ctx_for(name="bench", namespace="team-a", workers=2, slotsPerWorker=2)
    pods = [
        running(runpods.worker_pod(ctx, 0, 0), "127.0.0.11"),
        running(runpods.worker_pod(ctx, 1, 0), "127.0.0.12"),
        running(runpods.worker_pod(ctx, 1, 0), "127.0.0.14", phase="Succeeded"),
        running(runpods.launcher_pod(ctx, 0), "127.0.0.13"),
    ]
    discovered = {
        "pod": [d for pod in pods + synthetic_pods() for d in pod_targets(pod)],
        "endpoints": operator_targets(operator_service(), "mlbench-operator-abc", "127.0.0.20"),
    }
    asked: list[tuple[str, list[str]]] = []

    def groups(role: str, namespaces: list[str]) -> list[Obj]:
        asked.append((role, namespaces))
        return [as_group(d) for d in discovered[role]]

    with DiscoveryServer(groups) as sd:
        monitors = [one(monitoring, "PodMonitor"), SYNTHETIC_PODMONITOR, one(monitoring, "ServiceMonitor")]
        configs = [promconfig.scrape_config(m, http_sd_url=sd.url) for m in monitors]
        for cfg in configs:
            cfg["scrape_interval"] = "1h"  # labels are compared; no need to dial the loopback addresses often
        roles = ("pod", "pod", "endpoints")
        total = sum(len(discovered[role]) for role in roles)
        data = prometheus_targets({"scrape_configs": configs}, tmp_path, expected=total)
    assert sd.errors == []
    assert ("endpoints", ["mlbench-system"]) in asked
    assert ("pod", []) in asked

    def key(t: dict[str, str]) -> tuple[str, str, str]:
        return (t["job"], t["pod"], t["instance"])

    real = sorted((t["labels"] for t in data["activeTargets"]), key=key)
    python = sorted(
        [
            t
            for cfg, role in zip(configs, roles, strict=True)
            for d in discovered[role]
            if (t := scrape_target(cfg, d)) is not None
        ],
        key=key,
    )
    # four ranks, the operator, and p1 and p4 (filterRunning: false) for the synthetic monitor
    assert (
        sorted(t["pod"] for t in python if t["job"] == "mlbench-runner")
        == ["bench-worker-0"] * 2 + ["bench-worker-1"] * 2
    )
    assert sorted(t["pod"] for t in python if t["job"] == "ns/m") == ["p1", "p4"]
    assert len(python) == 7
    assert real == python
    assert len(data["droppedTargets"]) == total - 7
