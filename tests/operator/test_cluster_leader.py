"""Leader election on the real API server: two operator processes started together, exactly one leads.

Each test has a Lease of its own (``MLBENCH_LEADER_ELECTION_ID``) and a run label value of its own, so
that neither the package's test operator (when the whole suite runs) nor another session's operators
take part. Short durations (client-go's defaults are 15 s / 10 s / 2 s) keep the take-overs quick.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests import factories
from tests.cluster.plugin import KubeCluster, wait_for
from tests.operator import helpers as h
from tests.operator.conftest import (
    SESSION,
    SESSION_LABEL,
    OperatorProcess,
    Runs,
    _operator_kubeconfig,
    free_port,
)

pytestmark = pytest.mark.cluster

LEASE_NAMESPACE = "mlbench-system"


def identity(proc: OperatorProcess) -> str:
    """The holder identity of a test operator (conftest sets POD_NAME so)."""
    return f"test-operator-{SESSION}-{proc.port}"


def events(proc: OperatorProcess) -> list[dict[str, Any]]:
    """The operator's structured log records (one JSON object a line)."""
    out = []
    for line in proc.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def logged(proc: OperatorProcess, event: str) -> list[dict[str, Any]]:
    return [e for e in events(proc) if e.get("event") == event]


class Election:
    """Operator processes competing for one Lease, and the runs they serve (a label value of their own)."""

    def __init__(
        self, cluster: KubeCluster, namespace: str, tmp: Path, monkeypatch: pytest.MonkeyPatch, lease: str
    ) -> None:
        self.cluster = cluster
        self.lease_name = lease
        self.label = f"{SESSION}-le"
        self.runs = Runs(cluster, namespace)
        self.tmp = tmp
        self.monkeypatch = monkeypatch
        self.kubeconfig = _operator_kubeconfig(cluster, tmp / "kubeconfig")
        self.procs: list[OperatorProcess] = []

    def start(self, n: int, lease: int, renew: float, retry: float, liveness: bool = False) -> list[OperatorProcess]:
        """``n`` operators, started at the same moment (each start waits for its metrics endpoint)."""
        self.monkeypatch.setenv("MLBENCH_LEADER_ELECTION_ID", self.lease_name)
        self.monkeypatch.setenv("MLBENCH_LEADER_ELECTION_LEASE_DURATION_SECONDS", str(lease))
        self.monkeypatch.setenv("MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS", str(renew))
        self.monkeypatch.setenv("MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS", str(retry))
        procs = []
        for i in range(n):
            args = [f"--selector={SESSION_LABEL}={self.label}"]
            if liveness:
                args.append(f"--liveness=http://127.0.0.1:{free_port()}/healthz")
            procs.append(OperatorProcess(self.kubeconfig, self.tmp / f"operator-{i}.log", extra_args=args))
        self.procs += procs
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(OperatorProcess.start, procs))
        return procs

    def lease(self) -> dict[str, Any] | None:
        res = self.cluster.kubectl("-n", LEASE_NAMESPACE, "get", "lease", self.lease_name, "-o", "json")
        return dict(json.loads(res.stdout)) if res.returncode == 0 else None

    def holder(self) -> str:
        lease = self.lease()
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    def leader(self, procs: list[OperatorProcess], timeout: float = 30) -> OperatorProcess:
        """The process holding the Lease, once its gauge says so and every other process's says 0."""
        by_id = {identity(p): p for p in procs}
        wait_for(lambda: self.holder() in by_id, timeout=timeout, what="a holder of the Lease")
        leader = by_id[self.holder()]

        def gauges() -> bool:
            return all(p.metric("mlbench_operator_leader") == (1 if p is leader else 0) for p in procs)

        wait_for(gauges, timeout=10, what="mlbench_operator_leader 1 in the leader, 0 in the others")
        return leader

    def apply(self, body: dict[str, Any]) -> None:
        body = {
            **body,
            "metadata": {**body["metadata"], "namespace": self.runs.ns, "labels": {SESSION_LABEL: self.label}},
        }
        self.runs.kubectl("apply", "-f", "-", input=json.dumps(body))

    def close(self) -> None:
        """Delete the runs while an operator may still release their finalizers, then stop everything."""
        runs = self.runs
        runs.kubectl("delete", "benchmarkruns", "--all", "--wait=false", check=False)

        def gone() -> bool:
            res = runs.kubectl("get", "benchmarkruns", "-o", "name", check=False)
            return res.returncode == 0 and not res.stdout.strip()

        alive = [p for p in self.procs if p.proc is not None and p.proc.poll() is None]
        try:
            wait_for(gone, timeout=30 if alive else 1, what="the runs deleted")
        except BaseException:  # no operator left to finish them: let the namespace go anyway
            res = runs.kubectl("get", "benchmarkruns", "-o", "name", check=False)
            for name in res.stdout.split():
                runs.kubectl("patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)
        for p in self.procs:
            p.stop()
        self.cluster.kubectl("-n", LEASE_NAMESPACE, "delete", "lease", self.lease_name, "--ignore-not-found")


@pytest.fixture
def election(
    kube_cluster: KubeCluster, test_task: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Election]:
    lease = f"mlbench-operator-{SESSION}-le-{uuid.uuid4().hex[:6]}"
    e = Election(kube_cluster, namespace, tmp_path, monkeypatch, lease)
    try:
        yield e
    finally:
        e.close()


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status) == 200
    except (OSError, urllib.error.URLError):
        return False


