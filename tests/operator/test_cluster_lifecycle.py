"""The operator against the real control plane (kwok nodes): lifecycle, failures, restarts, cleanup."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from mlbench_operator import conditions as c
from tests import factories
from tests.cluster.plugin import wait_for
from tests.operator import helpers as h
from tests.operator.conftest import SESSION, SESSION_LABEL, OperatorProcess, Runs

pytestmark = pytest.mark.cluster


def has(status: dict, type_: str, reason: str) -> bool:
    """For a wait's predicate: the condition is there with this reason (the run's first status may not be yet)."""
    return (c.get(status.get("conditions"), type_) or {}).get("reason") == reason


def cond(status: dict, type_: str) -> dict:
    found = c.get(status.get("conditions"), type_)
    assert found is not None, f"no {type_} condition in {status.get('conditions')}"
    return found


def owned_by(obj: dict, run: dict) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(r["uid"] == run["metadata"]["uid"] and r.get("controller") for r in refs)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_lifecycle(runs: Runs, workers: int) -> None:
    name = f"life{workers}"
    runs.apply(h.run(name, workers=workers, resources={"cpu": "500m", "memory": "512Mi"}))
    status = runs.wait_phase(name, "Running")
    run = runs.run(name)
    ns = runs.ns
    # kopf's traces are ours: the mlbench.io finalizer while the run is active, no kopf.zalando.org keys
    assert run["metadata"].get("finalizers") == ["mlbench.io/operator"]
    assert not [k for k in run["metadata"].get("annotations") or {} if "kopf" in k]

    # The world: names, owners, labels, resources.
    svc = runs.get("service", name)
    assert svc is not None
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"]
    cm = runs.get("configmap", f"{name}-config")
    assert cm is not None
    assert cm["data"]["hostfile"] == "".join(f"{name}-worker-{i}.{name}.{ns}.svc slots=1\n" for i in range(workers))
    assert json.loads(cm["data"]["config.json"])["worldSize"] == workers
    secret = runs.get("secret", f"{name}-ssh")
    assert secret is not None
    assert set(secret["data"]) == {"ssh-privatekey", "authorized_keys", "ssh_host_ed25519_key", "known_hosts"}
    assert secret["type"] == "kubernetes.io/ssh-auth"
    assert secret["immutable"] is True
    assert cm["immutable"] is True
    policy = runs.get("networkpolicy", name)  # accepted by the real API server (enforced by a CNI, not here)
    assert policy is not None
    assert policy["spec"]["podSelector"]["matchLabels"]["mlbench.io/run"] == name
    pods = runs.pods(name)
    assert set(pods) == {f"{name}-worker-{i}" for i in range(workers)} | {f"{name}-launcher"}
    for obj in [svc, cm, secret, policy, *pods.values()]:
        assert owned_by(obj, run), obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["mlbench.io/task"] == h.TASK_NAME
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "mlbench-operator"
    for i in range(workers):
        pod = pods[f"{name}-worker-{i}"]
        assert pod["metadata"]["labels"]["mlbench.io/role"] == "worker"
        assert pod["metadata"]["labels"]["mlbench.io/rank"] == str(i)
        assert pod["spec"]["hostname"] == f"{name}-worker-{i}"
        assert pod["spec"]["subdomain"] == name
        res = pod["spec"]["containers"][0]["resources"]
        assert res["requests"] == res["limits"] == {"cpu": "500m", "memory": "512Mi"}
    assert pods[f"{name}-launcher"]["metadata"]["labels"]["mlbench.io/role"] == "launcher"
    assert status["workers"] == {"ready": workers, "total": workers}
    assert cond(status, "WorkersReady")["status"] == "True"
    assert cond(status, "Running")["status"] == "True"
    # kstatus, as Flux / Argo CD / kubectl wait read it
    assert (cond(status, "Ready")["status"], cond(status, "Ready")["reason"]) == ("False", "Running")
    assert cond(status, "Reconciling")["status"] == "True"
    assert cond(status, "Stalled")["status"] == "False"
    assert status["observedGeneration"] == run["metadata"]["generation"]
    assert status["taskSnapshot"]["model"]["depth"] == 20

    # Finish: a valid RunSummary in the launcher's termination message.
    runs.finish_launcher(name, 0, factories.summary(name, world_size=workers).termination_message())
    status = runs.wait_phase(name, "Succeeded")
    assert status["result"]["goalReached"] is True
    assert status["result"]["timeToGoalSeconds"] == 1234.5
    assert status["result"]["timeToGoal"] == "20m34s"  # the API server keeps the new status field
    assert status["result"]["worldSize"] == workers
    assert cond(status, "Succeeded")["status"] == "True"
    assert cond(status, "GoalReached")["status"] == "True"
    assert status["completionTime"] >= status["startTime"]
    # cleanPodPolicy Running: running workers removed, the launcher kept for its log
    wait_for(lambda: set(runs.pods(name)) == {f"{name}-launcher"}, timeout=30, what="workers cleaned up")
    status = runs.wait_status(name, lambda s: s["workers"]["ready"] == 0 and s, timeout=10, what="ready recounted")
    assert status["phase"] == "Succeeded"
    assert cond(status, "WorkersReady")["status"] == "False"
    # finished and no TTL: nothing left to do, so the run no longer blocks its own deletion
    wait_for(lambda: not runs.run(name)["metadata"].get("finalizers"), timeout=30, what="finalizer released")
    assert runs.kubectl("wait", "--for=condition=Ready", f"benchmarkrun/{name}", "--timeout=5s").returncode == 0
    assert cond(runs.run(name)["status"], "Reconciling")["status"] == "False"
    # a finished run's runPolicy edited (its daemon has stopped): observedGeneration still catches up
    runs.kubectl("patch", "benchmarkrun", name, "--type=merge", "-p", '{"spec":{"runPolicy":{"maxRestarts":5}}}')
    generation = runs.run(name)["metadata"]["generation"]
    runs.wait_status(name, lambda s: s.get("observedGeneration") == generation, timeout=10, what="observedGeneration")

    # kubectl get shows the truth
    table = runs.kubectl("get", "benchmarkruns", name).stdout
    assert "Succeeded" in table
    assert "20m34s" in table  # 1234.5 s as a person reads it (the exact figure stays in the status)
    assert h.TASK_NAME in table

    def reasons() -> set[str]:
        out = runs.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout
        return {e["reason"] for e in json.loads(out)["items"]}

    wait_for(lambda: {"Admitted", "Running", "Succeeded"} <= reasons(), timeout=20, what="Events on transitions")


def test_launcher_waits_for_every_worker(runs: Runs, kube_cluster: object) -> None:
    """Workers that cannot be scheduled: a clear condition, and no launcher until all are Ready."""
    name = "gated"
    key = f"mlbench-test-{uuid.uuid4().hex[:6]}"
    runs.apply(h.run(name, workers=2, scheduling={"nodeSelector": {key: "yes"}}))
    status = runs.wait_status(name, lambda s: has(s, "WorkersReady", "Unschedulable") and s, what="Unschedulable")
    assert status["phase"] == "Pending"
    assert "cannot be scheduled" in cond(status, "WorkersReady")["message"]
    time.sleep(2)
    assert f"{name}-launcher" not in runs.pods(name)
    runs.kubectl("label", "node", "kwok-cpu-0", f"{key}=yes")
    try:
        runs.wait_phase(name, "Running", timeout=90)
    finally:
        runs.kubectl("label", "node", "kwok-cpu-0", f"{key}-", check=False)
    pods = runs.pods(name)
    launcher_created = pods[f"{name}-launcher"]["metadata"]["creationTimestamp"]
    for i in range(2):
        ready = next(x for x in pods[f"{name}-worker-{i}"]["status"]["conditions"] if x["type"] == "Ready")
        assert ready["status"] == "True"
        assert ready["lastTransitionTime"] <= launcher_created


def test_worker_failure_gang_restart_then_failed(runs: Runs) -> None:
    name = "flaky"
    runs.apply(h.run(name, workers=2, runPolicy={"maxRestarts": 1}))
    runs.wait_phase(name, "Running")
    first = {p: o["metadata"]["uid"] for p, o in runs.pods(name).items()}
    runs.fail_pod(f"{name}-worker-1", 137, "killed")
    status = runs.wait_status(
        name,
        lambda s: s.get("restarts") == 1 and s.get("phase") == "Running" and s,
        timeout=90,
        what="restarted world Running",
    )
    second = {p: o["metadata"]["uid"] for p, o in runs.pods(name).items()}
    assert set(second) == set(first)
    assert not set(second.values()) & set(first.values()), "every pod of the world must be recreated"
    assert all(o["metadata"]["labels"]["mlbench.io/attempt"] == "1" for o in runs.pods(name).values())
    assert cond(status, "Restarted")["status"] == "True"
    assert f"{name}-worker-1" in cond(status, "Restarted")["message"]

    runs.fail_pod(f"{name}-worker-0", 3, "CUDA error: out of memory")
    status = runs.wait_phase(name, "Failed", timeout=60)
    assert cond(status, "Failed")["reason"] == "WorkerFailed"
    assert f"{name}-worker-0" in status["message"]
    assert "exit code 3" in status["message"]
    assert "CUDA error" in status["message"]
    assert status["restarts"] == 1
    # the failed pod survives for its logs; running pods are removed
    wait_for(lambda: f"{name}-worker-1" not in runs.pods(name), timeout=30, what="running worker removed")
    assert f"{name}-worker-0" in runs.pods(name)


def test_launcher_failure_message_is_shown(runs: Runs) -> None:
    name = "boom"
    runs.apply(h.run(name, workers=1, runPolicy={"maxRestarts": 0}))
    runs.wait_phase(name, "Running")
    runs.finish_launcher(name, 1, '{"error":"mpirun exited with 1; last output: NCCL timeout","exitCode":1}')
    status = runs.wait_phase(name, "Failed")
    assert cond(status, "Failed")["reason"] == "LauncherFailed"
    assert "NCCL timeout" in status["message"]


def test_deadline_exceeded(runs: Runs) -> None:
    name = "slow"
    # long enough that a busy machine sees the run Running before the deadline ends it
    runs.apply(h.run(name, workers=1, runPolicy={"activeDeadlineSeconds": 15}))
    runs.wait_phase(name, "Running")
    # what is left of the deadline is on every pod, for the kubelet to enforce while the operator is down
    deadlines = {p["metadata"]["name"]: p["spec"].get("activeDeadlineSeconds") for p in runs.pods(name).values()}
    assert set(deadlines) == {f"{name}-worker-0", f"{name}-launcher"}
    assert all(d is not None and 1 <= d <= 15 for d in deadlines.values()), deadlines
    status = runs.wait_phase(name, "Failed", timeout=45)
    assert cond(status, "Failed")["reason"] == "DeadlineExceeded"


def test_a_pod_security_refusal_fails_the_run_at_once(runs: Runs) -> None:
    """An nfs dataset volume (the default policy allows it) in a namespace enforcing ``restricted``: Pod
    Security admission refuses every worker, so the run fails PolicyViolation with the refusal's text
    (it retried with backoff until a deadline, if it had one)."""
    task = h.task(f"optest-nfs-{SESSION}")  # cluster-scoped: one per session
    task["spec"]["dataset"] = {**task["spec"]["dataset"], "volume": {"nfs": {"server": "nfs.example", "path": "/x"}}}
    runs.cluster.kubectl("apply", "-f", "-", input=json.dumps(task), check=True)
    try:
        runs.apply(h.run("nfs", workers=1, task_name=task["metadata"]["name"]))
        status = runs.wait_phase("nfs", "Failed", timeout=60)
        assert cond(status, "Failed")["reason"] == "PolicyViolation", status
        assert "violates PodSecurity" in status["message"], status["message"]
        assert '"nfs"' in status["message"], status["message"]
        assert runs.pods("nfs") == {}
    finally:
        runs.cluster.kubectl("delete", "benchmarktask", task["metadata"]["name"], "--ignore-not-found", "--wait=false")


def test_unknown_task_creates_nothing(runs: Runs) -> None:
    runs.apply(h.run("orphan", task_name="no-such-task"))
    status = runs.wait_phase("orphan", "Failed")
    assert cond(status, "Failed")["reason"] == "TaskNotFound"
    assert "no-such-task" in status["message"]
    assert runs.pods("orphan") == {}
    assert runs.get("configmap", "orphan-config") is None
    assert runs.get("service", "orphan") is None


def test_disallowed_override_is_rejected(runs: Runs) -> None:
    runs.apply(h.run("tweaked", overrides={"learningRate": 0.5}))
    status = runs.wait_phase("tweaked", "Failed")
    assert cond(status, "Failed")["reason"] == "OverrideNotAllowed"
    assert "learningRate" in status["message"]
    assert runs.pods("tweaked") == {}


def test_malformed_summary_is_invalid_result(runs: Runs) -> None:
    runs.apply(h.run("garbled", workers=1))
    runs.wait_phase("garbled", "Running")
    runs.finish_launcher("garbled", 0, '{"schema": "mlbench.io/summary/v1", "run": "garbled"')
    status = runs.wait_phase("garbled", "Failed")
    assert cond(status, "Failed")["reason"] == "InvalidResult"
    assert "result" not in status


def test_delete_cascades(runs: Runs) -> None:
    runs.apply(h.run("gone", workers=2))
    runs.wait_phase("gone", "Running")
    runs.kubectl("delete", "benchmarkrun", "gone", "--wait=true", "--timeout=30s")

    def all_gone() -> bool:
        return (
            runs.pods("gone") == {}
            and runs.get("service", "gone") is None
            and runs.get("configmap", "gone-config") is None
            and runs.get("secret", "gone-ssh") is None
        )

    wait_for(all_gone, timeout=60, what="owned objects garbage-collected")


def test_ttl_after_finished_deletes_run(runs: Runs) -> None:
    runs.apply(h.run("brief", workers=1, runPolicy={"ttlSecondsAfterFinished": 2}))
    runs.wait_phase("brief", "Running")
    runs.finish_launcher("brief", 0, factories.summary("brief", world_size=1).termination_message())
    wait_for(lambda: runs.get("benchmarkrun", "brief") is None, timeout=30, what="run deleted by TTL")


def test_ttl_added_after_the_run_finished(runs: Runs) -> None:
    """kopf never re-spawns a daemon that returned: the TTL has a daemon of its own."""
    runs.apply(h.run("late-ttl", workers=1))
    runs.wait_phase("late-ttl", "Running")
    runs.finish_launcher("late-ttl", 0, factories.summary("late-ttl", world_size=1).termination_message())
    runs.wait_phase("late-ttl", "Succeeded")
    wait_for(lambda: not runs.run("late-ttl")["metadata"].get("finalizers"), timeout=30, what="finalizer released")
    runs.kubectl(
        "patch",
        "benchmarkrun",
        "late-ttl",
        "--type=merge",
        "-p",
        '{"spec":{"runPolicy":{"ttlSecondsAfterFinished":1}}}',
    )
    wait_for(lambda: runs.get("benchmarkrun", "late-ttl") is None, timeout=30, what="run deleted by a late TTL")


def test_operator_killed_and_restarted(runs: Runs, operator: OperatorProcess) -> None:
    """SIGKILL mid-creation and mid-run: no duplicate pods, no lost status, the run completes."""
    name = "survivor"
    workers = 24
    task = h.task(f"{runs.ns}-task")
    runs.kubectl("apply", "-f", "-", input=json.dumps(task))
    try:
        runs.apply(h.run(name, workers=workers, task_name=task["metadata"]["name"], runPolicy={"maxRestarts": 0}))
        wait_for(lambda: len(runs.pods(name)) >= 3, timeout=60, interval=0.05, what="some workers created")
        operator.stop(kill=True)
        before = {p: o["metadata"]["uid"] for p, o in runs.pods(name).items()}
        # the task changes while the operator is down: the run keeps its snapshot
        task["spec"]["runner"]["image"] = "changed/runner:2"
        runs.kubectl("apply", "-f", "-", input=json.dumps(task))
        operator.start()
        runs.wait_phase(name, "Running", timeout=90)
        pods = runs.pods(name)
        assert len(pods) == workers + 1
        for pod, uid in before.items():
            assert pods[pod]["metadata"]["uid"] == uid, f"{pod} was recreated"
        assert {o["spec"]["containers"][0]["image"] for o in pods.values()} == {"localhost/mlbench/mlbench-runner:test"}

        operator.stop(kill=True)
        runs.finish_launcher(name, 0, factories.summary(name, world_size=workers).termination_message())
        time.sleep(1)
        assert runs.status(name)["phase"] == "Running"  # nobody is watching
        operator.start()
        status = runs.wait_phase(name, "Succeeded", timeout=60)
        assert status["restarts"] == 0
        assert status["result"]["worldSize"] == workers
    finally:
        if operator.proc is None:
            operator.start()
        runs.kubectl("delete", "benchmarktask", task["metadata"]["name"], "--wait=false", check=False)


def test_a_restart_reads_a_running_runs_objects_and_writes_none_of_them(runs: Runs, operator: OperatorProcess) -> None:
    """A restarted operator resumes an unfinished run with reads: its ssh Secret, hostfile ConfigMap and
    NetworkPolicy are read and reused, not generated again and created (no POST answered 409 for each run,
    counted in mlbench_operator_api_requests_total), and they are the same objects afterwards."""
    name = "reuse"
    runs.apply(h.run(name, workers=2))
    runs.wait_phase(name, "Running")
    kept = {"secret": f"{name}-ssh", "configmap": f"{name}-config", "networkpolicy": name}

    def identity() -> dict[str, tuple[str, str]]:
        out = {}
        for kind, obj_name in kept.items():
            obj = runs.get(kind, obj_name)
            assert obj is not None, f"{kind} {obj_name} is gone"
            out[kind] = (obj["metadata"]["uid"], obj["metadata"]["resourceVersion"])
        return out

    before = identity()
    operator.stop(kill=True)
    operator.start()
    resources = ("secrets", "configmaps", "networkpolicies")

    def looked() -> bool:  # the resumed daemon's pass over the run's objects, whichever way it went
        return all(operator.metric("mlbench_operator_api_requests_total", resource=r) >= 1 for r in resources)

    wait_for(looked, timeout=60, what="the restarted operator's pass over the run's objects")
    time.sleep(1)  # a create that would follow the reads
    posts = {r: operator.metric("mlbench_operator_api_requests_total", verb="POST", resource=r) for r in resources}
    assert posts == dict.fromkeys(resources, 0.0), operator.log_tail(40)
    gets = {
        r: operator.metric("mlbench_operator_api_requests_total", verb="GET", resource=r, code="200") for r in resources
    }
    assert all(v >= 1 for v in gets.values()), gets
    assert identity() == before
    runs.finish_launcher(name, 0, factories.summary(name, world_size=2).termination_message())
    runs.wait_phase(name, "Succeeded", timeout=60)


def test_cleanup_interrupted_by_a_restart_is_finished(runs: Runs, operator: OperatorProcess) -> None:
    """The final status was written but the operator died before deleting the pods: the restarted
    operator finishes the cleanup from the cluster's state and leaves the result alone."""
    name = "halfclean"
    runs.apply(h.run(name, workers=2))
    runs.wait_phase(name, "Running")
    operator.stop(kill=True)
    try:
        runs.finish_launcher(name, 0, factories.summary(name, world_size=2).termination_message())
        wait_for(
            lambda: runs.pods(name)[f"{name}-launcher"]["status"].get("phase") == "Succeeded",
            timeout=30,
            what="launcher Succeeded",
        )
        final = {"status": {"phase": "Succeeded", "completionTime": runs.status(name)["startTime"]}}
        runs.kubectl("patch", "benchmarkrun", name, "--subresource=status", "--type=merge", "-p", json.dumps(final))
    finally:
        operator.start()
    wait_for(lambda: set(runs.pods(name)) == {f"{name}-launcher"}, timeout=30, what="workers cleaned up")
    wait_for(lambda: not runs.run(name)["metadata"].get("finalizers"), timeout=30, what="finalizer released")
    status = runs.status(name)
    assert status["phase"] == "Succeeded"
    assert status["restarts"] == 0
    assert status["workers"]["ready"] == 0


