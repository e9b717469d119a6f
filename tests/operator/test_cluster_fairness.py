"""Create slots shared fairly between tenants (:mod:`mlbench_operator.fairshare`), on the kwok cluster: a 2-worker
run of namespace B applied while a 300-worker run of namespace A is being created gets its workers among A's
creates, not after A's whole world (the API pool alone served creates first come, first served).

An operator of its own with 2 create slots (``MLBENCH_CREATE_SLOTS``), so that A's creates take long enough
(on a fast machine too) for B's first pass to reach its creates while A's are still queued. What is checked is
an order (one watch stream of both runs' pods), not a time.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlbench_operator import naming as n
from tests.cluster.plugin import KubeCluster, create_namespace
from tests.operator import helpers as h
from tests.operator.conftest import SESSION, SESSION_LABEL, OperatorProcess, Runs, _operator_kubeconfig

pytestmark = pytest.mark.cluster

BIG, SMALL = 300, 2
#: B's workers must be created before A's last this many creates.
MARGIN = 50
#: How long the pods may take to come (a loaded machine: a few per second).
WATCH_SECONDS = 120
#: The operator's own runs: a selector value of this module (the package's operator ignores them).
SELECTOR_VALUE = f"{SESSION}-fair"


@pytest.fixture
def other_namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    name = create_namespace(kube_cluster)
    try:
        yield name
    finally:
        kube_cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture
def fair_operator(
    kube_cluster: KubeCluster, test_task: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[OperatorProcess]:
    monkeypatch.setenv("MLBENCH_CREATE_SLOTS", "2")
    monkeypatch.setenv("MLBENCH_LEADER_ELECTION_ID", f"mlbench-operator-{SELECTOR_VALUE}")
    kubeconfig = _operator_kubeconfig(kube_cluster, tmp_path / "kubeconfig")
    op = OperatorProcess(kubeconfig, tmp_path / "operator.log", [f"--selector={SESSION_LABEL}={SELECTOR_VALUE}"])
    op.start()
    try:
        yield op
    finally:
        op.stop()
        kube_cluster.kubectl("-n", "mlbench-system", "delete", "lease", f"mlbench-operator-{SELECTOR_VALUE}")


def _apply(runs: Runs, name: str, workers: int) -> None:
    body = h.run(name, namespace=runs.ns, workers=workers)
    body["metadata"] = {"name": name, "namespace": runs.ns, "labels": {SESSION_LABEL: SELECTOR_VALUE}}
    runs.kubectl("apply", "-f", "-", input=json.dumps(body))


def _watch(cluster: KubeCluster, runs: list[str]) -> subprocess.Popen[str]:
    """Both runs' pods, one line (namespace, name) per event, in the API server's order."""
    return subprocess.Popen(
        [cluster.kubectl_bin, f"--kubeconfig={cluster.kubeconfig}", "get", "pods", "-A", "--watch",
         "-l", f"{n.LABEL_RUN} in ({','.join(runs)})", "--no-headers",
         "-o", "custom-columns=NS:.metadata.namespace,NAME:.metadata.name"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


def test_a_small_run_is_not_starved_by_another_tenants_big_run(
    kube_cluster: KubeCluster, namespace: str, other_namespace: str, fair_operator: OperatorProcess
) -> None:
    big, small = Runs(kube_cluster, namespace), Runs(kube_cluster, other_namespace)
    watch = _watch(kube_cluster, ["fair-big", "fair-small"])
    order: list[tuple[str, str]] = []  # first sighting of each pod: the order of their creates
    limit = threading.Timer(WATCH_SECONDS, watch.kill)  # the loop below ends then, whatever came
    limit.start()
    try:
        assert watch.stdout is not None
        _apply(big, "fair-big", BIG)
        for line in watch.stdout:
            ns, name = [*line.split(), "", ""][:2]
            if name.endswith(n.launcher_name("")) or (ns, name) in order:
                continue
            order.append((ns, name))
            if len(order) == 1:
                _apply(small, "fair-small", SMALL)  # A is creating: B arrives now
            if len(order) == BIG + SMALL:
                break
    finally:
        limit.cancel()
        watch.kill()
        watch.wait()
    a = [i for i, (ns, _) in enumerate(order) if ns == namespace]
    b = [i for i, (ns, _) in enumerate(order) if ns == other_namespace]
    assert len(b) == SMALL, f"B's workers never came: {len(a)} of A's were seen\n{fair_operator.log_tail(20)}"
    assert max(b) < a[BIG - MARGIN], f"B's workers were creates {[i + 1 for i in b]} of A's {BIG} and B's {SMALL}"
    small.wait_phase("fair-small", "Running", timeout=30)
