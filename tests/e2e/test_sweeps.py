"""A BenchmarkSweep in real pods on the closed catalog's data path, and the operator's two replicas handing over
in the middle of it.

The sweep's task takes the closed 1a recipe's dataset section as it is (CIFAR-10's python-pickle archive,
``format: cifar10-python``, unpacked with its top folder stripped) and only points its source at an archive in
that format served in the cluster: GENERATED batches (class-coloured noise, 600 training and 200 test images),
NOT CIFAR-10, never downloaded. Its training is the e2e task's (short, a low goal): NOT a result.

The sweep runs that task twice (two seeds, one run at a time; the second reuses the fetched data). While its
first run trains, the leading operator replica's pod is deleted: the standby takes the Lease, finishes what the
old one started and the sweep goes on. Nothing is done twice: every pod of the sweep's runs is watched, and each
run had exactly one launcher and one pod per worker, with no restart. About 3 minutes.
"""

from __future__ import annotations

import json
import tarfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_api.sweep import LABEL_SWEEP
from mlbench_operator import naming
from tests.e2e.conftest import E2E, E2E_LABEL, REPO, SESSION, sha256, wait_training
from tests.runner.helpers import write_cifar_python

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.e2e, pytest.mark.slow]

SYSTEM = "mlbench-system"
LEASE = "mlbench-operator"
WORKERS = 2
#: a variable of spec.pod.env that nothing reads: it must reach the ranks' own processes, through mpirun -x
MARK = "NCCL_MLBENCH_E2E_MARK"
#: prints the environment of every process in the pod that is an MPI rank (the ranks mpirun's daemon started)
RANK_ENVIRON = (
    'for p in /proc/[0-9]*; do if tr "\\0" "\\n" 2>/dev/null < $p/environ | grep -q "^OMPI_COMM_WORLD_RANK="; '
    'then tr "\\0" "\\n" 2>/dev/null < $p/environ; echo; fi; done'
)


def _holder(e2e: E2E) -> str:
    out = e2e.kubectl("get", "lease", LEASE, "-n", SYSTEM, "-o", "jsonpath={.spec.holderIdentity}")
    return out.stdout.strip()


class PodLedger:
    """Every pod seen of the sweep's runs: its UID by run and role (launcher, worker)."""

    def __init__(self, e2e: E2E, sweep: str) -> None:
        self.e2e, self.sweep = e2e, sweep
        self.uids: dict[tuple[str, str], set[str]] = defaultdict(set)

    def look(self) -> None:
        out = self.e2e.kubectl("get", "pods", "-n", self.e2e.namespace, "-l", naming.LABEL_RUN, "-o", "json")
        for pod in json.loads(out.stdout)["items"]:
            labels = pod["metadata"]["labels"]
            if labels[naming.LABEL_RUN].startswith(f"{self.sweep}-"):
                key = (labels[naming.LABEL_RUN], labels.get(naming.LABEL_ROLE, "?"))
                self.uids[key].add(pod["metadata"]["uid"])


def _closed_data_task(e2e: E2E, e2e_task: str, tmp: Path) -> str:
    """The e2e task with the closed recipe's dataset section, its source the generated archive served in-cluster."""
    write_cifar_python(tmp, n_train=600, n_test=200)
    archive = tmp / "cifar-10-python-generated.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    e2e.cluster.kubectl("cp", str(archive), f"{e2e.namespace}/datasets:/srv/{archive.name}", check=True, timeout=120)
    closed = yaml.safe_load((REPO / "manifests/catalog/cifar10-resnet20.yaml").read_text())["spec"]["dataset"]
    url = e2e.dataset_url.rsplit("/", 1)[0] + f"/{archive.name}"
    closed["source"].update(url=url, sha256=sha256(archive))
    body = json.loads(e2e.kubectl("get", "benchmarktask", e2e_task, "-o", "json").stdout)
    spec = body["spec"]
    spec["description"] = "e2e test task (NOT a result): the closed recipe's data path on generated python batches"
    spec["dataset"] = {**closed, "trainSubset": 512, "testSubset": 200}
    name = f"e2e-{SESSION}-closed-data"
    e2e.apply(
        {
            "apiVersion": body["apiVersion"],
            "kind": "BenchmarkTask",
            "metadata": {"name": name, "labels": E2E_LABEL},
            "spec": spec,
        }
    )
    e2e.tasks.append(name)
    return name