def test_clean_pod_policy_edited_after_the_run_finished_applies(runs: Runs) -> None:
    """cleanPodPolicy None keeps every pod; edited to All once the run has finished and its daemon has
    nothing left to do, the pods go (kopf never spawns again a daemon that returned on its own)."""
    name = "keepall"
    runs.apply(h.run(name, workers=2, runPolicy={"cleanPodPolicy": "None"}))
    runs.wait_phase(name, "Running")
    runs.finish_launcher(name, 0, factories.summary(name, world_size=2).termination_message())
    runs.wait_phase(name, "Succeeded")
    wait_for(lambda: not runs.run(name)["metadata"].get("finalizers"), timeout=30, what="finalizer released")
    assert set(runs.pods(name)) == {f"{name}-launcher", f"{name}-worker-0", f"{name}-worker-1"}
    runs.kubectl("patch", "benchmarkrun", name, "--type=merge", "-p", '{"spec":{"runPolicy":{"cleanPodPolicy":"All"}}}')
    wait_for(lambda: not runs.pods(name), timeout=30, what="the kept pods deleted after the edit")
    assert runs.status(name)["phase"] == "Succeeded"


def _running_runs(runs: Runs) -> int:
    """This session's runs in phase Running, in every namespace (what the package's operator watches)."""
    listed = runs.cluster.kubectl(
        "get", "benchmarkruns", "-A", "-l", f"{SESSION_LABEL}={SESSION}", "-o", "json", check=True
    ).stdout
    return sum(1 for item in json.loads(listed)["items"] if (item.get("status") or {}).get("phase") == "Running")


