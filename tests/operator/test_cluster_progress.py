"""The progress scrape's write on the real API server: only while the run is Running in the scraped attempt.

The scrape timer reads rank 0 over HTTP and writes ``status.progress`` afterwards; by then the run may have
finished (its final figures written from the summary) or restarted (its progress cleared). The JSON patch's
``test`` operations are what keep such a late write out, and only the API server can show that they do.
The run here carries no session label, so the test operator (if one is running) leaves it alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from mlbench_operator.kube import ApiError, Kube, load_configuration
from tests.cluster.plugin import KubeCluster, get_json
from tests.operator import helpers as h

pytestmark = pytest.mark.cluster


@pytest.fixture
def kube(kube_cluster: KubeCluster) -> Iterator[Kube]:
    client = Kube(load_configuration(str(kube_cluster.kubeconfig)), concurrency=1)
    try:
        yield client
    finally:
        client.close()


def _progress(kube_cluster: KubeCluster, namespace: str) -> Any:
    return (get_json(kube_cluster, "-n", namespace, "benchmarkrun", "late") or {}).get("status", {}).get("progress")


def test_a_late_scrape_never_overwrites_a_finished_or_restarted_runs_progress(
    kube_cluster: KubeCluster, namespace: str, kube: Kube, test_task: str
) -> None:
    body = h.run("late", namespace)
    body["metadata"] = {"name": "late", "namespace": namespace}
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=True)
    kube.patch_run_status(namespace, "late", {"phase": "Running", "restarts": 0})

    running = {"epoch": 1.5, "step": 150}
    assert kube.patch_running_progress(namespace, "late", running, 0)
    assert _progress(kube_cluster, namespace) == running
    assert kube.patch_running_progress(namespace, "late", {**running, "step": 160}, None)  # no attempt to test

    # a gang restart: attempt 1 running, its progress cleared; a scrape of attempt 0 comes back late
    kube.patch_run_status(namespace, "late", {"restarts": 1, "progress": None})
    assert not kube.patch_running_progress(namespace, "late", {**running, "step": 170}, 0)
    assert _progress(kube_cluster, namespace) is None

    # the run finished: its final figures stand against a scrape still in flight
    final = {"epoch": 3.0, "step": 300}
    kube.patch_run_status(namespace, "late", {"phase": "Succeeded", "progress": final})
    assert not kube.patch_running_progress(namespace, "late", {**running, "step": 290}, 1)
    assert not kube.patch_running_progress(namespace, "late", {**running, "step": 290}, None)
    assert _progress(kube_cluster, namespace) == final

    # a value the schema refuses is a 422 too, but not a failed test: raised, never taken for "moved on"
    kube.patch_run_status(namespace, "late", {"phase": "Running"})
    with pytest.raises(ApiError, match=r"status\.progress\.epoch"):
        kube.patch_running_progress(namespace, "late", {"epoch": -1.0, "step": 1}, 1)


def test_a_status_write_at_a_stale_resource_version_is_refused(
    kube_cluster: KubeCluster, namespace: str, kube: Kube, test_task: str
) -> None:
    """Fencing (issue 33): a run status merge patch carrying the resourceVersion it was computed from is refused
    (409) once another writer (a new leader) moved the run on; nothing of it lands. The API server's word."""
    body = h.run("fenced", namespace)
    body["metadata"] = {"name": "fenced", "namespace": namespace}
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=True)
    planned_from = kube.patch_run_status(namespace, "fenced", {"phase": "Running", "restarts": 0})
    assert planned_from
    now = kube.patch_run_status(namespace, "fenced", {"message": "the new leader"}, planned_from)  # the new leader
    with pytest.raises(ApiError) as err:  # the deposed one, late, at the version it planned from
        kube.patch_run_status(namespace, "fenced", {"phase": "Failed", "message": "stale"}, planned_from)
    assert err.value.status == 409
    live = get_json(kube_cluster, "-n", namespace, "benchmarkrun", "fenced") or {}
    assert (live["status"]["phase"], live["status"]["message"]) == ("Running", "the new leader")
    assert live["metadata"]["resourceVersion"] == now
