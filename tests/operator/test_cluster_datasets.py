"""Sourced datasets and restricted Pod Security against the real control plane (kwok nodes).

kwok plays the kubelet: a fetch Job's pod finishes only when the test annotates it (exit code and
termination message), exactly as the real fetcher would end; the Job controller, its
podFailurePolicy and the PV binder are the real ones.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mlbench_api.datasets import FetchExit, FetchFailure, FetchReason
from mlbench_operator import conditions as c
from mlbench_operator import fetchjob
from mlbench_operator.run import admission
from mlbench_operator.settings import DatasetSettings, fetch_image
from tests.cluster.plugin import KubeCluster, wait_for
from tests.operator import helpers as h
from tests.operator.conftest import SESSION, TEST_BACKOFF_LIMIT, TEST_STORAGE_CLASS, Runs

pytestmark = pytest.mark.cluster

SOURCED_TASK = f"optest-sourced-{SESSION}"  # cluster-scoped: one per session sharing the cluster
PVC = "mlbench-datasets"


@pytest.fixture(scope="module")
def sourced_task(kube_cluster: KubeCluster) -> Iterator[str]:
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(h.sourced_task(SOURCED_TASK)), check=True)
    yield SOURCED_TASK
    kube_cluster.kubectl("delete", "benchmarktask", SOURCED_TASK, "--ignore-not-found", "--wait=false")


@pytest.fixture
def volume(kube_cluster: KubeCluster, namespace: str) -> Iterator[str]:
    """A PV pre-bound to the namespace's dataset PVC (no provisioner; the class is the test operator's)."""
    name = f"mlbench-test-{uuid.uuid4().hex[:8]}"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "20Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": TEST_STORAGE_CLASS,
            "claimRef": {"namespace": namespace, "name": PVC},
            "hostPath": {"path": f"/tmp/{name}"},  # never mounted: kwok runs nothing
        },
    }
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(pv), check=True)
    yield name
    kube_cluster.kubectl("delete", "pv", name, "--ignore-not-found", "--wait=false")


def job_name() -> str:
    ctx = admission.admit(h.run(), h.sourced_task(SOURCED_TASK))
    assert not isinstance(ctx, admission.Rejection)
    return fetchjob.fetch_job_name(ctx[0].task.dataset, fetch_image(os.environ))  # the operator's env


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found = c.get(status.get("conditions"), type_)
    assert found is not None, f"no {type_} in {status.get('conditions')}"
    return found


def dataset_reason(status: dict[str, Any]) -> str | None:
    found = c.get(status.get("conditions"), c.DATASET_READY)
    return None if found is None else f"{found['status']}/{found['reason']}"


def fetch_pod(runs: Runs, job: str, phase: str = "Running") -> str:
    """The Job's newest pod once kwok runs it."""

    def find() -> str | None:
        out = runs.kubectl("get", "pods", "-l", f"batch.kubernetes.io/job-name={job}", "-o", "json").stdout
        pods = [p for p in json.loads(out)["items"] if p["status"].get("phase") == phase]
        pods.sort(key=lambda p: p["metadata"]["creationTimestamp"])
        return pods[-1]["metadata"]["name"] if pods else None

    return str(wait_for(find, timeout=60, what=f"a {phase} pod of Job {job}"))


