"""The runner dashboard's GPU panel finds a run's GPUs whichever way the DCGM exporter's series are labelled.

NVIDIA's dcgm-exporter labels each GPU's series with the pod that holds it (``namespace``, ``pod``). Scraped
with ``honorLabels: true`` those labels stay; scraped as the GPU Operator ships its ServiceMonitor
(``honorLabels`` false), the target's own ``namespace``/``pod`` (the exporter's) win and the worker's arrive as
``exported_namespace``/``exported_pod``. The panel's query, expanded as Grafana sends it, is evaluated by
``promtool test rules`` (a real PromQL engine) over series of both forms and of other runs, namespaces and the
exporter's unassigned GPUs; the query that knows one form only fails the same case.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.dashboard_queries import GRAFANA, expand, panel_queries
from tests.monitoring.promql import evaluate

RUNNER = GRAFANA / "dashboards" / "mlbench-runner.json"
TITLE = "GPU utilisation per worker"
EXPORTER = 'namespace="gpu-operator",pod="nvidia-dcgm-exporter-x7k2p",job="nvidia-dcgm-exporter",Hostname="n2"'


def exported(namespace: str, pod: str, gpu: str) -> str:
    """A series as the GPU Operator's ServiceMonitor stores it: the worker's labels renamed exported_*."""
    return f'DCGM_FI_DEV_GPU_UTIL{{{EXPORTER},exported_namespace="{namespace}",exported_pod="{pod}",gpu="{gpu}"}}'


SERIES = {
    # honorLabels: true -> the worker's namespace and pod
    'DCGM_FI_DEV_GPU_UTIL{namespace="team-a",pod="r1-worker-0",gpu="0",Hostname="n1",job="gpu"}': "50x10",
    # the GPU Operator's ServiceMonitor as shipped -> exported_namespace / exported_pod
    exported("team-a", "r1-worker-1", "1"): "70x10",
    # not this run: another run whose name starts the same, the same run name in another namespace, a GPU no pod holds
    exported("team-a", "r10-worker-0", "2"): "90x10",
    exported("team-b", "r1-worker-0", "3"): "95x10",
    f'DCGM_FI_DEV_GPU_UTIL{{{EXPORTER},gpu="4"}}': "0x10",
}
EXPECTED = [
    {"labels": '{namespace="team-a",pod="r1-worker-0",gpu="0"}', "value": 50},
    {"labels": '{namespace="team-a",pod="r1-worker-1",gpu="1"}', "value": 70},
]
#: The query before it knew the exported labels (only honorLabels: true worked).
HONOR_LABELS_ONLY = (
    'max by (namespace, pod, gpu) (DCGM_FI_DEV_GPU_UTIL{namespace=~"$namespace", pod=~"($run)-worker-[0-9]+"})'
)


def gpu_query() -> str:
    (expr,) = [expr for title, expr in panel_queries(RUNNER) if title == TITLE]
    return expr


def promtool_eval(tmp_path: Path, expr: str) -> subprocess.CompletedProcess[str]:
    both = [*EXPECTED, {"labels": '{namespace="team-b",pod="r1-worker-0",gpu="3"}', "value": 95}]
    cases = [
        (expand(expr, "team-a", "r1"), "5m", EXPECTED),
        (expand(expr, ["team-a", "team-b"], "r1"), "5m", both),
    ]
    return evaluate(tmp_path, SERIES, cases)


@pytest.mark.multiproc
def test_the_gpu_panel_matches_both_label_forms(tmp_path: Path) -> None:
    res = promtool_eval(tmp_path, gpu_query())
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.multiproc
def test_a_query_for_one_form_only_fails_the_case(tmp_path: Path) -> None:
    res = promtool_eval(tmp_path, HONOR_LABELS_ONLY)
    assert res.returncode != 0, "the case does not tell the exported labels apart"
    assert "r1-worker-1" in res.stdout + res.stderr
