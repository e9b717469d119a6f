"""Gang scheduling (spec.scheduling.gang) against the published PodGroup CRD of scheduler-plugins.

The CRD comes from the Go module sigs.k8s.io/scheduler-plugins (``go mod download``, cached); no coscheduling
scheduler runs on the test cluster (building it means another long compile of k8s.io/kubernetes), so a gang run's
workers name a scheduler that does not exist and stay Pending, bound to no node: what this checks is what the
operator creates, not the scheduling itself (docs/operator.md, "Gang scheduling").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from kubernetes.utils import parse_quantity

from mlbench_operator import conditions as c
from mlbench_operator import podgroup as pg
from mlbench_operator.settings import GANG_SCHEDULER_NAME
from tests.cluster.plugin import KubeCluster, wait_for
from tests.operator import helpers as h
from tests.operator.conftest import Runs

pytestmark = pytest.mark.cluster

#: The module version whose CRD the operator is written against.
SCHEDULER_PLUGINS = "sigs.k8s.io/scheduler-plugins@v0.34.1-devel"
CRD_FILE = "config/crd/bases/scheduling.x-k8s.io_podgroups.yaml"
CRD = f"crd/{pg.CRD_NAME}"


def podgroup_crd() -> Path:
    """The published PodGroup CRD, from the Go module cache (downloaded there when missing)."""
    go = shutil.which("go")
    if go is None:
        pytest.skip(f"no go toolchain to fetch {SCHEDULER_PLUGINS}'s PodGroup CRD")
    out = subprocess.run(
        [go, "mod", "download", "-json", SCHEDULER_PLUGINS], check=False, capture_output=True, text=True
    )
    if out.returncode != 0:
        pytest.skip(f"go mod download {SCHEDULER_PLUGINS} failed: {out.stderr or out.stdout}")
    return Path(json.loads(out.stdout)["Dir"]) / CRD_FILE


@pytest.fixture
def no_podgroup_crd(kube_cluster: KubeCluster) -> None:
    kube_cluster.kubectl("delete", CRD, "--ignore-not-found", "--wait=true", check=True, timeout=120)


@pytest.fixture
def podgroup_crd_installed(kube_cluster: KubeCluster) -> None:
    kube_cluster.kubectl("apply", "--server-side", "-f", str(podgroup_crd()), check=True)
    wait_for(
        lambda: kube_cluster.kubectl("wait", "--for=condition=Established", CRD).returncode == 0,
        timeout=60,
        what="PodGroup CRD Established",
    )


def _gang(name: str, workers: int) -> dict[str, Any]:
    return h.run(name, workers=workers, resources={"cpu": "100m"}, scheduling={"gang": {"scheduleTimeoutSeconds": 60}})


def _all_created(runs: Runs, run: str, workers: int) -> dict[str, dict[str, Any]] | None:
    """The run's workers once all exist (a plain run's launcher may already follow them: kwok makes them Ready)."""
    pods = {name: pod for name, pod in runs.pods(run).items() if not name.endswith("-launcher")}
    return pods if len(pods) == workers else None


def test_without_the_crd_a_gang_run_says_what_is_missing(runs: Runs, no_podgroup_crd: None) -> None:
    runs.apply(_gang("nocrd", 2))

    def refused(status: dict[str, Any]) -> dict[str, Any] | None:
        cond = c.get(status.get("conditions"), c.WORKERS_READY)
        return cond if cond is not None and cond.get("reason") == "CreateFailed" else None

    cond = runs.wait_status("nocrd", refused, timeout=60, what="CreateFailed naming the PodGroup CRD")
    assert pg.CRD_NAME in cond["message"]
    assert runs.status("nocrd").get("phase") != "Failed"  # retried with backoff: the admin may install it
    assert runs.pods("nocrd") == {}


def test_a_gang_run_creates_its_pod_group_and_its_workers_wait_for_the_scheduler(
    runs: Runs, podgroup_crd_installed: None
) -> None:
    runs.apply(_gang("gang", 3))
    pods = wait_for(lambda: _all_created(runs, "gang", 3), timeout=60, what="3 gang workers")
    group = runs.get("podgroups.scheduling.x-k8s.io", "gang")
    assert group is not None
    assert group["spec"]["minMember"] == 3
    assert group["spec"]["scheduleTimeoutSeconds"] == 60
    assert {k: parse_quantity(v) for k, v in group["spec"]["minResources"].items()} == {"cpu": Decimal("0.3")}
    assert group["metadata"]["ownerReferences"][0]["uid"] == runs.run("gang")["metadata"]["uid"]
    for pod in pods.values():
        assert pod["metadata"]["labels"][pg.POD_GROUP_LABEL] == "gang"
        assert pod["spec"]["schedulerName"] == GANG_SCHEDULER_NAME
    time.sleep(5)  # the default scheduler must leave them alone: no scheduler of that name runs here
    for pod in runs.pods("gang").values():
        assert pod["status"].get("phase") == "Pending"
        assert not pod["spec"].get("nodeName"), f"{pod['metadata']['name']} was bound by another scheduler"
    assert not any(p["metadata"]["name"].endswith("-launcher") for p in runs.pods("gang").values())


def test_a_run_without_gang_creates_no_pod_group(runs: Runs, podgroup_crd_installed: None) -> None:
    runs.apply(h.run("plain", workers=2, resources={"cpu": "100m"}))
    pods = wait_for(lambda: _all_created(runs, "plain", 2), timeout=60, what="2 workers")
    assert runs.get("podgroups.scheduling.x-k8s.io", "plain") is None
    for pod in pods.values():
        assert "schedulerName" not in pod["spec"] or pod["spec"]["schedulerName"] == "default-scheduler"
        assert pg.POD_GROUP_LABEL not in pod["metadata"]["labels"]
