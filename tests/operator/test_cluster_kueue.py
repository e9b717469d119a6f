"""Queued runs admitted by a real Kueue (v0.17.0's manager, tests/cluster/kueue.py) as a whole.

A ClusterQueue with 3 CPUs: two runs of 2 one-CPU workers (+ the launcher's 0.1) do not fit together, so one
runs and the other waits Queued, with Kueue's message, until the first finishes; a run of 4 such workers never
fits and says why. Neither waiting run has a single pod.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mlbench_api.run import SUSPEND_FINISHED
from mlbench_operator import conditions as c
from mlbench_operator.conditions import Reason
from mlbench_operator.run import kueue as kq
from tests import factories
from tests.cluster.kueue import KueueManager, build
from tests.cluster.plugin import KubeCluster
from tests.operator import helpers as h
from tests.operator.conftest import SESSION, Runs

pytestmark = pytest.mark.cluster

QUEUE = "runs"
CPU_QUOTA = "3"


@pytest.fixture(scope="module")
def kueue_manager(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KueueManager]:
    manager = KueueManager(kube_cluster, build(), tmp_path_factory.mktemp("kueue"))
    manager.install_crds()
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()


@pytest.fixture
def queue(runs: Runs, kube_cluster: KubeCluster, kueue_manager: KueueManager) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue with CPU_QUOTA CPUs and a LocalQueue in the test's namespace; named after
    the namespace (Kueue may still hold a deleted ClusterQueue of the same name inactive for a while)."""
    api = kq.API_VERSION
    flavor = cluster_queue = f"mlbench-test-{SESSION}-{runs.ns}"[:63].rstrip("-")
    objs: list[dict[str, Any]] = [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": runs.ns}},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": CPU_QUOTA},
                                    {"name": "memory", "nominalQuota": "100Gi"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": api,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": runs.ns},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]
    kube_cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}), check=True
    )
    try:
        yield QUEUE
    finally:
        for kind, name in (("clusterqueue", cluster_queue), ("resourceflavor", flavor)):
            kube_cluster.kubectl("delete", f"{kind}.kueue.x-k8s.io", name, "--ignore-not-found", "--wait=false")


def _queued(name: str, workers: int) -> dict[str, Any]:
    body = h.run(name, workers=workers, resources={"cpu": "1"})
    body["metadata"]["labels"] = {kq.QUEUE_LABEL: QUEUE}
    return body


def _suspended(status: dict[str, Any]) -> dict[str, Any] | None:
    cond = c.get(status.get("conditions"), c.SUSPENDED)
    return cond if cond is not None and cond["status"] == "True" else None


def _kueues_word(status: dict[str, Any]) -> dict[str, Any] | None:
    """The Suspended condition once it carries Kueue's message (first it says the Workload is being created)."""
    cond = _suspended(status)
    return cond if cond is not None and not cond["message"].startswith("creating Kueue Workload") else None


def test_two_runs_over_the_quota_run_one_after_the_other(runs: Runs, queue: str) -> None:
    runs.apply(_queued("first", 2))
    runs.wait_phase("first", "Running", timeout=90)
    runs.apply(_queued("second", 2))
    cond = runs.wait_status("second", _kueues_word, timeout=60, what="second run Queued, in Kueue's words")
    assert cond["reason"] == Reason.QUEUED
    assert "cpu" in cond["message"]  # Kueue's own words: the quota it lacks
    assert runs.status("second")["phase"] == "Suspended"
    assert runs.pods("second") == {}
    admitted = c.get(runs.status("first")["conditions"], c.SUSPENDED)
    assert admitted is not None
    assert (admitted["status"], admitted["reason"]) == ("False", Reason.ADMITTED)

    runs.finish_launcher("first", 0, factories.summary("first", world_size=2).termination_message())
    runs.wait_phase("first", "Succeeded")
    runs.wait_phase("second", "Running", timeout=90)  # the first's Workload finished: its quota went to the second