def test_scale_256_workers_ready(runs: Runs, operator: OperatorProcess) -> None:
    name = "wide"
    before = operator.metric("mlbench_operator_api_requests_total")
    ready_before = operator.metric("mlbench_operator_workers_ready_seconds_count")
    start = time.monotonic()
    runs.apply(h.run(name, workers=256, resources={"cpu": "10m", "memory": "16Mi"}))
    runs.wait_status(name, lambda s: (s.get("workers") or {}).get("ready") == 256, timeout=240, what="256 ready")
    elapsed = time.monotonic() - start
    runs.wait_phase(name, "Running", timeout=60)
    assert len(runs.pods(name)) == 257
    # the operator is shared by the package's tests: this run's own observation, and the gauge as the runs are
    assert operator.metric("mlbench_operator_workers_ready_seconds_count") == ready_before + 1
    wait_for(
        lambda: operator.metric("mlbench_operator_runs", phase="Running") == _running_runs(runs),
        timeout=30,
        what="mlbench_operator_runs{phase=Running} counts the Running runs",
    )
    requests = operator.metric("mlbench_operator_api_requests_total") - before
    # one create per pod plus a bounded number of status writes: coalescing works
    assert requests < 256 + 1 + 60, requests
    print(f"256 workers ready in {elapsed:.1f}s with {requests:.0f} operator API requests")