def liveness_url(proc: OperatorProcess) -> str:
    return next(a.split("=", 1)[1] for a in proc.extra_args if a.startswith("--liveness="))


def test_one_of_two_leads_and_the_standby_takes_over_a_killed_leader(election: Election) -> None:
    lease_seconds, retry = 4, 0.5
    procs = election.start(2, lease=lease_seconds, renew=3, retry=retry, liveness=True)
    leader = election.leader(procs)
    standby = next(p for p in procs if p is not leader)
    assert logged(leader, "leader_acquired")
    assert logged(leader, "operator_started")  # kopf runs in the leader

    # a standby whose first create lost the race (409) names the holder one retry period later
    # (a lost create race logs leader_standby with reason=conflict first, without a holder)
    def named() -> list[dict[str, Any]]:
        return [e for e in logged(standby, "leader_standby") if "holder" in e]

    wait_for(named, timeout=10, what="the standby to log leader_standby naming the holder")
    assert named()[0]["holder"] == identity(leader)
    assert not logged(standby, "operator_started")  # and not in the standby
    assert healthy(liveness_url(standby))  # which is alive all the same
    assert healthy(liveness_url(leader))  # (kopf's endpoint)

    # a run: the leader makes its world, once
    runs = election.runs
    name = "ha"
    election.apply(h.run(name, workers=2, runPolicy={"maxRestarts": 2}))
    runs.wait_phase(name, "Running")
    world = {f"{name}-worker-0", f"{name}-worker-1", f"{name}-launcher"}
    first = {p: o["metadata"]["uid"] for p, o in runs.pods(name).items()}
    assert set(first) == world
    assert standby.metric("mlbench_operator_api_requests_total") == 0  # the standby did not touch anything
    # no create met a twin (a fenced status write may be refused once with 409: that is a PATCH)
    assert leader.metric("mlbench_operator_api_requests_total", verb="POST", code="409") == 0
    assert leader.metric("mlbench_operator_reconcile_errors_total") == 0
    assert not logged(standby, "leader_acquired")

    # the leader crashes: the standby waits for the Lease to expire, then takes over
    killed_at = time.monotonic()
    leader.stop(kill=True)
    wait_for(lambda: election.holder() == identity(standby), timeout=lease_seconds + 15, interval=0.1, what="take-over")
    took = time.monotonic() - killed_at
    print(f"SIGKILLed leader: the standby took over after {took:.1f}s (lease {lease_seconds}s)")
    # not before the lease expired: its last renewal (at most one retry period before the kill) counts for a
    # whole lease (how late is a matter of load: the wait above bounds it)
    assert took >= lease_seconds - 2 * retry - 0.5, took
    assert election.leader([standby]) is standby
    wait_for(lambda: logged(standby, "leader_acquired"), timeout=5, what="the new leader to log leader_acquired")
    acquired = logged(standby, "leader_acquired")
    assert [(a["reason"], a["previous_holder"]) for a in acquired] == [("expired", identity(leader))]
    lease = election.lease()
    assert lease is not None
    assert lease["spec"]["leaseTransitions"] == 1  # created by the first leader (0), taken over once
    wait_for(lambda: logged(standby, "operator_started"), timeout=20, what="kopf started in the new leader")
    wait_for(lambda: healthy(liveness_url(standby)), timeout=20, what="kopf's liveness endpoint in the new leader")

    # ...resumes the run without re-creating its world, and keeps reconciling it: a gang restart
    time.sleep(2)
    assert {p: o["metadata"]["uid"] for p, o in runs.pods(name).items()} == first
    assert standby.metric("mlbench_operator_api_requests_total", verb="POST", resource="pods") == 0
    runs.fail_pod(f"{name}-worker-1", 137, "killed")
    status = runs.wait_status(
        name, lambda s: s.get("restarts") == 1 and s.get("phase") == "Running" and s, 90, "restarted world Running"
    )
    second = {p: o["metadata"]["uid"] for p, o in runs.pods(name).items()}
    assert set(second) == world
    assert not set(second.values()) & set(first.values())
    runs.finish_launcher(name, 0, factories.summary(name, world_size=2).termination_message())
    status = runs.wait_phase(name, "Succeeded")
    assert status["restarts"] == 1