def test_a_run_too_big_for_the_queue_never_starts_and_says_why(runs: Runs, queue: str) -> None:
    runs.apply(_queued("huge", 4))
    cond = runs.wait_status("huge", _suspended, timeout=60, what="huge run Queued")
    assert cond["reason"] == Reason.QUEUED
    message = runs.wait_status(
        "huge", lambda s: (_suspended(s) or {}).get("message") if "cpu" in json.dumps(s) else None, timeout=60
    )
    assert "cpu" in message
    time.sleep(5)  # and it stays so
    assert runs.status("huge")["phase"] == "Suspended"
    assert runs.pods("huge") == {}


def test_suspend_releases_the_pods_and_resume_starts_a_fresh_attempt(runs: Runs) -> None:
    runs.apply(h.run("pause", workers=2))
    runs.wait_phase("pause", "Running", timeout=90)
    runs.kubectl("patch", "benchmarkrun", "pause", "--type=merge", "-p", '{"spec": {"suspend": true}}')
    status = runs.wait_phase("pause", "Suspended")
    assert _suspended(status)["reason"] == Reason.SUSPENDED  # type: ignore[index]
    runs.wait_status("pause", lambda s: not runs.pods("pause") or None, what="the pods gone")
    runs.kubectl("patch", "benchmarkrun", "pause", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    status = runs.wait_phase("pause", "Running", timeout=90)
    assert (status["restarts"], status["disruptionRestarts"]) == (1, 1)


def test_suspend_cannot_change_once_finished_and_scheduling_only_while_suspended(runs: Runs) -> None:
    runs.apply(h.run("frozen", workers=1, suspend=True))
    runs.wait_phase("frozen", "Suspended")
    ok = runs.kubectl(
        "patch",
        "benchmarkrun",
        "frozen",
        "--type=merge",
        "-p",
        '{"spec": {"scheduling": {"nodeSelector": {"mlbench-test-pool": "b"}}}}',
    )
    assert ok.returncode == 0
    runs.kubectl("patch", "benchmarkrun", "frozen", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    runs.wait_phase("frozen", "Pending")
    refused = runs.kubectl(
        "patch",
        "benchmarkrun",
        "frozen",
        "--type=merge",
        "-p",
        '{"spec": {"scheduling": {"nodeSelector": {"mlbench-test-pool": "c"}}}}',
        check=False,
    )
    assert refused.returncode != 0
    assert "scheduling may change only while the run is suspended" in refused.stderr
    runs.kubectl("delete", "benchmarkrun", "frozen")


def test_suspend_flip_on_a_finished_run_is_refused(runs: Runs) -> None:
    runs.apply(h.run("gone", task_name="no-such-task"))
    runs.wait_phase("gone", "Failed")
    refused = runs.kubectl(
        "patch", "benchmarkrun", "gone", "--type=merge", "-p", '{"spec": {"suspend": true}}', check=False
    )
    assert refused.returncode != 0
    assert SUSPEND_FINISHED in refused.stderr


def test_a_scheduling_the_policy_refuses_fails_the_run_when_it_resumes(runs: Runs) -> None:
    runs.apply(h.run("sneaky", workers=1, suspend=True))
    runs.wait_phase("sneaky", "Suspended")
    patch = '{"spec": {"scheduling": {"nodeSelector": {"not-allowed": "x"}}, "suspend": false}}'
    runs.kubectl("patch", "benchmarkrun", "sneaky", "--type=merge", "-p", patch)
    status = runs.wait_phase("sneaky", "Failed")
    assert c.get(status["conditions"], c.FAILED)["reason"] == Reason.POLICY_VIOLATION  # type: ignore[index]
    assert runs.pods("sneaky") == {}


def test_a_run_managed_by_another_controller_is_left_alone(runs: Runs) -> None:
    runs.apply(h.run("elsewhere", workers=1, managedBy="kueue.x-k8s.io/multikueue"))
    time.sleep(5)
    assert runs.status("elsewhere") == {}
    assert runs.pods("elsewhere") == {}
