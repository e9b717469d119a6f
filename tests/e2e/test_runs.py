"""BenchmarkRuns that train in real pods: sshd, mpirun over ssh between pods, real collectives.

Each test applies a run the way a user does and watches what a user sees: ``kubectl get br``
(phase, epoch, accuracy, time to goal), the run's conditions and Events, the launcher's log.
The data arrives through the operator's dataset mechanism (see conftest.py). Figures printed
here come from the JPEG copy of CIFAR-10 in shared/datasets, on 1024 training images: they
test the plumbing, they are not results.
"""

from __future__ import annotations

import json
import math
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from mlbench_api import display
from mlbench_operator.run.results import recorded
from mlbench_operator.settings import RESULTS_WAIT_SECONDS
from tests.e2e.conftest import E2E, TEST_SUBSET, wait_training

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.e2e, pytest.mark.slow]

#: How long after the end the operator may take to record ``status.results`` for good: a launcher
#: still finishing gets RESULTS_WAIT_SECONDS, and a failed read of its log is retried for RESULTS_WAIT_SECONDS more
#: (``status.results`` then holds only ``failingSince``, which :func:`recorded` does not count).
RESULTS_TIMEOUT = 2 * RESULTS_WAIT_SECONDS + 30
#: CIFAR-10's classes
CLASSES = 10


def above_chance(accuracy: float, images: int = TEST_SUBSET, classes: int = CLASSES) -> float:
    """Standard deviations of ``accuracy`` above guessing (binomial, p = 1/classes) on ``images`` test images;
    the e2e goal (0.15) is 3.8 of them on 512 images: a run that reaches it learned."""
    p = 1 / classes
    return (accuracy - p) / math.sqrt(p * (1 - p) / images)


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def _watch_columns(e2e: E2E, run: str, workers: int, seen: list[dict[str, str]], ready: list[float]) -> Any:
    """Record ``kubectl get br`` rows while the run trains (to show progress appears live), and
    when READY (``-o wide``) first showed every worker (the pod start-up time, printed with ``-rP``)."""

    def every() -> None:
        row = e2e.get_br(run, wide=True)
        if not ready and row.get("READY") == str(workers):
            ready.append(time.monotonic())
        if row.get("PHASE") == "Running" and row.get("EPOCH") not in ("", "<none>"):
            seen.append(row)

    return every


def _assert_succeeded(e2e: E2E, run: str, st: dict[str, Any], backend: str, workers: int = 2) -> None:
    assert st.get("phase") == "Succeeded", f"{run} did not succeed: {json.dumps(st)[:2000]}\n{e2e.debug(run)}"
    result = st["result"]
    assert result["worldSize"] == workers
    assert result["epochs"] >= 1
    assert 0.0 < result["finalAccuracy"] <= 1.0
    assert result["timeToGoalSeconds"] is not None
    assert result["timeToGoalSeconds"] > 0
    assert above_chance(result["bestAccuracy"]) >= 3, f"{run} did not learn: {result}"  # learning, not plumbing
    row = e2e.get_br(run)
    assert row["PHASE"] == "Succeeded"
    assert row["BACKEND"] == backend
    # the columns a person reads (display), the exact figures in the status
    assert row["TIME-TO-GOAL"] == display.duration(result["timeToGoalSeconds"]), row
    assert float(row["EPOCH"]) == result["epochs"]
    assert result["goalMetric"] == "test-top1-accuracy"
    assert row["SCORE"] == display.percent(result["finalAccuracy"]) == display.percent(result["finalScore"]), row
    log = e2e.logs(f"{run}-launcher")
    # every rank's output comes back through mpirun (tagged [job,rank]) from the worker pods
    for rank in range(workers):
        assert f"[1,{rank}]<stdout>" in log, log[-2000:]