def _sweep(e2e: E2E, name: str, task: str) -> None:
    template: dict[str, Any] = {
        "taskRef": {"name": task},
        "workers": WORKERS,
        "resources": {"cpu": "850m", "memory": "2Gi"},
        "scheduling": e2e.scheduling,
        "runPolicy": {"maxRestarts": 0},
        "pod": {"env": [{"name": MARK, "value": SESSION}]},  # spec.pod.env, allowed by the default NCCL_* pattern
    }
    spec = {"template": template, "matrix": {"seeds": [1, 2]}, "maxConcurrent": 1, "failurePolicy": "Continue"}
    meta = {"name": name, "namespace": e2e.namespace, "labels": E2E_LABEL}
    e2e.apply({"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkSweep", "metadata": meta, "spec": spec})


def _wait_created(e2e: E2E, run: str, timeout: float = 120) -> None:
    """Until the sweep's operator has created ``run`` (the sweep is applied; its runs come after)."""
    deadline = time.monotonic() + timeout
    while e2e.kubectl("get", "benchmarkrun", run, "-n", e2e.namespace, check=False).returncode != 0:
        assert time.monotonic() < deadline, f"the sweep did not create {run} in {timeout}s"
        time.sleep(1)


def _wait_sweep_ready(e2e: E2E, name: str, ledger: PodLedger, timeout: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        ledger.look()
        status = e2e.get("benchmarksweep", name).get("status") or {}
        ready = [c for c in status.get("conditions", []) if c["type"] == "Ready"]
        if ready and ready[0]["status"] == "True":
            return dict(status)
        assert time.monotonic() < deadline, f"sweep {name} not Ready after {timeout}s: {json.dumps(status)[:3000]}"
        time.sleep(1)


def test_a_sweep_on_the_closed_data_path_runs_in_real_pods_and_survives_an_operator_failover(
    e2e: E2E, e2e_task: str, tmp_path: Path
) -> None:
    name = "failover"
    _sweep(e2e, name, _closed_data_task(e2e, e2e_task, tmp_path))
    ledger = PodLedger(e2e, name)
    first = f"{name}-s1"
    _wait_created(e2e, first)
    e2e.wait_status(first, lambda s: s.get("phase") == "Running", 600, "the first run to start", every=ledger.look)
    wait_training(e2e, first)
    for worker in range(WORKERS):  # spec.pod.env reached each rank's process, not only its pod
        pod = f"{first}-worker-{worker}"
        environ = e2e.kubectl(
            "exec", pod, "-n", e2e.namespace, "-c", naming.WORKER_CONTAINER, "--", "sh", "-c", RANK_ENVIRON
        )
        assert f"{MARK}={SESSION}" in environ.stdout.splitlines(), f"{pod}: {environ.stdout[-2000:]}"
    leader = _holder(e2e)
    assert leader, "no operator replica holds the Lease"
    e2e.kubectl("delete", "pod", leader, "-n", SYSTEM, "--wait=false")
    status = _wait_sweep_ready(e2e, name, ledger)
    successor = _holder(e2e)
    print(f"\nthe Lease went from {leader} to {successor}; sweep status: {json.dumps(status)[:600]}")
    assert successor
    assert successor != leader
    assert (status.get("total"), status.get("succeeded"), status.get("failed")) == (2, 2, 0), status
    for run in (first, f"{name}-s2"):
        st = e2e.status(run)
        assert st.get("phase") == "Succeeded", f"{run}: {json.dumps(st)[:2000]}\n{e2e.debug(run)}"
        assert st["result"]["goalReached"], st["result"]  # the learning itself is test_runs.py's to check
        assert st.get("restarts", 0) == 0, st
        assert e2e.get("benchmarkrun", run)["metadata"]["labels"][LABEL_SWEEP] == name
        assert len(ledger.uids[(run, naming.ROLE_LAUNCHER)]) == 1, ledger.uids  # one launcher, never a second
        assert len(ledger.uids[(run, naming.ROLE_WORKER)]) == WORKERS, ledger.uids  # none re-created