def test_runs_outside_the_selector_are_left_alone(runs: Runs) -> None:
    """--selector: the operator ignores runs without its label (here: another session's run)."""
    body = h.run("foreign", runs.ns)
    runs.kubectl("apply", "-f", "-", input=json.dumps(body))  # no session label
    runs.apply(h.run("mine", workers=1))
    runs.wait_phase("mine", "Running")
    assert runs.status("foreign") == {}
    assert runs.pods("foreign") == {}
    assert not runs.run("foreign")["metadata"].get("finalizers")


def test_many_runs_created_and_resumed_together(runs: Runs, operator: OperatorProcess) -> None:
    """24 runs applied at once, then the operator killed and restarted so that every daemon resumes
    together: each fan-out (pod creates, deletes) waits on the API pool without holding a thread of
    it, so 24 concurrent fan-outs on a 16-thread pool cannot deadlock (issue 10)."""
    names = [f"crowd-{i}" for i in range(24)]
    docs = []
    for name in names:
        body = h.run(name, workers=3, resources={"cpu": "10m", "memory": "16Mi"})
        body["metadata"] = {**body["metadata"], "namespace": runs.ns, "labels": {SESSION_LABEL: SESSION}}
        docs.append(body)
    runs.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    wait_for(lambda: len(runs.pods(names[-1])) >= 1, timeout=60, interval=0.1, what="the last run started")
    operator.stop(kill=True)
    operator.start()
    for name in names:
        runs.wait_phase(name, "Running", timeout=180)
    counts = {name: len(runs.pods(name)) for name in names}
    assert counts == dict.fromkeys(names, 4), counts  # 3 workers + launcher each, none duplicated
    for name in names:
        runs.finish_launcher(name, 0, factories.summary(name, world_size=3).termination_message())
    for name in names:
        runs.wait_phase(name, "Succeeded", timeout=120)