def _assert_results_kept(e2e: E2E, run: str, workdir: Path) -> dict[str, Any]:
    """The full results outlive the pods: a ConfigMap owned by the run, and ``mlbench results
    <namespace>/<run>`` (what a user types) downloads them and prints the table and the plots.
    Returns the downloaded summary."""
    st = e2e.wait_status(run, recorded, RESULTS_TIMEOUT, "status.results recorded")
    ref = st["results"]
    assert ref.get("configMap") == f"{run}-results", ref
    assert set(ref["files"]) == {"summary.json", "events.jsonl", "config.json"}
    cm = e2e.get("configmap", ref["configMap"])
    (owner,) = cm["metadata"]["ownerReferences"]
    assert owner["uid"] == e2e.get("benchmarkrun", run)["metadata"]["uid"]
    proc = subprocess.run(
        [sys.executable, "-m", "mlbench_api.cli", "results", f"{e2e.namespace}/{run}", "--plots", str(workdir)],
        cwd=workdir,
        env={"KUBECONFIG": str(e2e.cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert run in proc.stdout
    assert (workdir / "accuracy-vs-time.svg").exists()
    assert "CIFAR-10 (JPEG copy)" in (workdir / "accuracy-vs-time.svg").read_text()  # config.json came too
    fetched = workdir / "mlbench-results" / f"{e2e.namespace}.{run}"
    summary = json.loads((fetched / "summary.json").read_text())
    assert len(summary["history"]) == st["result"]["epochs"]  # the per-epoch history, not the compact result
    digests = summary["parameterDigests"]  # each rank's final parameters: one model under allreduce-sgd
    assert len(digests) == st["result"]["worldSize"], digests
    assert len(set(digests)) == 1, f"{run}: the ranks ended with different parameters: {digests}"
    events = [json.loads(line)["event"] for line in (fetched / "events.jsonl").read_text().splitlines()]
    assert events[0] == "run_start"
    assert "run_summary" in events
    return dict(summary)


class Workers(NamedTuple):
    """One run's shape; each case's workers and the launcher (100m) fit the test nodes' CPUs (every real node
    reports the machine's 2 cores: they share them)."""

    backend: str
    workers: int
    cpu: str
    placement: str = "Any"


#: Three workers: a hostfile of three pods, mpirun starting a daemon in each over ssh, a three-rank rendezvous.
#: OneWorkerPerNode: the seeds' environment, every message between workers crosses from one node to another.
WORKER_CASES = [
    Workers("gloo", 3, "550m"),
    Workers("gloo", 2, "850m", "OneWorkerPerNode"),
    Workers("mpi", 2, "850m", "OneWorkerPerNode"),
]


@pytest.mark.parametrize("case", WORKER_CASES, ids=lambda c: f"{c.backend}-{c.workers}-{c.placement}")
def test_workers_train_in_real_pods(e2e: E2E, e2e_task: str, case: Workers, tmp_path: Path) -> None:
    backend, workers = case.backend, case.workers
    applied = time.monotonic()
    resources = {"cpu": case.cpu, "memory": "2Gi"}
    scheduling = {**e2e.scheduling, "placement": case.placement}
    name = f"train-{backend}-{workers}" + ("-pernode" if case.placement == "OneWorkerPerNode" else "")
    run = e2e.run(name, e2e_task, backend=backend, workers=workers, resources=resources, scheduling=scheduling)
    seen: list[dict[str, str]] = []
    ready: list[float] = []
    st = e2e.wait_finished(run, every=_watch_columns(e2e, run, workers, seen, ready))
    _assert_succeeded(e2e, run, st, backend, workers)
    assert seen, "kubectl get br never showed an epoch while the run was Running"
    assert ready, f"kubectl get br -o wide never showed READY {workers} while the run was Running"
    print(f"\n{backend}: apply -> {workers}/{workers} workers Ready in {ready[0] - applied:.1f} s")
    assert _condition(st, "DatasetReady").get("status") == "True"
    print(f"\n{backend}: {e2e.get_br(run)}")
    nodes = _assert_results_kept(e2e, run, tmp_path)["environment"]["nodes"]
    print(f"{run}: ranks on nodes {nodes}")
    assert len(nodes) == workers
    assert set(nodes) <= set(e2e.real_nodes), nodes  # the pods' spec.nodeName, as each rank saw it
    if case.placement == "OneWorkerPerNode":
        assert len(set(nodes)) == workers, f"{run} put two workers on one node: {nodes}"
    if backend == "mpi":  # deleting the run deletes its results (owner reference, garbage collector)
        e2e.kubectl("delete", "benchmarkrun", run, "-n", e2e.namespace, "--wait=true", "--timeout=60s")
        deadline = time.monotonic() + 60
        while e2e.kubectl("get", "configmap", f"{run}-results", "-n", e2e.namespace, check=False).returncode == 0:
            assert time.monotonic() < deadline, "the results ConfigMap outlived its run"
            time.sleep(1)


def test_killed_worker_restarts_the_gang_once(e2e: E2E, e2e_task: str) -> None:
    run = e2e.run("killed-worker", e2e_task, overrides={"maxEpochs": 3})
    wait_training(e2e, run)
    e2e.kill_container(f"{run}-worker-1")
    st = e2e.wait_finished(run)
    _assert_succeeded(e2e, run, st, "gloo")
    assert st["restarts"] == 1
    restarts = [ev for ev in e2e.events(run) if ev["reason"] == "Restarting"]
    assert restarts, e2e.debug(run)
    message = restarts[0]["message"]
    assert "restart 1/2" in message, message
    assert f"{run}-" in message, message


def test_a_drained_node_restarts_the_gang_on_the_others_without_spending_max_restarts(e2e: E2E, e2e_task: str) -> None:
    """``kubectl drain`` of the node that holds worker 1 mid-run: its pods are evicted (DisruptionTarget), the run
    restarts its gang on the node left and succeeds, with maxRestarts 0 (a disruption is not the run's failure),
    and its Events say why it restarted."""
    if len(e2e.real_nodes) < 2:
        pytest.skip(f"one real node only ({e2e.real_nodes}): nothing to drain to")
    scheduling = {**e2e.scheduling, "placement": "Spread"}
    policy = {"maxRestarts": 0, "cleanPodPolicy": "None"}  # the workers stay: where did the new world go?
    run = e2e.run("drained", e2e_task, overrides={"maxEpochs": 3}, scheduling=scheduling, runPolicy=policy)
    wait_training(e2e, run)
    node = e2e.get("pod", f"{run}-worker-1")["spec"]["nodeName"]
    try:
        drain = e2e.kubectl(
            *("drain", node, f"--pod-selector=mlbench.io/run={run}", "--ignore-daemonsets", "--delete-emptydir-data"),
            "--timeout=120s",
            check=False,
        )
        assert drain.returncode == 0, drain.stdout + drain.stderr
        st = e2e.wait_finished(run)
        _assert_succeeded(e2e, run, st, "gloo")
        assert (st["restarts"], st["disruptionRestarts"]) == (1, 1), json.dumps(st)[:2000]
        assert _condition(st, "Restarted")["reason"] == "Disrupted"
        restarts = [ev for ev in e2e.events(run) if ev["reason"] == "Restarting"]
        assert restarts, e2e.debug(run)
        assert "not counted against maxRestarts=0" in restarts[0]["message"], restarts[0]["message"]
        assert "EvictionByEvictionAPI" in restarts[0]["message"], restarts[0]["message"]
        for rank in range(2):  # the new world avoided the cordoned node
            assert e2e.get("pod", f"{run}-worker-{rank}")["spec"]["nodeName"] != node
    finally:
        e2e.kubectl("uncordon", node, check=False)
        e2e.kubectl("delete", "benchmarkrun", run, "-n", e2e.namespace, "--wait=false", check=False)


def _run_pods(e2e: E2E, run: str) -> list[dict[str, Any]]:
    out = e2e.kubectl("get", "pods", "-n", e2e.namespace, "-l", f"mlbench.io/run={run}", "-o", "json").stdout
    return list(json.loads(out)["items"])


def _run_containers(address: str, run: str) -> list[str]:
    """The containers containerd at ``address`` still keeps for the run's pods (running or not)."""
    ctr = ["ctr", "--address", address, "-n", "k8s.io", "containers"]
    ids = subprocess.run([*ctr, "ls", "-q"], capture_output=True, text=True, check=True).stdout.split()
    infos = [subprocess.run([*ctr, "info", cid], capture_output=True, text=True, check=False).stdout for cid in ids]
    return [cid for cid, info in zip(ids, infos, strict=True) if f'"io.kubernetes.pod.name": "{run}-' in info]


def test_a_lost_node_restarts_the_gang_on_the_nodes_left_and_its_return_leaves_nothing_behind(
    e2e: E2E, e2e_task: str
) -> None:
    """A node that holds a worker (not the launcher) loses power mid-run: its link goes down, its agents and
    containers die (``LocalCluster.lose_node``). The node lifecycle controller declares it lost (60 s on the test
    cluster), the taint manager evicts the run's pods after the operator's ``MLBENCH_NODE_LOSS_SECONDS`` (60), the
    stuck Terminating pod is force-deleted, and the gang restarts on the node left and Succeeds; nothing waits for
    the dead kubelet; however the failure shows first (the eviction, or mpirun losing the node's rank:
    :mod:`mlbench_operator.run.nodes`), the restart is a disruption. The node then comes back (a reboot): no pod
    of the run returns to it, no container of the run is left in its containerd, and every pod of the run belongs
    to one world."""
    local = e2e.cluster.local
    if len(e2e.real_nodes) < 2 or local is None:
        pytest.skip(f"needs the local cluster's real nodes, two at least ({e2e.real_nodes})")
    scheduling = {**e2e.scheduling, "placement": "Spread"}
    # maxRestarts 0: a node lost under the run is a disruption, whether the eviction or mpirun's failure comes first
    run = e2e.run(
        "lost-node", e2e_task, overrides={"maxEpochs": 3}, scheduling=scheduling, runPolicy={"maxRestarts": 0}
    )
    wait_training(e2e, run)
    launcher = e2e.get("pod", f"{run}-launcher")["spec"]["nodeName"]
    workers = {e2e.get("pod", f"{run}-worker-{r}")["spec"]["nodeName"] for r in range(2)}
    lost = next(iter(sorted(workers - {launcher})), None)
    assert lost is not None, f"Spread put both workers on the launcher's node {launcher}"
    address = dict(zip(e2e.real_nodes, e2e.containerd_addresses, strict=True))[lost]
    started = time.monotonic()
    try:
        local.lose_node(lost)
        st = e2e.wait_finished(run, timeout=900)
        print(f"\n{run}: lost {lost} mid-run; final phase {st.get('phase')} after {time.monotonic() - started:.0f} s")
        _assert_succeeded(e2e, run, st, "gloo")
        assert st["restarts"] >= 1, json.dumps(st)[:2000]
        restarts = [ev["message"] for ev in e2e.events(run) if ev["reason"] == "Restarting"]
        assert restarts, e2e.debug(run)
        print(f"{run}: restarts {st['restarts']} (disruptions {st.get('disruptionRestarts', 0)}): {restarts}")
        assert st.get("disruptionRestarts") == st["restarts"], restarts  # none spent maxRestarts
    finally:
        local.restore_node(lost)
    pods = _run_pods(e2e, run)
    assert len({p["metadata"]["labels"]["mlbench.io/attempt"] for p in pods}) <= 1, [p["metadata"] for p in pods]
    assert all(p["spec"].get("nodeName") != lost for p in pods), "a pod of the run is on the lost node"
    deadline = time.monotonic() + 150  # the returned kubelet removes what its dead containers left (its GC: 1 min)
    while left := _run_containers(address, run):
        assert time.monotonic() < deadline, f"containers of {run} left in {lost}'s containerd: {left}"
        time.sleep(5)
    e2e.kubectl("delete", "benchmarkrun", run, "-n", e2e.namespace, "--wait=false", check=False)


def test_a_volume_that_does_not_mount_is_named_in_workers_ready(e2e: E2E, e2e_task: str) -> None:
    """A task whose data volume cannot mount (a ConfigMap that does not exist): the kubelet only says so in the
    pod's Events (the pod shows ContainerCreating); WorkersReady says FailedMount with the kubelet's message, and
    the run has a Warning Event saying the same."""
    task = json.loads(e2e.kubectl("get", "benchmarktask", e2e_task, "-o", "json").stdout)
    spec = task["spec"]
    spec["dataset"].pop("source")
    spec["dataset"]["volume"] = {"configMap": {"name": "no-such-data"}}
    name = f"{e2e_task}-unmountable"
    e2e.apply({"apiVersion": task["apiVersion"], "kind": "BenchmarkTask", "metadata": {"name": name}, "spec": spec})
    e2e.tasks.append(name)
    run = e2e.run("unmountable", name)
    try:
        st = e2e.wait_status(
            run, lambda s: _condition(s, "WorkersReady").get("reason") == "FailedMount", 120, "WorkersReady FailedMount"
        )
        message = _condition(st, "WorkersReady")["message"]
        assert 'configmap "no-such-data" not found' in message, message
        warned = [ev["message"] for ev in e2e.events(run) if ev["reason"] == "FailedMount"]
        assert warned, e2e.debug(run)
        print(f"\n{run}: WorkersReady {message}")
    finally:
        e2e.kubectl("delete", "benchmarkrun", run, "-n", e2e.namespace, "--wait=false", check=False)


class _Follow:
    """``kubectl logs -f POD``: the pod's log to its end (a deleted pod's log is gone soon after it ends)."""

    def __init__(self, e2e: E2E, pod: str) -> None:
        cluster = e2e.cluster
        self.proc = subprocess.Popen(
            [cluster.kubectl_bin, f"--kubeconfig={cluster.kubeconfig}", "logs", "-f", pod, "-n", e2e.namespace],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.proc.stdout is not None
        # attached once the log so far starts coming (an empty log: go on after a while, attached or not)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        self.first = self.proc.stdout.readline() if ready else ""

    def rest(self, timeout: float = 120) -> str:
        """The whole log, once the container has ended."""
        try:
            return self.first + self.proc.communicate(timeout=timeout)[0]
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()


def test_a_deleted_launcher_pod_stops_the_ranks_gracefully_and_the_run_restarts(e2e: E2E, e2e_task: str) -> None:
    """``kubectl delete pod`` (as a drain or an eviction does) SIGTERMs the launcher, PID 1 of its pod: it passes
    the stop on through mpirun and ssh to the ranks in the worker pods, rank 0's aborted summary (stop reason
    interrupted) reaches its log before the pod is gone, and the operator restarts the gang, which succeeds."""
    run = e2e.run("stopped-launcher", e2e_task, overrides={"maxEpochs": 3})
    launcher = f"{run}-launcher"
    wait_training(e2e, run)
    follow = _Follow(e2e, launcher)
    e2e.kubectl("delete", "pod", launcher, "-n", e2e.namespace, "--wait=false")
    log = follow.rest()
    stops = [line for line in log.splitlines() if '"run_stop"' in line]
    assert stops, log[-3000:]
    assert '"stop_reason": "interrupted"' in stops[-1], stops[-1]
    assert '"run_results"' in log, log[-2000:]  # the results line came out too
    st = e2e.wait_finished(run)
    _assert_succeeded(e2e, run, st, "gloo")
    assert st["restarts"] == 1, e2e.debug(run)


def test_a_deleted_worker_pod_stops_its_rank_and_says_so(e2e: E2E, e2e_task: str) -> None:
    """A worker pod deleted (a drain, an eviction, a preemption) gets SIGTERM as PID 1 of its pod: the worker
    passes it to sshd and the rank under it, which takes it as its graceful stop (its own line, through mpirun,
    in the launcher's log), waits for it, and exits 143 saying why; the operator restarts the gang."""
    run = e2e.run("stopped-worker", e2e_task, overrides={"maxEpochs": 3})
    worker = f"{run}-worker-1"
    wait_training(e2e, run)
    launcher, follow = _Follow(e2e, f"{run}-launcher"), _Follow(e2e, worker)
    e2e.kubectl("delete", "pod", worker, "-n", e2e.namespace, "--wait=false")
    worker_log, launcher_log = follow.rest(), launcher.rest()
    assert f"worker {worker} was stopped by SIGTERM" in worker_log, worker_log[-3000:]
    assert "worker exits with 143" in worker_log, worker_log[-3000:]
    # the launcher's lines without its (long) results line, which would hide them in the message
    said = "\n".join(line for line in launcher_log.splitlines() if '"results"' not in line)
    assert "rank 1: stopped by SIGTERM" in launcher_log, said[-3000:]
    st = e2e.wait_finished(run)
    _assert_succeeded(e2e, run, st, "gloo")
    assert st["restarts"] == 1, e2e.debug(run)
    (restart,) = [ev for ev in e2e.events(run) if ev["reason"] == "Restarting"]
    assert f"worker 1 (pod {worker})" in restart["message"], restart["message"]


def test_too_little_memory_fails_with_oomkilled(e2e: E2E, e2e_task: str) -> None:
    run = e2e.run(
        "oom",
        e2e_task,
        resources={"cpu": "850m", "memory": "256Mi"},
        runPolicy={"maxRestarts": 0},
    )
    st = e2e.wait_finished(run)
    assert st["phase"] == "Failed", e2e.debug(run)
    failed = _condition(st, "Failed")
    assert failed.get("reason") == "OOMKilled", json.dumps(st)[:2000]
    assert "worker" in failed["message"]
    assert "memory" in failed["message"].lower()
    # a failed run keeps what there is: rank 0's events up to the failure (or records why there are none)
    results = e2e.wait_status(run, recorded, RESULTS_TIMEOUT, "status.results recorded")["results"]
    print(f"\nOOM run results: {results}")


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ({"sha256": "0" * 64}, "ChecksumMismatch"),
        # another sha256: with the same one the data already fetched would be used (content-addressed)
        ({"url": "http://no-such-service.invalid:8080/cifar10.tar.gz", "sha256": "1" * 64}, "SourceUnreachable"),
    ],
    ids=["checksum", "unreachable"],
)
def test_bad_dataset_source_fails_with_a_clear_reason(
    e2e: E2E, e2e_task: str, source: dict[str, str], reason: str
) -> None:
    """A run may point the (open-division) task at another source: a wrong one fails before any worker."""
    override = {"url": e2e.dataset_url, "sha256": e2e.dataset_sha256, **source}
    run = e2e.run(f"bad-{reason.lower()}", e2e_task, overrides={"datasetSource": override})
    st = e2e.wait_finished(run, timeout=300)
    assert st["phase"] == "Failed"
    failed = _condition(st, "Failed")
    assert failed.get("reason") == reason, json.dumps(st)[:2000]
    selector = f"mlbench.io/run={run},mlbench.io/role=worker"
    assert not e2e.kubectl("get", "pods", "-n", e2e.namespace, "-l", selector, "-o", "name").stdout.strip()
