"""Queued runs admitted by a real Kueue (v0.17.0's manager, tests/cluster/kueue.py) as a whole.

A ClusterQueue with 3 CPUs: two runs of 2 one-CPU workers (+ the launcher's 0.1) do not fit together, so one
runs and the other waits Queued, with Kueue's message, until the first finishes; a run of 4 such workers never
fits and says why. Neither waiting run has a single pod. Two ResourceFlavors whose nodeLabels name kwok nodes of
their own: a run that does not fit the first is admitted on the second and lands on its nodes. Kueue's
waitForPodsReady: a run whose workers never become Ready is evicted and requeued; a started one is left alone.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from mlbench_api.run import SUSPEND_FINISHED
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import Reason
from mlbench_operator.run import kueue as kq
from tests import factories
from tests.cluster.kueue import PODS_READY_TIMEOUT_SECONDS, KueueManager, build
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


def _queue(ns: str, flavors: list[tuple[str, dict[str, str], str]]) -> list[dict[str, Any]]:
    """ResourceFlavors (name, nodeLabels, CPU quota), a ClusterQueue that offers them in this order and the
    LocalQueue QUEUE in ``ns``; the ClusterQueue is named after the first flavor."""
    api = kq.API_VERSION
    cluster_queue = flavors[0][0]
    offered = [
        {"name": f, "resources": [{"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": "100Gi"}]}
        for f, _, cpu in flavors
    ]
    return [
        *(
            {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": f}, "spec": {"nodeLabels": labels}}
            for f, labels, _ in flavors
        ),
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": offered}],
            },
        },
        {
            "apiVersion": api,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": ns},
            "spec": {"clusterQueue": cluster_queue},
        },
    ]


def _apply_queue(kube_cluster: KubeCluster, objs: list[dict[str, Any]]) -> Iterator[str]:
    kube_cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}), check=True
    )
    try:
        yield QUEUE
    finally:
        for obj in sorted(objs, key=lambda o: o["kind"] != "ClusterQueue"):  # the queue first: it holds the flavors
            if obj["kind"] in ("ClusterQueue", "ResourceFlavor"):
                kind, name = f"{obj['kind'].lower()}.kueue.x-k8s.io", obj["metadata"]["name"]
                kube_cluster.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false")


def _name(runs: Runs, suffix: str = "") -> str:
    """A cluster-scoped name of the test's own (Kueue may still hold a deleted ClusterQueue of the same name
    inactive for a while)."""
    return f"mlbench-test-{SESSION}-{runs.ns}"[: 63 - len(suffix)].rstrip("-") + suffix


@pytest.fixture
def queue(runs: Runs, kube_cluster: KubeCluster, kueue_manager: KueueManager) -> Iterator[str]:
    """A ResourceFlavor, a ClusterQueue with CPU_QUOTA CPUs and a LocalQueue in the test's namespace."""
    yield from _apply_queue(kube_cluster, _queue(runs.ns, [(_name(runs), {}, CPU_QUOTA)]))


#: The flavors' node label (allowed by the test operator's policy: mlbench-test-*), on kwok-cpu-0 (a) and -1 (b).
FLAVOR_NODES = {"a": "kwok-cpu-0", "b": "kwok-cpu-1"}


@pytest.fixture
def flavor_key(runs: Runs, kube_cluster: KubeCluster) -> Iterator[str]:
    """A node label of the test's own: ``a`` on one kwok node, ``b`` on another (removed afterwards)."""
    key = f"mlbench-test-flavor-{uuid.uuid4().hex[:6]}"
    try:
        for value, node in FLAVOR_NODES.items():
            kube_cluster.kubectl("label", "node", node, f"{key}={value}", "--overwrite", check=True)
        yield key
    finally:
        for node in FLAVOR_NODES.values():
            kube_cluster.kubectl("label", "node", node, f"{key}-")


@pytest.fixture
def two_flavors(runs: Runs, kube_cluster: KubeCluster, kueue_manager: KueueManager, flavor_key: str) -> Iterator[str]:
    """A ClusterQueue offering flavor a (exactly one run of 2 one-CPU workers + the launcher's 100m) before
    flavor b (room for one more), each flavor's nodeLabels naming its kwok node."""
    flavors = [(_name(runs, f"-{v}"), {flavor_key: v}, "2100m") for v in FLAVOR_NODES]
    yield from _apply_queue(kube_cluster, _queue(runs.ns, flavors))


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