def test_a_quota_on_the_run_s_secret_is_shown_then_overcome(runs: Runs) -> None:
    """A ResourceQuota refuses the run's SSH Secret (403): the run says so in WorkersReady instead of
    retrying silently, and proceeds on its own once the quota is lifted (issue 10)."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-secrets"},
        "spec": {"hard": {"secrets": "0"}},
    }
    runs.kubectl("apply", "-f", "-", input=json.dumps(quota))
    try:
        wait_for(
            lambda: (runs.get("resourcequota", "no-secrets") or {}).get("status", {}).get("hard"),
            timeout=30,
            what="the quota is enforced",
        )
        runs.apply(h.run("quota", workers=1))
        status = runs.wait_status(
            "quota",
            lambda s: (
                any(
                    cnd.get("reason") == "CreateFailed" and "Secret quota-ssh" in cnd.get("message", "")
                    for cnd in s.get("conditions") or []
                )
                and s
            ),
            timeout=30,
            what="CreateFailed naming the Secret",
        )
        assert "exceeded quota" in status["message"]
        assert runs.pods("quota") == {}
    finally:
        runs.kubectl("delete", "resourcequota", "no-secrets", "--wait=true")
    runs.wait_phase("quota", "Running", timeout=90)


def _event_reasons(runs: Runs, name: str) -> set[str]:
    out = runs.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout
    return {e["reason"] for e in json.loads(out)["items"]}


def test_startup_deadline_releases_an_unschedulable_world_retries_then_fails(runs: Runs) -> None:
    """A worker no node can take (a nodeSelector no kwok node carries): at startupDeadlineSeconds the attempt's
    pods are deleted and the scheduler's words recorded, the next attempt comes after the backoff, and once
    startupRetries are spent the run fails StartupDeadlineExceeded with nothing left holding a node."""
    name = "nostart"
    key = f"mlbench-test-{uuid.uuid4().hex[:6]}"
    policy = {"startupDeadlineSeconds": 5, "startupBackoffSeconds": 3, "startupRetries": 1, "maxRestarts": 0}
    runs.apply(h.run(name, workers=2, scheduling={"nodeSelector": {key: "yes"}}, runPolicy=policy))
    status = runs.wait_status(name, lambda s: s.get("startupTimeouts") == 1 and s, timeout=60, what="released")
    restarted = cond(status, "Restarted")
    assert (restarted["status"], restarted["reason"]) == ("True", "StartupDeadlineExceeded")
    assert "Unschedulable: " in restarted["message"], restarted["message"]  # the scheduler's own words follow
    assert "startupDeadlineSeconds=5" in restarted["message"]
    assert status["restarts"] == 1
    assert status["startupRetryAt"]
    wait_for(
        lambda: all(p["metadata"]["labels"]["mlbench.io/attempt"] == "1" for p in runs.pods(name).values()),
        timeout=30,
        what="the first attempt's pods gone",
    )
    # the retry: a new attempt after the backoff, not counted against maxRestarts=0
    wait_for(lambda: len(runs.pods(name)) == 2, timeout=30, what="the second attempt's workers")
    status = runs.wait_phase(name, "Failed", timeout=60)
    failed = cond(status, "Failed")
    assert failed["reason"] == "StartupDeadlineExceeded"
    assert "Unschedulable: 2" in failed["message"]
    assert "gave up after 1 of startupRetries=1" in failed["message"]
    assert status["restarts"] == 1
    wait_for(lambda: not runs.pods(name), timeout=30, what="every pod released")
    wait_for(lambda: "StartupDeadlineExceeded" in _event_reasons(runs, name), timeout=20, what="the Event")


def test_startup_deadline_spares_a_run_that_starts_in_time(runs: Runs) -> None:
    """A world that starts within the deadline runs on past it, untouched."""
    name = "intime"
    runs.apply(h.run(name, workers=2, runPolicy={"startupDeadlineSeconds": 20}))
    runs.wait_phase(name, "Running", timeout=20)
    uids = {p: o["metadata"]["uid"] for p, o in runs.pods(name).items()}
    created = min(o["metadata"]["creationTimestamp"] for o in runs.pods(name).values())
    since = c.parse_time(created)
    assert since is not None
    time.sleep(max(22 - (time.time() - since.timestamp()), 0))  # past the deadline
    status = runs.status(name)
    assert (status["phase"], status.get("restarts"), status.get("startupTimeouts")) == ("Running", 0, None)
    assert {p: o["metadata"]["uid"] for p, o in runs.pods(name).items()} == uids
    assert "StartupDeadlineExceeded" not in _event_reasons(runs, name)