def test_a_sourced_dataset_is_fetched_before_any_worker(runs: Runs, sourced_task: str, volume: str) -> None:
    name = "fetched"
    runs.apply(h.run(name, workers=2, task_name=sourced_task))
    status = runs.wait_status(name, lambda s: dataset_reason(s) == "False/Fetching" and s, what="Fetching")
    assert status["phase"] == "Pending"
    assert cond(status, "WorkersReady")["reason"] == "WaitingForDataset"

    # the shared, unowned volume and the deterministic Job
    pvc = runs.get("pvc", PVC)
    assert pvc is not None
    assert not pvc["metadata"].get("ownerReferences")
    assert pvc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mlbench-operator"
    assert pvc["spec"]["storageClassName"] == TEST_STORAGE_CLASS  # MLBENCH_DATASET_STORAGE_CLASS
    job = job_name()
    obj = runs.get("job", job)
    assert obj is not None
    container = obj["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["mlbench-runner", "fetch-dataset"]
    assert "--dest" in container["command"]
    policy = runs.get("networkpolicy", job)  # made before the Job, accepted by the real API server
    assert policy is not None
    assert policy["spec"]["podSelector"] == {"matchLabels": {"batch.kubernetes.io/job-name": job}}

    pod = fetch_pod(runs, job)
    assert runs.pods(name) == {}  # no worker while the data is not there
    runs.fail_pod(pod, 0)  # exit 0: fetched
    status = runs.wait_phase(name, "Running", timeout=90)
    assert dataset_reason(status) == "True/Fetched"
    worker = runs.pods(name)[f"{name}-worker-0"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": PVC, "readOnly": True}} in worker["spec"]["volumes"]

    # a second run in the namespace shares the fetched data: no new Job, no new pod
    runs.apply(h.run("again", workers=1, task_name=sourced_task))
    status = runs.wait_phase("again", "Running", timeout=60)
    assert dataset_reason(status) == "True/Fetched"
    again = runs.get("job", job)
    assert again is not None
    assert again["metadata"]["uid"] == obj["metadata"]["uid"]

    def reasons() -> set[str]:
        out = runs.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout
        return {e["reason"] for e in json.loads(out)["items"]}

    wait_for(lambda: {"Fetching", "Fetched"} <= reasons(), timeout=20, what="dataset Events")


def test_a_checksum_mismatch_fails_the_run_and_a_new_run_fetches_again(
    runs: Runs, sourced_task: str, volume: str
) -> None:
    name = "mismatch"
    runs.apply(h.run(name, workers=1, task_name=sourced_task))
    job = job_name()
    pod = fetch_pod(runs, job)
    message = f"sha256 of http://datasets.example/cifar10-jpeg.tar.gz (5 bytes): expected {h.JPEG_SHA256}, got abc"
    failure = FetchFailure(FetchReason.CHECKSUM_MISMATCH, message)
    runs.fail_pod(pod, int(FetchExit.CHECKSUM_MISMATCH), failure.termination_message())
    status = runs.wait_phase(name, "Failed", timeout=60)
    failed = cond(status, "Failed")
    assert (failed["reason"], failed["message"]) == ("ChecksumMismatch", message)
    assert dataset_reason(status) == "False/ChecksumMismatch"
    assert runs.pods(name) == {}
    obj = runs.get("job", job)
    assert obj is not None
    assert obj["status"].get("failed") == 1  # permanent: podFailurePolicy failed the Job at once, no retry
    old_uid = obj["metadata"]["uid"]

    # The namespace is not wedged: a run admitted after the failure replaces the failed Job. (Times have
    # second precision; a run admitted in the failure's own second shares the verdict.)
    time.sleep(1.1)
    runs.apply(h.run("retry", workers=1, task_name=sourced_task))

    def replaced() -> bool:
        new = runs.get("job", job)
        return new is not None and new["metadata"]["uid"] != old_uid

    wait_for(replaced, timeout=60, what="the failed fetch Job replaced")
    status = runs.wait_status("retry", lambda s: dataset_reason(s) == "False/Fetching" and s, what="Fetching")
    assert status["phase"] == "Pending"
    runs.fail_pod(fetch_pod(runs, job), 0)
    runs.wait_phase("retry", "Running", timeout=90)
    assert runs.status(name)["phase"] == "Failed"  # the first run's verdict stands


def test_an_unreachable_source_is_retried_then_fails(runs: Runs, sourced_task: str, volume: str) -> None:
    name = "unreachable"
    runs.apply(h.run(name, workers=1, task_name=sourced_task))
    job = job_name()
    message = "GET http://datasets.example/cifar10-jpeg.tar.gz: connection refused"
    failure = FetchFailure(FetchReason.SOURCE_UNREACHABLE, message).termination_message()
    runs.fail_pod(fetch_pod(runs, job), int(FetchExit.SOURCE_UNREACHABLE), failure)
    status = runs.wait_status(
        name,
        lambda s: "retry 1" in (c.get(s.get("conditions"), c.DATASET_READY) or {}).get("message", "") and s,
        timeout=60,
        what="retry shown",
    )
    assert status["phase"] == "Pending"
    assert "last attempt: SourceUnreachable: " + message in cond(status, c.DATASET_READY)["message"]
    for attempt in range(2, TEST_BACKOFF_LIMIT + 2):  # the (backoffLimit + 1)th failure fails the Job
        runs.fail_pod(fetch_pod(runs, job), int(FetchExit.SOURCE_UNREACHABLE), failure)
        wait_for(lambda: _failed_pods(runs, job) >= attempt, timeout=60, what="the attempt counted")  # noqa: B023
    status = runs.wait_phase(name, "Failed", timeout=90)
    assert (cond(status, "Failed")["reason"], cond(status, "Failed")["message"]) == ("SourceUnreachable", message)


def _failed_pods(runs: Runs, job: str) -> int:
    obj = runs.get("job", job)
    return int(((obj or {}).get("status") or {}).get("failed") or 0)


def test_restricted_namespace_admits_every_pod(
    runs: Runs, sourced_task: str, volume: str, kube_cluster: KubeCluster, namespace: str
) -> None:
    # the test namespaces enforce restricted by default (tests/cluster/plugin.py), as the operator's own does
    ns = json.loads(kube_cluster.kubectl("get", "namespace", namespace, "-o", "json", check=True).stdout)
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # the admission plugin is live: a privileged pod is refused in this namespace
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]},
    }
    refused = kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(bad))
    assert refused.returncode != 0
    assert "violates PodSecurity" in refused.stderr

    name = "restricted"
    runs.apply(h.run(name, workers=2, task_name=sourced_task))
    runs.fail_pod(fetch_pod(runs, job_name()), 0)  # the fetch Job's pod was admitted
    status = runs.wait_phase(name, "Running", timeout=90)  # workers, then the launcher, admitted
    assert set(runs.pods(name)) == {f"{name}-worker-0", f"{name}-worker-1", f"{name}-launcher"}
    assert "CreateFailed" not in json.dumps(status["conditions"])


