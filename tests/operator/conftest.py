"""Cluster fixtures for the operator tests: the operator as a real subprocess, with its own RBAC.

The operator runs as ``python -m mlbench_operator.main`` with a kubeconfig holding a token of
the ``mlbench-operator`` ServiceAccount from ``manifests/operator/rbac.yaml``: a missing verb
in the ClusterRole fails these tests, and the subprocess can be SIGKILLed and restarted.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import free_port
from tests.cluster.plugin import KubeCluster, wait_for
from tests.operator import helpers as h

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "manifests" / "operator"
#: The test operator serves only runs carrying this label, so that BenchmarkRuns of other tests
#: (or of other people's sessions on a shared cluster) are never touched.
SESSION_LABEL = "mlbench.io/test-session"
SESSION = uuid.uuid4().hex[:12]
#: The test operator's dataset PVCs ask for this class; the tests bind them to static PVs of the same class
#: (no provisioner, and independent of a default StorageClass the cluster may have).
TEST_STORAGE_CLASS = "mlbench-test-static"
TEST_BACKOFF_LIMIT = 1


class OperatorProcess:
    """``mlbench-operator`` in a subprocess; ``kill()`` is SIGKILL, as a crashed pod would be."""

    def __init__(self, kubeconfig: Path, log_path: Path, extra_args: Sequence[str] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.extra_args = list(extra_args)  # e.g. --namespace=<ns> (the namespaced install)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        paths = [str(REPO / "crds"), str(REPO / "operator"), str(REPO / "runners"), str(REPO)]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
        env.setdefault("MLBENCH_DEBOUNCE_SECONDS", "0.2")
        env["MLBENCH_RUN_SELECTOR"] = f"{SESSION_LABEL}={SESSION}"
        env["MLBENCH_DATASET_STORAGE_CLASS"] = TEST_STORAGE_CLASS
        env["MLBENCH_DATASET_BACKOFF_LIMIT"] = str(TEST_BACKOFF_LIMIT)  # each retry costs the Job's 10 s+ backoff
        # kwok nodes serve no container logs: a finished run's results are given up at once (the
        # results path itself is tested on the real node, tests/e2e, and in test_handlers/test_results)
        env["MLBENCH_RESULTS_WAIT_SECONDS"] = "1"
        # test_launcher_waits_for_every_worker selects nodes by a label of its own (mlbench-test-*)
        env.setdefault("MLBENCH_ALLOWED_NODE_SELECTOR_KEYS", "mlbench-test-*,kubernetes.io/*")
        # Leader election: a Lease of this session's own (sessions share the cluster), in mlbench-system
        # (leader-election.yaml), and an identity kept across restarts, like a pod's name: a restarted
        # (SIGKILLed) operator retakes its Lease at once instead of waiting for it to expire.
        env.setdefault("MLBENCH_LEADER_ELECTION_ID", f"mlbench-operator-{SESSION}")
        env.setdefault("MLBENCH_LEADER_ELECTION_NAMESPACE", "mlbench-system")
        env["POD_NAME"] = f"test-operator-{SESSION}-{self.port}"
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the subprocess
        log.write(f"\n==== start {self.starts} {time.strftime('%T')}\n".encode())
        args = [f"--metrics-port={self.port}", "--liveness=", *self.extra_args]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlbench_operator.main", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.starts += 1
        wait_for(self._metrics_up, timeout=60, what="operator metrics endpoint")

    def _metrics_up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            pytest.fail(f"operator exited with {self.proc.returncode}; log: {self.log_path}\n{self.log_tail()}")
        try:
            self.metrics()
        except OSError:
            return False
        return True

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples matching ``labels``."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for fam in text_string_to_metric_families(self.metrics()):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _operator_kubeconfig(cluster: KubeCluster, out: Path, service_account: tuple[str, str] | None = None) -> Path:
    """A kubeconfig for the mlbench-operator ServiceAccount (least-privilege RBAC under test), or for
    ``service_account`` (namespace, name), whose RBAC the caller sets up."""
    if service_account is None:
        for f in ("namespace.yaml", "rbac.yaml", "leader-election.yaml", "node-leases.yaml"):
            cluster.kubectl("apply", "-f", str(RBAC / f), check=True)
        service_account = ("mlbench-system", "mlbench-operator")
    sa_namespace, sa_name = service_account
    token = cluster.kubectl("-n", sa_namespace, "create", "token", sa_name, "--duration=3h", check=True).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ctx_name = admin["current-context"]
    ctx = next(c for c in admin["contexts"] if c["name"] == ctx_name)["context"]
    cl = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])["cluster"]
    if "certificate-authority" in cl:
        cl = {
            "server": cl["server"],
            "certificate-authority-data": base64.b64encode(Path(cl["certificate-authority"]).read_bytes()).decode(),
        }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cl}],
        "users": [{"name": "mlbench-operator", "user": {"token": token}}],
        "contexts": [{"name": "op", "context": {"cluster": "c", "user": "mlbench-operator"}}],
        "current-context": "op",
    }
    out.write_text(yaml.safe_dump(config))
    return out


@pytest.fixture(scope="session")
def test_task(kube_cluster: KubeCluster) -> str:
    """A closed-division BenchmarkTask for the operator tests."""
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(h.task()), check=True)
    return h.TASK_NAME


@pytest.fixture(scope="package")
def operator(
    kube_cluster: KubeCluster, test_task: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    tmp = tmp_path_factory.mktemp("operator")
    proc = OperatorProcess(_operator_kubeconfig(kube_cluster, tmp / "kubeconfig"), tmp / "operator.log")
    proc.start()
    try:
        yield proc
    finally:
        # Let the operator release its finalizers on runs of the (being deleted) test namespaces,
        # so that no namespace is left Terminating on a cluster that outlives the session.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            res = kube_cluster.kubectl("get", "benchmarkruns", "-A", "-o", "json")
            items = json.loads(res.stdout)["items"] if res.returncode == 0 else []
            ours = [r for r in items if (r["metadata"].get("labels") or {}).get(SESSION_LABEL) == SESSION]
            if not any("mlbench.io/operator" in (r["metadata"].get("finalizers") or []) for r in ours):
                break
            time.sleep(0.5)
        proc.stop()
        lease = f"mlbench-operator-{SESSION}"  # the session's Lease (OperatorProcess.start), released by the stop
        kube_cluster.kubectl("-n", "mlbench-system", "delete", "lease", lease, "--ignore-not-found")


# -- helpers the tests share ---------------------------------------------------------------------------------
class Runs:
    """kubectl-based accessors for one test namespace (what a user would type)."""

    def __init__(self, cluster: KubeCluster, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("-n", self.ns, *args, input=input, check=check)

    def apply(self, body: dict[str, Any]) -> None:
        labels = {**(body["metadata"].get("labels") or {}), SESSION_LABEL: SESSION}
        body = {**body, "metadata": {**body["metadata"], "namespace": self.ns, "labels": labels}}
        self.kubectl("apply", "-f", "-", input=json.dumps(body))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        res = self.kubectl("get", kind, name, "-o", "json", check=False)
        if res.returncode != 0:
            if "NotFound" in res.stderr:
                return None
            raise RuntimeError(res.stderr)
        return dict(json.loads(res.stdout))

    def run(self, name: str) -> dict[str, Any]:
        run = self.get("benchmarkrun", name)
        assert run is not None, f"run {name} is gone"
        return run

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.run(name).get("status") or {})

    def pods(self, run: str) -> dict[str, dict[str, Any]]:
        res = self.kubectl("get", "pods", "-l", f"mlbench.io/run={run}", "-o", "json")
        return {p["metadata"]["name"]: p for p in json.loads(res.stdout)["items"]}

    def wait_status(self, name: str, pred: Callable[[dict[str, Any]], Any], timeout: float = 60, what: str = "") -> Any:
        last: dict[str, Any] = {}

        def check() -> Any:
            nonlocal last
            last = self.status(name)
            return pred(last)

        try:
            return wait_for(check, timeout=timeout, interval=0.3, what=what or f"status of {name}")
        except pytest.fail.Exception:
            pytest.fail(f"timed out waiting for {what}; last status: {json.dumps(_brief(last), indent=1)}")

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        return dict(self.wait_status(name, lambda s: s if s.get("phase") == phase else None, timeout, f"phase {phase}"))

    def finish_launcher(self, run: str, code: int, message: str) -> None:
        self.kubectl(
            "annotate",
            "pod",
            f"{run}-launcher",
            f"mlbench.io/kwok-exit-code={code}",
            f"mlbench.io/kwok-termination-message={message}",
            "--overwrite",
        )

    def fail_pod(self, pod: str, code: int, message: str = "") -> None:
        args = [f"mlbench.io/kwok-exit-code={code}"]
        if message:
            args.append(f"mlbench.io/kwok-termination-message={message}")
        self.kubectl("annotate", "pod", pod, *args, "--overwrite")


def _brief(status: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in status.items() if k != "taskSnapshot"}


@pytest.fixture
def runs(kube_cluster: KubeCluster, namespace: str, operator: OperatorProcess) -> Runs:
    return Runs(kube_cluster, namespace)