def _node_selector_and_nodes(runs: Runs, run: str, key: str) -> set[tuple[str | None, str]]:
    """(the pods' value of the flavor label in their nodeSelector, their node) of every pod of ``run``."""
    pods = runs.pods(run).values()
    return {((p["spec"].get("nodeSelector") or {}).get(key), p["spec"].get("nodeName", "")) for p in pods}


def test_a_run_that_does_not_fit_the_first_flavor_is_admitted_on_the_second_and_lands_on_its_nodes(
    runs: Runs, two_flavors: str, flavor_key: str
) -> None:
    runs.apply(_queued("first", 2))
    runs.wait_phase("first", "Running", timeout=90)  # flavor a is now full
    runs.apply(_queued("second", 2))
    runs.wait_phase("second", "Running", timeout=90)
    assert _node_selector_and_nodes(runs, "first", flavor_key) == {("a", FLAVOR_NODES["a"])}
    assert _node_selector_and_nodes(runs, "second", flavor_key) == {("b", FLAVOR_NODES["b"])}
    workload = _workload(runs, "second")
    assignments = workload["status"]["admission"]["podSetAssignments"]
    assert {a["name"]: a["flavors"]["cpu"] for a in assignments} == {
        kq.WORKERS_POD_SET: _name(runs, "-b"),
        kq.LAUNCHER_POD_SET: _name(runs, "-b"),
    }
    assert runs.run("second")["spec"].get("scheduling") is None  # the placement is on the pods, not the spec


@pytest.fixture
def split_flavors(runs: Runs, kube_cluster: KubeCluster, kueue_manager: KueueManager, flavor_key: str) -> Iterator[str]:
    """Flavor a with room for 2 one-CPU workers and nothing more, then flavor b: Kueue assigns a run of 2 workers
    the workers' pod set on a and the launcher's (its 100m no longer fits a) on b."""
    flavors = [(_name(runs, "-a"), {flavor_key: "a"}, "2"), (_name(runs, "-b"), {flavor_key: "b"}, "1")]
    yield from _apply_queue(kube_cluster, _queue(runs.ns, flavors))


def test_workers_and_launcher_on_different_flavors_each_get_their_own(
    runs: Runs, split_flavors: str, flavor_key: str
) -> None:
    """Each pod set's own flavor's node labels on its pods: the union (both values of one label key) would put
    every pod on one flavor's nodes, or on none."""
    runs.apply(_queued("split", 2))
    runs.wait_phase("split", "Running", timeout=90)
    assignments = _workload(runs, "split")["status"]["admission"]["podSetAssignments"]
    assert {a["name"]: a["flavors"]["cpu"] for a in assignments} == {
        kq.WORKERS_POD_SET: _name(runs, "-a"),
        kq.LAUNCHER_POD_SET: _name(runs, "-b"),
    }
    pods = runs.pods("split")
    placed = {
        (p["metadata"]["labels"][n.LABEL_ROLE], (p["spec"].get("nodeSelector") or {}).get(flavor_key))
        for p in pods.values()
    }
    assert placed == {(n.ROLE_WORKER, "a"), (n.ROLE_LAUNCHER, "b")}
    nodes = {p["metadata"]["labels"][n.LABEL_ROLE]: p["spec"].get("nodeName") for p in pods.values()}
    assert nodes == {n.ROLE_WORKER: FLAVOR_NODES["a"], n.ROLE_LAUNCHER: FLAVOR_NODES["b"]}


def _workload(runs: Runs, run: str) -> dict[str, Any]:
    uid = runs.run(run)["metadata"]["uid"]
    found = runs.get("workloads.kueue.x-k8s.io", kq.workload_name(run, uid))
    assert found is not None
    return found