def test_a_job_squatting_the_fetch_jobs_name_is_a_name_conflict_never_trusted(
    runs: Runs, sourced_task: str, volume: str
) -> None:
    """Issue 33: a namespace user's Job under the fetch Job's name, with the operator's labels and checksum
    annotation but another image and command, is never taken for the fetch (nor deleted); the run says why.
    Short (kwok, no real pod): about as long as the other tests here."""
    job = job_name()
    ctx = admission.admit(h.run(), h.sourced_task(SOURCED_TASK))
    assert not isinstance(ctx, admission.Rejection)
    ours = fetchjob.fetch_job(ctx[0], DatasetSettings(fetch_image=fetch_image(os.environ)))
    squatter = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job, "labels": ours["metadata"]["labels"], "annotations": ours["metadata"]["annotations"]},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": ours["metadata"]["labels"]},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "fetch", "image": "registry.invalid/forged:1", "command": ["true"]}],
                },
            },
        },
    }
    runs.apply(squatter)
    uid = (runs.get("job", job) or {})["metadata"]["uid"]
    name = "squatted"
    runs.apply(h.run(name, workers=1, task_name=sourced_task))
    status = runs.wait_status(name, lambda s: dataset_reason(s) == "False/NameConflict" and s, what="NameConflict")
    assert "another image or command" in cond(status, c.DATASET_READY)["message"]
    assert runs.pods(name) == {}  # no worker reads data the operator did not fetch
    assert (runs.get("job", job) or {})["metadata"]["uid"] == uid  # reported, not deleted


def test_a_job_squatting_the_fetch_job_s_name_is_a_name_conflict(runs: Runs, sourced_task: str, volume: str) -> None:
    """Issue 33: a Job a namespace user put under the fetch Job's name (without the operator's labels and checksum
    annotations) is reported as NameConflict on DatasetReady, neither used, replaced nor adopted; once it is gone
    the fetch starts. kwok only (about 10 s)."""
    job = job_name()
    squatter = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job},
        "spec": {  # suspended: no pod, whatever the namespace's Pod Security level
            "suspend": True,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}},
        },
    }
    runs.kubectl("apply", "-f", "-", input=json.dumps(squatter))
    held = runs.get("job", job)
    assert held is not None
    name = "squatted-job"
    runs.apply(h.run(name, workers=1, task_name=sourced_task))
    status = runs.wait_status(name, lambda s: dataset_reason(s) == "False/NameConflict" and s, what="NameConflict")
    assert f"Job {job} already exists and was not created by the operator" in cond(status, "DatasetReady")["message"]
    assert status["phase"] == "Pending"
    after = runs.get("job", job)
    assert after is not None
    assert after["metadata"]["uid"] == held["metadata"]["uid"]  # not replaced
    assert after["spec"].get("suspend") is True  # nor touched
    assert runs.pods(name) == {}
    runs.kubectl("delete", "job", job, "--wait=true")
    runs.wait_status(name, lambda s: dataset_reason(s) == "False/Fetching" and s, timeout=90, what="Fetching")


def test_a_pvc_squatting_the_dataset_volume_s_name_is_a_name_conflict(runs: Runs, sourced_task: str) -> None:
    """Issue 33: a PVC under the dataset volume's name without the operator's labels is reported as NameConflict;
    no fetch Job starts into it. kwok only (a few seconds)."""
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": PVC},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": TEST_STORAGE_CLASS,
        },
    }
    runs.kubectl("apply", "-f", "-", input=json.dumps(pvc))
    name = "squatted-volume"
    runs.apply(h.run(name, workers=1, task_name=sourced_task))
    status = runs.wait_status(name, lambda s: dataset_reason(s) == "False/NameConflict" and s, what="NameConflict")
    message = cond(status, "DatasetReady")["message"]
    assert f"PersistentVolumeClaim {PVC} already exists and was not created by the operator" in message
    assert "app.kubernetes.io/managed-by" in message
    assert runs.get("job", job_name()) is None
    assert runs.pods(name) == {}