def test_sigterm_releases_the_lease_for_an_immediate_handover(election: Election) -> None:
    """A clean stop gives the Lease up: the standby need not wait out the (here 30 s) lease duration."""
    procs = election.start(2, lease=30, renew=3, retry=0.5)
    leader = election.leader(procs)
    standby = next(p for p in procs if p is not leader)
    assert leader.proc is not None
    stopped_at = time.monotonic()
    leader.proc.send_signal(signal.SIGTERM)
    assert leader.proc.wait(timeout=30) == 0
    leader.proc = None
    assert logged(leader, "leader_released")
    wait_for(lambda: election.holder() == identity(standby), timeout=15, interval=0.1, what="hand-over")
    took = time.monotonic() - stopped_at
    print(f"SIGTERMed leader: the standby took over after {took:.1f}s (lease 30s)")
    assert took < 15, took  # well within the 30 s a dead leader's Lease would hold
    wait_for(lambda: logged(standby, "leader_acquired"), timeout=5, what="the new leader to log leader_acquired")
    assert [a["reason"] for a in logged(standby, "leader_acquired")] == ["released"]
    assert election.leader([standby]) is standby
    lease = election.lease()
    assert lease is not None
    assert lease["spec"]["leaseTransitions"] == 1
    assert lease["spec"]["leaseDurationSeconds"] == 30


def test_a_leader_whose_lease_is_taken_stops_and_exits_non_zero(election: Election) -> None:
    """Never act without the Lease: someone else's holder on it (here written by hand) stops the leader."""
    (proc,) = election.start(1, lease=30, renew=3, retry=0.5)
    assert election.leader([proc]) is proc
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    patch = {"spec": {"holderIdentity": "intruder", "renewTime": now, "acquireTime": now}}
    election.cluster.kubectl(
        "-n",
        LEASE_NAMESPACE,
        "patch",
        "lease",
        election.lease_name,
        "--type=merge",
        "-p",
        json.dumps(patch),
        check=True,
    )
    assert proc.proc is not None
    assert proc.proc.wait(timeout=20) == 1
    proc.proc = None
    lost = logged(proc, "leader_lost")
    assert lost
    assert "intruder" in lost[0]["reason"]
    assert not logged(proc, "leader_released")
    assert election.holder() == "intruder"
