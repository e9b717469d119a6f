"""A real Prometheus scrapes a real run in real pods, and every dashboard panel's query returns data.

Prometheus is Debian's, configured from the shipped PodMonitor and ServiceMonitor
(``manifests/monitoring``) by the Prometheus Operator's translation (tests/monitoring/promconfig.py).
Debian builds Prometheus without Kubernetes service discovery, so tests/monitoring/k8s_sd.py lists the
pods and endpoints and serves them as HTTP SD with the same ``__meta_kubernetes_*`` labels: the
monitors' own relabelings run unchanged in Prometheus. The kubelet's cAdvisor endpoint is scraped as
kube-prometheus-stack does (HTTPS, client certificate, ``honor_labels``) for the worker resource panels.
The only panel allowed to stay empty is the GPU one (there is no DCGM exporter and no GPU here).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dashboard_queries import DASHBOARDS, expand, panel_queries
from tests.e2e.conftest import E2E
from tests.monitoring.k8s_sd import DiscoveryServer, discover
from tests.monitoring.promconfig import scrape_config
from tests.monitoring.prometheus import Prometheus, running

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
#: Fast scrapes for a run that trains for about a minute (the shipped PodMonitor says 15 s).
SCRAPE = "2s"
#: Panels that need hardware this cluster does not have.
NEEDS_GPU = "DCGM_"
#: Panels of task 0a's collectives row: a training run serves none of their series (tests/test_grafana.py checks
#: they are the gauges a collectives task serves; tests/runner/test_collectives.py that it serves them).
NEEDS_COLLECTIVES = "mlbench_collective_"


def _monitors(e2e: E2E) -> tuple[dict[str, Any], dict[str, Any]]:
    built = e2e.kubectl("kustomize", str(REPO / "manifests" / "monitoring")).stdout
    objs = [o for o in yaml.safe_load_all(built) if o]
    pod_monitor = next(o for o in objs if o["kind"] == "PodMonitor")
    service_monitor = next(o for o in objs if o["kind"] == "ServiceMonitor")
    return pod_monitor, service_monitor


def _cadvisor_job(cluster_dir: Path) -> dict[str, Any]:
    """Every real node's kubelet cAdvisor endpoint, scraped like kube-prometheus-stack's kubelet ServiceMonitor."""
    state = json.loads((cluster_dir / "state.json").read_text())
    targets = [f"{node['ip']}:{node['kubelet_port']}" for node in state["nodes"].values()]
    pki = cluster_dir / "pki"
    return {
        "job_name": "kubelet",
        "scheme": "https",
        "metrics_path": "/metrics/cadvisor",
        "honor_labels": True,
        "scrape_interval": SCRAPE,
        "tls_config": {
            "cert_file": str(pki / "admin.crt"),
            "key_file": str(pki / "admin.key"),
            "insecure_skip_verify": True,  # as kube-prometheus-stack's default for the kubelet
        },
        "static_configs": [{"targets": targets}],
    }


@pytest.fixture
def prometheus(e2e: E2E, tmp_path: Path) -> Iterator[Prometheus]:
    kubectl = [e2e.cluster.kubectl_bin, f"--kubeconfig={e2e.cluster.kubeconfig}"]
    pod_monitor, service_monitor = _monitors(e2e)
    with DiscoveryServer(lambda role, namespaces: discover(kubectl, role, namespaces)) as sd:
        jobs = [scrape_config(m, http_sd_url=sd.url) for m in (pod_monitor, service_monitor)]
        for job in jobs:
            job["scrape_interval"] = SCRAPE
        jobs.append(_cadvisor_job(Path(e2e.cluster.kubeconfig).parent))
        config = {"global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE}, "scrape_configs": jobs}
        with running(config, tmp_path) as prom:
            yield prom
        assert not sd.errors, sd.errors


def _panels() -> list[tuple[str, str, str]]:
    return [(path.stem, title, expr) for path in DASHBOARDS for title, expr in panel_queries(path)]


def test_every_dashboard_panel_has_data_for_a_real_run(e2e: E2E, e2e_task: str, prometheus: Prometheus) -> None:
    # the operator and the kubelet are scraped before the run exists: a counter that moves before
    # its first scrape (workers Ready within seconds) has no increase for rate() to see
    deadline = time.monotonic() + 90
    for job in ("mlbench-operator-metrics", "kubelet"):
        while not prometheus.query(f'up{{job="{job}"}} == 1'):
            assert time.monotonic() < deadline, f"Prometheus never scraped job {job}"
            time.sleep(1)
    run = e2e.run("scraped", e2e_task)
    panels = _panels()
    answered: dict[tuple[str, str, str], int] = {}

    def look() -> None:
        for key in panels:
            if key in answered:
                continue
            expr = expand(key[2], e2e.namespace, run)
            series = [s for s in prometheus.query(expr) if s.get("value", [0, "NaN"])[1] != "NaN"]
            if series:
                answered[key] = len(series)

    def while_running() -> None:
        if e2e.status(run).get("phase") == "Running":
            look()

    st = e2e.wait_finished(run, every=while_running)
    assert st.get("phase") == "Succeeded", e2e.debug(run)
    look()  # the final values (ranks linger for the last scrapes) and the Succeeded phase

    targets = prometheus.get("/api/v1/targets", state="any")
    ranks = sorted(
        t["labels"].get("rank", "")
        for t in targets["activeTargets"] + targets["droppedTargets"]
        if t.get("labels", {}).get("run") == run
    )
    print(f"\nrunner targets of {run}: ranks {ranks}")
    steps = prometheus.query(f'last_over_time(mlbench_steps_total{{run="{run}"}}[15m])')
    ranks_seen = {s["metric"]["rank"] for s in steps if float(s["value"][1]) > 0}
    assert ranks_seen == {"0", "1"}, "both ranks (one per worker pod) must have been scraped"

    missing = [f"{d}: {title}: {expr}" for (d, title, expr) in panels if (d, title, expr) not in answered]
    gpu = [m for m in missing if NEEDS_GPU in m]
    collectives = [m for m in missing if NEEDS_COLLECTIVES in m]
    print(
        f"{len(answered)} of {len(panels)} panel queries returned data; without a GPU: {len(gpu)}, "
        f"of a collectives run: {len(collectives)}"
    )
    print("\n".join(missing))
    assert [m for m in missing if NEEDS_GPU not in m and NEEDS_COLLECTIVES not in m] == []