def _true(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    cond = c.get((obj.get("status") or {}).get("conditions"), type_)
    return cond if cond is not None and cond["status"] == "True" else None


def test_kueue_evicts_a_run_whose_workers_never_become_ready_and_leaves_a_started_one_alone(
    runs: Runs, queue: str
) -> None:
    """waitForPodsReady (tests/cluster/kueue.py: PODS_READY_TIMEOUT_SECONDS): the stuck run's worker can never
    be scheduled (a node label no node has); Kueue evicts its Workload, the operator releases the pods, says why
    and gives the quota back, and Kueue requeues it; meanwhile a run that started stays admitted. The operator's
    own startup deadline (runPolicy.startupDeadlineSeconds, default 600) never fires."""
    started = _queued("fine", 1)
    stuck = _queued("stuck", 1)
    stuck["spec"]["scheduling"] = {"nodeSelector": {f"mlbench-test-{uuid.uuid4().hex[:6]}": "nowhere"}}
    runs.apply(started)
    runs.apply(stuck)
    runs.wait_phase("fine", "Running", timeout=60)

    # one snapshot: Kueue requeues within 1-2 s, and the next attempt rewrites WorkersReady
    status = runs.wait_status(
        "stuck",
        lambda s: (_suspended(s) or {}).get("reason") == Reason.PODS_READY_TIMEOUT and s,
        timeout=PODS_READY_TIMEOUT_SECONDS + 40,
        what="stuck run evicted by Kueue's waitForPodsReady",
    )
    cond = _suspended(status)
    assert cond is not None
    assert "PodsReady timeout" in cond["message"]  # Kueue's words
    ready = c.get(status["conditions"], c.WORKERS_READY)
    assert ready is not None
    assert ready["reason"] == Reason.PODS_READY_TIMEOUT
    assert "cannot be scheduled" in ready["message"]  # why the workers were not Ready (the scheduler's words)
    assert status.get("startupTimeouts", 0) == 0  # Kueue acted, not the operator's startup deadline
    assert status["disruptionRestarts"] >= 1  # not against maxRestarts

    # the pods released, then the quota given back: Kueue requeues the Workload (backoff 1 s) and admits it again
    wl = runs.wait_status(
        "stuck",
        lambda s: (w := _workload(runs, "stuck")).get("status", {}).get("requeueState", {}).get("count") and w,
        timeout=30,
        what="the stuck run's Workload requeued",
    )
    # requeueState.count is the requeue's record: the Requeued condition is only there until Kueue admits the
    # Workload again (1-2 s later), so asserting it raced with the re-admission
    assert wl["status"]["requeueState"]["count"] >= 1
    runs.wait_status(
        "stuck",
        lambda s: s.get("restarts", 0) >= 1 and runs.pods("stuck"),
        timeout=60,
        what="the requeued run admitted again with a new attempt's pods",
    )

    # the run that started: PodsReady True, never evicted, long past the timeout
    fine = _workload(runs, "fine")
    assert _true(fine, kq.PODS_READY) is not None
    admitted_at = c.parse_time(_true(fine, kq.ADMITTED)["lastTransitionTime"])  # type: ignore[index]
    assert admitted_at is not None
    time.sleep(max(0.0, PODS_READY_TIMEOUT_SECONDS + 2 - (time.time() - admitted_at.timestamp())))
    assert _true(_workload(runs, "fine"), kq.EVICTED) is None
    status = runs.status("fine")
    assert status["phase"] == "Running"
    assert status.get("restarts", 0) == 0


def test_a_queued_run_whose_workload_is_deactivated_fails_with_kueues_message(runs: Runs, queue: str) -> None:
    """An admin deactivates the Workload of a run that waits (spec.active false, as Kueue itself does once
    waitForPodsReady's backoffLimitCount is spent): Kueue never admits it again, so the run ends Failed,
    WorkloadDeactivated, in Kueue's words, instead of staying Suspended forever; its Workload is marked Finished."""
    runs.apply(_queued("parked", 4))  # never fits the queue: it waits
    runs.wait_status("parked", _kueues_word, timeout=60, what="parked run Queued, in Kueue's words")
    uid = runs.run("parked")["metadata"]["uid"]
    name = kq.workload_name("parked", uid)
    runs.kubectl("patch", "workloads.kueue.x-k8s.io", name, "--type=merge", "-p", '{"spec": {"active": false}}')
    status = runs.wait_phase("parked", "Failed", timeout=60)
    failed = c.get(status["conditions"], c.FAILED)
    assert failed is not None
    assert failed["reason"] == Reason.WORKLOAD_DEACTIVATED
    assert "The workload is deactivated" in failed["message"]  # Kueue's own words (its Evicted condition)
    assert name in failed["message"]
    assert runs.pods("parked") == {}
    finished = runs.wait_status(
        "parked", lambda s: _true(_workload(runs, "parked"), kq.FINISHED), timeout=30, what="the Workload Finished"
    )
    assert finished["reason"] == "Failed"
