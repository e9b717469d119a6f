"""The kopf glue's own pieces that need no cluster: progress scraping, wake-ups."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import types
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from mlbench_api import bundle
from mlbench_api.results import RunSummary
from tests import factories
from tests.operator import helpers as h


def results_line(summary: RunSummary) -> str:
    """The launcher's last line for ``summary`` (see mlbench_runner.pod.collect)."""
    return bundle.results_line(bundle.fit({bundle.SUMMARY: summary.model_dump_json(by_alias=True).encode()}))


def test_timer_copies_rank0_metrics_into_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer's scrape against a real HTTP endpoint (a rank 0 stand-in on loopback)."""
    from prometheus_client import start_http_server

    from mlbench_operator.podview import PodView
    from mlbench_operator.run import handlers as run_handlers

    reg = CollectorRegistry()
    Gauge("mlbench_epoch", "e", registry=reg).set(7.25)
    Gauge("mlbench_accuracy", "a", registry=reg).set(0.61)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        monkeypatch.setattr(run_handlers, "PROGRESS_PORT", port)
        rank0 = PodView(name="r-worker-0", role="worker", rank=0, attempt=0, ip="127.0.0.1", owner_uid="u1")
        index = _memo({("ns", "r"): [rank0]}).pods
        value = asyncio.run(run_handlers.scrape_rank0("ns", "r", index, "u1", 0))
        assert value is not None
        assert value["epoch"] == 7.25
        assert value["lastAccuracy"] == 0.61
        # unreachable (another port) or no rank 0 yet: no progress, nothing raises
        assert asyncio.run(run_handlers.scrape_rank0("ns", "other", index, "u1", 0)) is None
        # not this run's pod (a deleted run of the same name), or not the current attempt: not read
        assert asyncio.run(run_handlers.scrape_rank0("ns", "r", index, "u2", 0)) is None
        assert asyncio.run(run_handlers.scrape_rank0("ns", "r", index, "u1", 1)) is None
        monkeypatch.setattr(run_handlers, "PROGRESS_PORT", 1)
        assert asyncio.run(run_handlers.scrape_rank0("ns", "r", index, "u1", 0)) is None
    finally:
        server.shutdown()
        thread.join(timeout=5)


def test_wakeups_survive_a_recreated_run() -> None:
    """Two daemons for one name (old run finishing, new run starting): each keeps its own wake-up."""
    from mlbench_operator.runtime import Wakeups

    async def scenario() -> None:
        w = Wakeups()
        old, new = w.register(("ns", "r")), w.register(("ns", "r"))
        w.unregister(("ns", "r"), old)
        w.wake(("ns", "r"))
        assert new.is_set()
        assert not old.is_set()

    asyncio.run(scenario())


def _memo(pods: dict[tuple[str, str], list[Any]]) -> Any:
    """A memo whose ``pods`` index (as PodWatch fills it) holds these pods by run."""
    from mlbench_operator.podview import PodChange, PodIndex

    index = PodIndex()
    for key, views in pods.items():
        for view in views:
            index.update(PodChange(view.uid or view.name, key, view))
    return types.SimpleNamespace(pods=index)


# -- RunReconciler against a fake API: ordering of writes and deletes ----------------------------------------
class FakeKube:
    """Records the reconciler's API calls; ``kube.run(fn, *args)`` calls fn inline."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_deletes = 0  # the next N pod deletions fail with HTTP 500
        self.create_error: Any = None  # raised for every pod create
        self.object_errors: dict[str, Any] = {}  # kind -> error for the run's Service/ConfigMap/Secret
        self.existing: dict[tuple[str, str], dict[str, Any]] = {}  # (kind, name) -> object: 409 on create
        self.vanishing: set[tuple[str, str]] = set()  # 409 on create, then gone when read (garbage collected)
        self.log = ""  # the launcher's log
        self.log_error: Any = None  # raised by read_log
        self.refuse_status: Any = None  # predicate on a status patch: True -> HTTP 422
        self.created: list[dict[str, Any]] = []  # every object asked for, as sent
        self.versions: list[str] = []  # the resourceVersion each status patch was made at
        self.live: dict[str, Any] | None = None  # the run in the API server: status patches fenced by its version

    async def run(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    def patch_run_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str = "") -> str:
        from mlbench_operator.kube import ApiError

        self.calls.append(("patch", status))
        self.versions.append(resource_version)
        if self.refuse_status is not None and self.refuse_status(status):
            raise ApiError(422, "PATCH", "/status", '{"message": "status.result.worldSize: Invalid value"}')
        if self.live is None:
            return ""
        meta = self.live["metadata"]
        if resource_version and resource_version != meta["resourceVersion"]:  # the API server's precondition
            raise ApiError(409, "PATCH", "/status", '{"reason": "Conflict", "message": "the object has been modified"}')
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self.live["status"] = {k: v for k, v in {**self.live["status"], **status}.items() if v is not None}
        return str(meta["resourceVersion"])

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get_run", name))
        return None if self.live is None else {**self.live, "status": dict(self.live["status"])}

    async def delete_pods_named(
        self, namespace: str, names: Any, grace: int | None = None, uids: dict[str, str] | None = None
    ) -> None:
        self.calls.append(("delete", sorted(names), grace))
        if uids is not None:
            self.calls.append(("delete_uids", dict(uids)))
        if self.fail_deletes:
            self.fail_deletes -= 1
            from mlbench_operator.kube import ApiError

            raise ApiError(500, "DELETE", "/pods", '{"message": "etcd timeout"}')

    async def create_many(self, objs: list[dict[str, Any]]) -> list[Any]:
        return self.create_many_now(objs)

    def create_many_now(self, objs: list[dict[str, Any]]) -> list[Any]:
        out: list[Any] = []
        for obj in objs:
            self.calls.append(("create", obj["kind"], obj["metadata"]["name"]))
            self.created.append(obj)
            if obj["kind"] == "Pod" and self.create_error is not None:
                out.append(self.create_error)
            elif obj["kind"] in self.object_errors:
                out.append(self.object_errors[obj["kind"]])
            else:
                key = (obj["kind"], obj["metadata"]["name"])
                out.append(key not in self.existing and key not in self.vanishing)
        return out

    def create(self, obj: dict[str, Any]) -> bool:
        return bool(self.create_many_now([obj])[0])

    def read_log(self, namespace: str, pod: str, container: str, tail_lines: int, limit_bytes: int) -> str:
        self.calls.append(("read_log", pod, container))
        if self.log_error is not None:
            raise self.log_error
        return self.log.encode()[:limit_bytes].decode(errors="replace")  # the API server's limitBytes

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", kind, name))
        return self.existing.get((kind, name))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get_pod", name))
        return self.existing.get(("Pod", name))

    def patches(self) -> list[dict[str, Any]]:
        return [call[1] for call in self.calls if call[0] == "patch"]


def ours(run: str = "r1", uid: str = "uid-r1", **labels: str) -> dict[str, Any]:
    """An object as the operator creates it for run ``run``: controller ownerReference and labels."""
    from mlbench_operator import naming as n

    ref = {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkRun", "name": run, "uid": uid, "controller": True}
    return {
        "metadata": {
            "ownerReferences": [ref],
            "labels": {n.LABEL_RUN: run, n.LABEL_MANAGED_BY: n.MANAGER, **labels},
        }
    }


def _reconciler(
    body: dict[str, Any], kube: FakeKube, monkeypatch: pytest.MonkeyPatch, ensured: bool = True, config: Any = None
) -> Any:
    from mlbench_operator.run import executor

    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(executor.RunReconciler, "event", lambda self, *e: events.append(e))
    rec = executor.RunReconciler(body, kube, None, config)  # type: ignore[arg-type]
    setattr(rec, "events", events)  # noqa: B010 - a test-only attribute
    rec.ensured = ensured  # Service/ConfigMap/Secret: only where a test is about them
    return rec


def _running(policy: str = "All", **spec: Any) -> tuple[dict[str, Any], Any, list[Any]]:
    from mlbench_operator import runpods
    from tests.operator.test_reconcile import admitted, pod, step, workers

    body, ctx = admitted(h.run(runPolicy={"cleanPodPolicy": policy}, **spec))
    pods = [*workers(ctx), pod(runpods.launcher_pod(ctx, 0))]
    body, plan = step(body, ctx, pods)
    assert plan.status["phase"] == "Running"
    return body, ctx, pods


def test_final_status_is_written_before_cleanup_and_cleanup_is_redriven(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 1: the result is recorded first; a failed cleanup is finished by the next pass or
    by a restarted operator, and the run is never re-planned (no LauncherLost restart)."""
    from mlbench_operator import runpods
    from tests.operator.test_reconcile import terminated, workers

    body, ctx, _ = _running("All")
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    kube = FakeKube()
    kube.fail_deletes = 1
    kube.log = "some output\n" + results_line(factories.summary()) + "\n"
    rec = _reconciler(body, kube, monkeypatch)
    with pytest.raises(Exception, match="etcd timeout"):
        asyncio.run(rec.step([*workers(ctx), done]))
    assert kube.calls[0][0] == "patch", kube.calls
    assert kube.calls[0][1]["phase"] == "Succeeded"
    assert kube.calls[0][1]["result"]["goalReached"] is True
    # the results are kept before the cleanup may delete the launcher (cleanPodPolicy All), the attempt
    # recorded before the log is read
    assert kube.calls[1] == ("patch", {"results": {"attempts": 1}})
    assert kube.calls[2] == ("read_log", "r1-launcher", "launcher")
    assert kube.calls[3] == ("create", "ConfigMap", "r1-results")
    assert kube.calls[4][0] == "patch"
    assert kube.calls[4][1]["results"]["configMap"] == "r1-results"
    assert kube.calls[4][1]["results"]["attempts"] is None  # ended
    assert kube.calls[5] == ("delete", ["r1-launcher", "r1-worker-0", "r1-worker-1"], None)

    # Retried in the same process before the watch echoed the final status: not re-planned.
    rec.recover(body["status"])
    assert rec.status["phase"] == "Succeeded"

    # The operator restarts; the launcher's delete had gone through, the workers' had not.
    finished = {**body, "status": {**body["status"], **kube.calls[0][1], **kube.calls[4][1]}}
    kube2 = FakeKube()
    rec2 = _reconciler(finished, kube2, monkeypatch)
    assert asyncio.run(rec2.step(workers(ctx))) is None
    assert kube2.calls[0] == ("delete", ["r1-worker-0", "r1-worker-1"], None)
    closing = kube2.patches()
    assert len(closing) == 1
    assert "phase" not in closing[0]
    assert "restarts" not in closing[0]
    assert closing[0]["workers"] == {"ready": 0, "total": 2}


def test_a_restart_is_announced_and_counted_once_even_when_its_deletes_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The restart is recorded by the status write; the Event and the counter go with it. A failed delete
    after it must not lose them (the retry plans from the new status: "waiting for the old pods", not a
    restart), and the retry's deletes of the same stale pods are not another restart."""
    from mlbench_operator import metrics as m
    from mlbench_operator import runpods
    from tests.operator.test_reconcile import admitted, pod, terminated, workers

    body, ctx = admitted(h.run())
    oom = terminated(runpods.worker_pod(ctx, 1, 0), 137, reason="OOMKilled")
    pods = [workers(ctx)[0], oom, pod(runpods.launcher_pod(ctx, 0))]
    kube = FakeKube()
    kube.fail_deletes = 1
    rec = _reconciler(body, kube, monkeypatch)
    before = m.RESTARTS._value.get()
    with pytest.raises(Exception, match="etcd timeout"):
        asyncio.run(rec.step(pods))
    assert kube.patches()[0]["restarts"] == 1
    assert [e[:2] for e in rec.events] == [("Warning", "Restarting")]
    assert m.RESTARTS._value.get() == before + 1
    rec.recover(body["status"])  # as the daemon does after a failed pass; the watch has not echoed restarts 1 yet
    assert rec.status["restarts"] == 1
    asyncio.run(rec.step(pods))
    assert [call[0] for call in kube.calls].count("delete") == 2  # the retry deleted them
    assert [e[:2] for e in rec.events] == [("Warning", "Restarting")]
    assert m.RESTARTS._value.get() == before + 1


def test_config_rebuild_error_fails_and_cleans_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 6: an unbuildable config ends the run Failed, then the raw cleanPodPolicy applies."""
    body, _ctx, pods = _running("Running")
    body["status"]["restarts"] = 1
    body["status"]["taskSnapshot"] = {"division": "closed", "bogus": True}
    pods = [dataclasses.replace(p, attempt=1) for p in pods]
    kube = FakeKube()
    rec = _reconciler(body, kube, monkeypatch)
    delay = asyncio.run(rec.step(pods))
    assert kube.calls[0][0] == "patch"
    st = kube.calls[0][1]
    assert st["phase"] == "Failed"
    assert "restarts" not in st  # kept (1), not reset
    # the launcher still runs: it (and worker 0, whose files it reads) get a while to print the results
    assert kube.calls[1] == ("delete", ["r1-worker-1"], None)
    assert delay is not None
    assert 0 < delay <= 61


@pytest.mark.parametrize("code", [429, 500, 503, None])
def test_pod_creates_failing_with_429_or_5xx_back_off(monkeypatch: pytest.MonkeyPatch, code: int | None) -> None:
    """An overloaded API server is not hammered every debounce window: a pod event that wakes the run early
    does not retry the creates before the backoff (5 s, doubling) ends. No answer (None: a timeout) is one too."""
    import kopf

    from mlbench_operator.kube import ApiError
    from tests.operator.test_reconcile import admitted

    body, _ = admitted(h.run())
    kube = FakeKube()
    kube.create_error = (
        TimeoutError("timed out") if code is None else ApiError(code, "POST", "/pods", '{"message": "try again later"}')
    )
    rec = _reconciler(body, kube, monkeypatch)
    with pytest.raises(kopf.TemporaryError) as info:
        asyncio.run(rec.step([]))
    assert info.value.delay is not None
    assert info.value.delay >= 5
    creates = len([call for call in kube.calls if call[0] == "create"])
    again = asyncio.run(rec.step([]))  # woken by a pod event 0.3 s later
    assert again is not None
    assert 0 < again <= info.value.delay + 0.2
    assert len([call for call in kube.calls if call[0] == "create"]) == creates
    rec.pacing.create_backoff_until = 0.0  # the backoff has ended
    with pytest.raises(kopf.TemporaryError) as second:  # the next failure waits longer
        asyncio.run(rec.step([]))
    assert second.value.delay == 2 * info.value.delay


class SlowSlotKube(FakeKube):
    """Each pod create waits ``wait`` seconds (of ``clock``) for a fair create slot before it is answered."""

    def __init__(self, clock: list[float], wait: float) -> None:
        super().__init__()
        self.clock, self.wait = clock, wait

    async def create_many(self, objs: list[dict[str, Any]]) -> list[Any]:
        if any(obj["kind"] == "Pod" for obj in objs):
            self.clock[0] += self.wait
        return self.create_many_now(objs)


def test_a_create_that_waited_long_for_its_slot_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33's tenant load (2050 pod POSTs for 1050 pods): the create grace was stamped when the pass planned,
    so creates answered after a 45 s wait for a fair slot had no grace left, and the next pass (woken before the
    lagging watch showed the pods) asked for every one of them again (each answered 409)."""
    from mlbench_operator.run import creating, executor
    from tests.operator.test_reconcile import admitted

    clock = [1000.0]
    fake_time = types.SimpleNamespace(monotonic=lambda: clock[0])
    monkeypatch.setattr(creating, "time", fake_time)
    monkeypatch.setattr(executor, "time", fake_time)
    body, _ = admitted(h.run())
    kube = SlowSlotKube(clock, wait=45.0)
    rec = _reconciler(body, kube, monkeypatch)

    def pod_creates() -> list[str]:
        return [call[2] for call in kube.calls if call[:2] == ("create", "Pod")]

    asyncio.run(rec.step([]))
    assert pod_creates() == ["r1-worker-0", "r1-worker-1"]
    clock[0] += 1.0  # the next pass, woken by the run's own status event; the watch has shown no pod yet
    asyncio.run(rec.step([]))
    assert pod_creates() == ["r1-worker-0", "r1-worker-1"]
    clock[0] += 30.0  # 31 s after the answer and still not shown: the creates were lost, asked again
    asyncio.run(rec.step([]))
    assert pod_creates() == ["r1-worker-0", "r1-worker-1"] * 2


@pytest.mark.parametrize(("code", "terminal"), [(403, False), (422, True)])
def test_refused_pod_creates_are_visible(monkeypatch: pytest.MonkeyPatch, code: int, terminal: bool) -> None:
    """Defect 5: 403/422 from a pod create -> condition + Warning Event; 422 fails, 403 backs off."""
    from mlbench_operator.kube import ApiError
    from tests.operator.test_reconcile import admitted

    body, _ = admitted(h.run())
    kube = FakeKube()
    kube.create_error = ApiError(code, "POST", "/pods", '{"message": "pods \\"r1-worker-0\\" is forbidden: quota"}')
    rec = _reconciler(body, kube, monkeypatch)
    delay = asyncio.run(rec.step([]))
    last = next(p for p in reversed(kube.patches()) if "phase" in p or "conditions" in p)
    conds = {c["type"]: c for c in rec.status["conditions"]}
    assert "forbidden: quota" in rec.status["message"]
    assert any(e[1] in ("CreateFailed", "Failed") and "forbidden" in e[2] for e in rec.events)
    if terminal:
        assert last["phase"] == "Failed"
        assert conds["Failed"]["reason"] == "CreateFailed"
        assert delay is None
    else:
        assert rec.status["phase"] == "Pending"
        assert conds["WorkersReady"]["reason"] == "CreateFailed"
        assert delay is not None
        assert delay >= 5
        creates = len([call for call in kube.calls if call[0] == "create"])
        again = asyncio.run(rec.step([]))  # e.g. woken by a pod event: still backing off, no create storm
        assert again is not None
        assert 0 < again <= delay + 0.2
        assert len([call for call in kube.calls if call[0] == "create"]) == creates
        assert {c["type"]: c for c in rec.status["conditions"]}["WorkersReady"]["reason"] == "CreateFailed"


@pytest.mark.multiproc
def test_the_reconciler_is_configured_by_its_config_not_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """memo.config (here given directly) decides the runner UID, the scrapers and the resync; the
    environment, read once at start-up, is not read again."""
    from mlbench_operator.settings import OperatorConfig
    from tests.operator.test_reconcile import admitted

    monkeypatch.setenv("MLBENCH_RUNNER_UID", "1")
    monkeypatch.setenv("MLBENCH_METRICS_NAMESPACES", "from-env")
    monkeypatch.setenv("MLBENCH_RESYNC_SECONDS", "900")
    config = OperatorConfig(runner_uid=4242, scraper_namespaces=("scrapers",), resync_seconds=7.0)
    body, _ = admitted(h.run())
    kube = FakeKube()
    rec = _reconciler(body, kube, monkeypatch, ensured=False, config=config)
    delay = asyncio.run(rec.step([]))
    assert delay is not None
    assert 0 < delay <= 7.0
    made = {(o["kind"], o["metadata"]["name"]): o for o in kube.created}
    ingress = made[("NetworkPolicy", "r1")]["spec"]["ingress"]
    assert ingress[1]["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == ["scrapers"]
    assert made[("Pod", "r1-worker-0")]["spec"]["securityContext"]["runAsUser"] == 4242
    # Woken again before the watch delivered the pods: the create grace holds (no 409 storm).
    pods = len([o for o in kube.created if o["kind"] == "Pod"])
    assert asyncio.run(rec.step([])) == 7.0  # the grace (30 s) is longer than this resync
    assert len([o for o in kube.created if o["kind"] == "Pod"]) == pods


@pytest.mark.multiproc
def test_foreign_config_map_is_a_name_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 8: a 409 on the run's ConfigMap that belongs to another owner is not adopted: no pod is created."""
    from tests.operator.test_reconcile import admitted

    body, _ = admitted(h.run())
    kube = FakeKube()
    kube.existing[("ConfigMap", "r1-config")] = {
        "metadata": {"ownerReferences": [{"uid": "uid-old", "controller": True}]}
    }
    rec = _reconciler(body, kube, monkeypatch, ensured=False)
    assert asyncio.run(rec.step([])) is not None
    assert not [call for call in kube.calls if call[:2] == ("create", "Pod")]
    wr = {c["type"]: c for c in rec.status["conditions"]}["WorkersReady"]
    assert wr["reason"] == "NameConflict"
    assert "uid-old" in wr["message"]
    # our own ConfigMap from an earlier pass (409 + our uid) is fine
    kube.existing[("ConfigMap", "r1-config")] = ours()
    asyncio.run(rec.step([]))
    assert [call for call in kube.calls if call[:2] == ("create", "Pod")]


@pytest.mark.multiproc
def test_an_object_gone_after_a_conflict_is_created_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run re-created under the same name: its ConfigMap's create meets the old run's (409), which the
    garbage collector deletes before it is read. It is nobody's: created on the next pass, not taken as
    this run's (the workers would wait on a missing volume for ever)."""
    import kopf

    from tests.operator.test_reconcile import admitted

    body, _ = admitted(h.run())
    kube = FakeKube()
    kube.vanishing.add(("ConfigMap", "r1-config"))
    rec = _reconciler(body, kube, monkeypatch, ensured=False)
    with pytest.raises(kopf.TemporaryError, match="ConfigMap r1-config vanished after a conflict"):
        asyncio.run(rec.step([]))
    assert not [call for call in kube.calls if call[:2] == ("create", "Pod")]
    assert not rec.ensured
    kube.vanishing.clear()
    kube.calls.clear()
    asyncio.run(rec.step([]))
    created = [call[1:] for call in kube.calls if call[0] == "create"]
    assert ("ConfigMap", "r1-config") in created
    assert ("Pod", "r1-worker-0") in created


@pytest.mark.multiproc
def test_service_comes_with_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """The headless Service is created once every worker is Ready, right before the launcher (not while
    the workers start: its endpoints would be rewritten at every worker's start), and only once."""
    from tests.operator.test_reconcile import admitted, workers

    body, ctx = admitted(h.run())
    kube = FakeKube()
    rec = _reconciler(body, kube, monkeypatch, ensured=False)
    asyncio.run(rec.step([]))
    kinds = [call[1] for call in kube.calls if call[0] == "create"]
    assert "Service" not in kinds
    assert kinds.count("Pod") == 2  # the workers; the ConfigMap, Secret and NetworkPolicy before them
    assert kinds.index("ConfigMap") < kinds.index("Pod")
    kube.calls.clear()
    asyncio.run(rec.step(workers(ctx, ready=False)))  # started, not Ready: still no Service
    assert not [call for call in kube.calls if call[0] == "create"]
    asyncio.run(rec.step(workers(ctx)))
    created = [call[1:] for call in kube.calls if call[0] == "create"]
    assert created == [("Service", "r1"), ("Pod", "r1-launcher")]
    kube.calls.clear()
    rec.pacing.recent.clear()  # as if the launcher's create was lost: asked again, the Service is not
    asyncio.run(rec.step(workers(ctx)))
    assert [call[1:] for call in kube.calls if call[0] == "create"] == [("Pod", "r1-launcher")]


def test_foreign_service_is_a_name_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 8: a 409 on the run's Service that belongs to another owner is not adopted: no launcher, and the
    status says why, without flapping back to "creating the launcher" at every pass."""
    from tests.operator.test_reconcile import admitted, workers

    body, ctx = admitted(h.run())
    kube = FakeKube()
    kube.existing[("Service", "r1")] = {"metadata": {"ownerReferences": [{"uid": "uid-old", "controller": True}]}}
    rec = _reconciler(body, kube, monkeypatch)
    assert asyncio.run(rec.step(workers(ctx))) is not None
    assert not [call for call in kube.calls if call[:2] == ("create", "Pod")]
    wr = {c["type"]: c for c in rec.status["conditions"]}["WorkersReady"]
    assert wr["reason"] == "NameConflict"
    assert "uid-old" in wr["message"]
    patches = len(kube.patches())
    asyncio.run(rec.step(workers(ctx)))  # still there: nothing new to say
    assert len(kube.patches()) == patches
    # our own Service from an earlier pass (409 + our uid) is fine
    kube.existing[("Service", "r1")] = ours()
    asyncio.run(rec.step(workers(ctx)))
    assert [call for call in kube.calls if call[:2] == ("create", "Pod")] == [("create", "Pod", "r1-launcher")]


def test_stuck_terminating_pods_are_force_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 7: the handler executes the plan's force deletions with gracePeriodSeconds=0."""
    from tests.operator.test_reconcile import admitted, workers

    body, ctx = admitted(h.run(runPolicy={"maxRestarts": 2}))
    body["status"]["restarts"] = 1
    stale = [dataclasses.replace(p, terminating=True, deletion_timestamp="2000-01-01T00:00:00Z") for p in workers(ctx)]
    kube = FakeKube()
    rec = _reconciler(body, kube, monkeypatch)
    asyncio.run(rec.step(stale))
    assert ("delete", ["r1-worker-0", "r1-worker-1"], 0) in kube.calls


def test_ttl_set_after_the_run_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 9: TTL lives in its own daemon, whose filter matches once a finished run has a TTL."""
    from mlbench_operator.run import handlers as run_handlers

    waits: Any = run_handlers._waits_for_ttl
    finished = {"phase": "Succeeded", "completionTime": "2000-01-01T00:00:00Z"}
    assert not waits(status=finished, spec={})
    assert waits(status=finished, spec={"runPolicy": {"ttlSecondsAfterFinished": 5}})
    assert not waits(status={"phase": "Running"}, spec={"runPolicy": {"ttlSecondsAfterFinished": 5}})

    class Stopped:
        def __bool__(self) -> bool:
            return False

        async def wait(self, timeout: float | None = None) -> None:
            raise AssertionError("expired already: no waiting")

    kube = FakeKube()
    deleted: list[tuple[str, str]] = []
    kube.delete_run = lambda ns, name: deleted.append((ns, name))  # type: ignore[attr-defined]
    memo = type("Memo", (), {"kube": kube})()
    body = {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 5}}, "status": finished}
    fn: Any = getattr(run_handlers.expire_run, "__wrapped__", run_handlers.expire_run)
    asyncio.run(fn(body=body, namespace="ns", name="r1", memo=memo, stopped=Stopped()))
    assert deleted == [("ns", "r1")]


def test_daemon_filter_covers_pending_cleanup() -> None:
    """Defect 1 after a restart: a finished run with pods its policy wants gone gets a daemon again."""
    from mlbench_operator.run import handlers as run_handlers
    from mlbench_operator.run import lifecycle
    from tests.operator.test_reconcile import workers

    needs: Any = run_handlers._needs_daemon
    body, ctx, _ = _running("Running")
    finished = {**body, "status": {**body["status"], "phase": "Failed"}}
    index = _memo({("ns", "r1"): workers(ctx)})
    assert needs(body=finished, namespace="ns", name="r1", memo=index)
    terminating = [dataclasses.replace(p, terminating=True) for p in workers(ctx)]
    gone = _memo({("ns", "r1"): terminating})
    # deleted, but the status does not say so (the operator stopped before writing it): a daemon records it
    assert needs(body=finished, namespace="ns", name="r1", memo=gone)
    assert needs(body=finished, namespace="ns", name="r1", memo=_memo({}))  # workers.ready still says 2
    recorded = {**finished, "status": lifecycle.cleaned_up_status(finished, terminating, datetime.now(UTC))}
    assert not needs(body=recorded, namespace="ns", name="r1", memo=gone)
    assert not needs(body=recorded, namespace="ns", name="r1", memo=_memo({}))
    assert needs(body=body, namespace="ns", name="r1", memo=_memo({}))


@pytest.mark.parametrize("left", ["terminating workers", "the finished launcher only"])
def test_a_cleanup_the_operator_did_not_record_is_recorded_after_a_restart(
    monkeypatch: pytest.MonkeyPatch, left: str
) -> None:
    """It deleted the pods and stopped before the status write: workers.ready kept its count from before. Under
    Running (the default) the finished launcher stays, so "every pod gone" would not see it."""
    from mlbench_operator import runpods
    from mlbench_operator.run import handlers as run_handlers
    from mlbench_operator.run import lifecycle
    from tests.operator.test_reconcile import terminated, workers

    body, ctx, _ = _running("Running")
    finished = {**body, "status": {**body["status"], "phase": "Failed", "results": {"configMap": "r1-results"}}}
    assert finished["status"]["workers"]["ready"] == 2
    if left == "terminating workers":
        pods = [dataclasses.replace(p, terminating=True) for p in workers(ctx)]
    else:
        pods = [terminated(runpods.launcher_pod(ctx, 0), 1, "")]
    needs: Any = run_handlers._needs_daemon
    assert needs(body=finished, namespace="ns", name="r1", memo=_memo({("ns", "r1"): pods}))
    kube = FakeKube()
    rec = _reconciler(finished, kube, monkeypatch)
    asyncio.run(rec.step(pods))
    assert not [call for call in kube.calls if call[0] == "delete"]
    (closing,) = kube.patches()
    assert closing["workers"] == {"ready": 0, "total": 2}
    assert lifecycle.CLEANED_UP in {x["type"]: x for x in closing["conditions"]}["WorkersReady"]["message"]


class _Stopped:
    """kopf's DaemonStopped as the daemon uses it: falsy until set, and awaitable."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self.event.wait(), timeout)


@pytest.mark.multiproc
def test_a_finished_runs_daemon_waits_so_a_later_clean_pod_policy_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf never spawns again a daemon that returned on its own: a finished run's daemon with nothing left
    to do waits instead, so cleanPodPolicy None edited to All afterwards deletes the pods it kept."""
    from mlbench_operator import runtime
    from mlbench_operator.run import executor
    from mlbench_operator.run import handlers as run_handlers
    from mlbench_operator.settings import OperatorConfig

    body, _ctx, pods = _finished("None")
    kube = FakeKube()
    kube.log = results_line(factories.summary())
    monkeypatch.setattr(executor.RunReconciler, "event", lambda self, *e: None)  # kopf's, outside an operator
    memo = types.SimpleNamespace(
        kube=kube,
        wakeups=runtime.Wakeups(),
        pods=_memo({("ns", "r1"): pods}).pods,
        config=OperatorConfig(debounce_seconds=0.0),
    )
    daemon: Any = getattr(run_handlers.reconcile_run, "__wrapped__", run_handlers.reconcile_run)

    async def scenario() -> None:
        stopped = _Stopped()
        task = asyncio.ensure_future(
            daemon(body=body, namespace="ns", name="r1", memo=memo, logger=None, stopped=stopped)
        )
        for _ in range(100):
            await asyncio.sleep(0.01)
        assert kube.patches()[0]["phase"] == "Succeeded"
        assert not [c for c in kube.calls if c[0] == "delete"]  # None keeps every pod
        assert not task.done()  # nothing to do, and still there
        body["spec"]["runPolicy"]["cleanPodPolicy"] = "All"  # kopf's live body, as the edit arrives
        memo.wakeups.wake(("ns", "r1"))  # what run_event does on it
        for _ in range(100):
            await asyncio.sleep(0.01)
        assert [c[1] for c in kube.calls if c[0] == "delete"] == [["r1-launcher", "r1-worker-0", "r1-worker-1"]]
        # the index says so before the watch does: kopf's filter, on the status write's event, lets it go
        assert all(p.terminating for p in memo.pods.get(("ns", "r1")))
        written = {**body["status"]}
        for patch in kube.patches():
            written.update(patch)
        live = {**body, "status": written}  # as kopf's body is once the watch echoed the writes
        needs: Any = run_handlers._needs_daemon
        assert not needs(body=live, namespace="ns", name="r1", memo=memo)
        stopped.event.set()  # kopf stops it once _needs_daemon no longer holds
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())


def _finished(policy: str = "All") -> tuple[dict[str, Any], Any, list[Any]]:
    """A run whose launcher succeeded: the next pass writes Succeeded, then keeps results and cleans up."""
    from mlbench_operator import runpods
    from tests.operator.test_reconcile import terminated, workers

    body, ctx, _ = _running(policy)
    body["metadata"]["uid"] = ""  # the test pods carry no owner uid
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    return body, ctx, [*workers(ctx), done]


@pytest.mark.parametrize(
    ("status", "kept", "launcher_deleted"),
    [
        (500, False, False),  # kubelet unreachable: spared and retried
        (0, False, False),  # not even an answer (a timeout): the same, and the cleanup is not blocked
        (404, False, True),  # log gone: recorded, cleanup goes on
    ],
)
def test_unreadable_launcher_log(
    monkeypatch: pytest.MonkeyPatch, status: int, kept: bool, launcher_deleted: bool
) -> None:
    from mlbench_operator.kube import ApiError

    body, _ctx, pods = _finished("All")
    kube = FakeKube()
    boom = ApiError(status, "GET", "/log", '{"message": "boom"}')
    kube.log_error = boom if status else TimeoutError("read timed out")
    rec = _reconciler(body, kube, monkeypatch)
    delay = asyncio.run(rec.step(pods))
    deletes = [c[1] for c in kube.calls if c[0] == "delete"]
    assert ("r1-launcher" in deletes[0]) is launcher_deleted
    if launcher_deleted:
        assert rec.status["results"]["message"] == "the launcher's log is gone: boom"
        assert ("Warning", "ResultsNotKept", "the launcher's log is gone: boom") in rec.events
    else:
        assert set(rec.status["results"]) == {"failingSince", "attempts"}  # a retry in progress, not an outcome
        assert rec.status["results"]["attempts"] is None  # the attempt ended: not an interrupted one
        assert delay is not None
        assert delay <= 5.1


def test_the_results_retry_window_counts_from_the_first_failed_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator back after a long outage (the launcher finished 10 min ago): a transient error is retried
    for the window from the first failure, recorded in status.results.failingSince (so a restart keeps it)."""
    from datetime import UTC, datetime, timedelta

    from mlbench_operator.run import daemon

    body, _ctx, pods = _finished("All")
    start = (datetime.now(UTC) + timedelta(minutes=10)).replace(microsecond=0)  # back 10 min after the end
    monkeypatch.setattr(daemon, "clock", lambda: start)
    kube = FakeKube()
    kube.log_error = TimeoutError("read timed out")
    rec = _reconciler(body, kube, monkeypatch)
    asyncio.run(rec.step(pods))
    assert rec.status["phase"] == "Succeeded"
    since = rec.status["results"]["failingSince"]
    assert [p["results"] for p in kube.patches() if "results" in p] == [
        {"attempts": 1},
        {"failingSince": since, "attempts": None},
    ]
    assert not [e for e in rec.events if e[1] == "ResultsNotKept"]
    assert "r1-launcher" not in [c for call in kube.calls if call[0] == "delete" for c in call[1]]
    # an operator restarted 30 s later reads the same window from the status
    monkeypatch.setattr(daemon, "clock", lambda: start + timedelta(seconds=30))
    kube2 = FakeKube()
    kube2.log_error = TimeoutError("read timed out")
    rec2 = _reconciler({**body, "status": rec.status}, kube2, monkeypatch)
    asyncio.run(rec2.step(pods))
    assert rec2.status["results"] == {"failingSince": since, "attempts": None}
    # nothing new to record but the attempt, started and ended
    assert [p["results"] for p in kube2.patches()] == [
        {"failingSince": since, "attempts": 1},
        {"failingSince": since, "attempts": None},
    ]
    # 61 s after the first failure: given up, once, and the launcher may go
    monkeypatch.setattr(daemon, "clock", lambda: start + timedelta(seconds=61))
    asyncio.run(rec2.step(pods))
    message = rec2.status["results"]["message"]
    assert message == "cannot read the launcher's log (retried for 61s): TimeoutError: read timed out"
    assert rec2.status["results"]["failingSince"] == since
    assert ("Warning", "ResultsNotKept", message) in rec2.events
    # and once the log reads again within the window, the results are kept
    monkeypatch.setattr(daemon, "clock", lambda: start + timedelta(seconds=20))
    kube3 = FakeKube()
    kube3.log = results_line(factories.summary())
    rec3 = _reconciler({**body, "status": rec.status}, kube3, monkeypatch)
    asyncio.run(rec3.step(pods))
    assert rec3.status["results"]["configMap"] == "r1-results"


def test_a_refused_status_write_after_the_end_keeps_the_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 422 on status.results of a Succeeded run (a value the CRD refuses) does not turn it Failed/InvalidResult:
    the refusal is recorded in status.results, said honestly (not as an unreadable log), and the cleanup goes on."""
    import kopf

    body, _ctx, pods = _finished("All")
    kube = FakeKube()
    kube.log = results_line(factories.summary())
    kube.refuse_status = lambda st: "configMap" in (st.get("results") or {})
    rec = _reconciler(body, kube, monkeypatch)
    with pytest.raises(kopf.TemporaryError, match="the Succeeded run keeps its phase"):
        asyncio.run(rec.step(pods))
    assert all(p.get("phase") in (None, "Succeeded") for p in kube.patches())
    assert rec.status["phase"] == "Succeeded"
    message = rec.status["results"]["message"]
    assert message.startswith("the API server refused status.results (HTTP 422): ")
    assert "cannot read the launcher's log" not in message
    assert [e[1] for e in rec.events] == ["Succeeded", "StatusRefused"]  # no ResultsNotKept, no InvalidResult
    rec.recover(body["status"])
    kube.calls.clear()
    asyncio.run(rec.step(pods))  # the next pass: the cleanup, the log not read again
    assert not [c for c in kube.calls if c[0] == "read_log"]
    assert ("delete", ["r1-launcher", "r1-worker-0", "r1-worker-1"], None) in kube.calls
    assert rec.status["phase"] == "Succeeded"


@pytest.mark.multiproc
@pytest.mark.parametrize(("code", "terminal"), [(403, False), (422, True)])
def test_refused_run_objects_are_a_condition_not_a_silent_retry(
    monkeypatch: pytest.MonkeyPatch, code: int, terminal: bool
) -> None:
    """Issue 10: a quota (403) or an invalid object (422) on the Secret is shown with its cause."""
    from mlbench_operator.kube import ApiError
    from tests.operator.test_reconcile import admitted

    body, _ = admitted(h.run())
    kube = FakeKube()
    kube.object_errors["Secret"] = ApiError(code, "POST", "/secrets", '{"message": "exceeded quota: secrets=0"}')
    rec = _reconciler(body, kube, monkeypatch, ensured=False)
    delay = asyncio.run(rec.step([]))
    text = f"creating Secret r1-ssh was refused (HTTP {code}): exceeded quota: secrets=0"
    assert rec.status["message"] == text
    assert not [c for c in kube.calls if c[0] == "create" and c[1] == "Pod"]  # nothing runs without its Secret
    if terminal:
        assert rec.status["phase"] == "Failed"
        assert {c["type"]: c for c in rec.status["conditions"]}["Failed"]["reason"] == "CreateFailed"
    else:
        wr = {c["type"]: c for c in rec.status["conditions"]}["WorkersReady"]
        assert (wr["reason"], wr["message"]) == ("CreateFailed", text)
        assert delay is not None
        assert delay > 0
        assert ("Warning", "CreateFailed", text) in rec.events


def test_a_refused_results_config_map_is_recorded_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlbench_operator.kube import ApiError

    def refuse(obj: dict[str, Any]) -> bool:
        raise ApiError(413, "POST", "/configmaps", '{"message": "too large"}')

    body, _ctx, pods = _finished("All")
    kube = FakeKube()
    kube.log = results_line(factories.summary())
    kube.create = refuse  # type: ignore[method-assign]
    rec = _reconciler(body, kube, monkeypatch)
    asyncio.run(rec.step(pods))
    assert rec.status["results"]["message"] == "cannot create ConfigMap r1-results: too large"
    deletes = [c[1] for c in kube.calls if c[0] == "delete"]
    assert "r1-launcher" in deletes[0]


def test_results_are_collected_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted operator that finds status.results does not read the log again; a foreign
    ConfigMap of the same name is never overwritten."""
    body, _ctx, pods = _finished("Running")
    kube = FakeKube()
    kube.log = results_line(factories.summary())
    kube.existing[("ConfigMap", "r1-results")] = {"metadata": {"ownerReferences": [{"controller": True, "uid": "x"}]}}
    rec = _reconciler(body, kube, monkeypatch)
    asyncio.run(rec.step(pods))
    message = rec.status["results"]["message"]
    assert message.startswith("NameConflict: ConfigMap r1-results already exists and was not created by the operator")
    assert "(uid x)" in message
    again = FakeKube()
    rec2 = _reconciler({**body, "status": rec.status}, again, monkeypatch)
    asyncio.run(rec2.step(pods))
    assert not [c for c in again.calls if c[0] == "read_log"]


def test_a_status_the_api_server_refuses_fails_the_run_as_invalid_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 422 on the final status (a value the server cannot store) is not retried forever: a minimal
    Failed/InvalidResult status is written instead, and the next pass cleans up as for any failure."""
    import kopf

    from mlbench_operator import runpods
    from tests.operator.test_reconcile import terminated, workers

    body, ctx, _ = _running("All")
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    kube = FakeKube()
    kube.refuse_status = lambda st: "result" in st
    rec = _reconciler(body, kube, monkeypatch)
    with pytest.raises(kopf.TemporaryError, match="InvalidResult"):
        asyncio.run(rec.step([*workers(ctx), done]))
    refused, fallback = kube.patches()
    assert refused["phase"] == "Succeeded"
    assert fallback["phase"] == "Failed"
    assert "result" not in fallback
    assert {c["type"]: c for c in fallback["conditions"]}["Failed"]["reason"] == "InvalidResult"
    assert "worldSize" in fallback["message"]
    assert rec.status["phase"] == "Failed"
    assert [e[1] for e in rec.events] == ["InvalidResult"]
    rec.recover(body["status"])  # the loop's error path keeps our Failed status
    kube.calls.clear()
    asyncio.run(rec.step([*workers(ctx), done]))  # the next pass: cleanup, no new result write
    assert ("delete", ["r1-launcher", "r1-worker-0", "r1-worker-1"], None) in kube.calls
    assert all("result" not in p for p in kube.patches())


def test_a_gang_restart_keeps_the_failed_launchers_log_tail_in_an_event(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlbench_operator import runpods
    from tests.operator.test_reconcile import terminated, workers

    body, ctx, _ = _running("Running")
    failed = terminated(runpods.launcher_pod(ctx, 0), 1, '{"error":"mpirun exited with 1","exitCode":1}')
    kube = FakeKube()
    kube.log = "rank 1: loss nan\nORTE has lost communication with a remote daemon\n"
    rec = _reconciler(body, kube, monkeypatch)
    asyncio.run(rec.step([*workers(ctx), failed]))
    read = kube.calls.index(("read_log", "r1-launcher", "launcher"))
    delete = next(i for i, call in enumerate(kube.calls) if call[0] == "delete")
    assert read < delete  # read before the pod goes
    logged = [e for e in rec.events if e[1] == "LauncherLog"]
    assert len(logged) == 1
    assert logged[0][2].startswith("attempt 0 launcher log")
    assert "ORTE has lost communication" in logged[0][2]
    # a node that serves no logs (kwok) costs only the Event
    kube2 = FakeKube()
    kube2.log_error = RuntimeError("no logs here")
    rec2 = _reconciler(body, kube2, monkeypatch)
    asyncio.run(rec2.step([*workers(ctx), failed]))
    assert not [e for e in rec2.events if e[1] == "LauncherLog"]
    assert any(call[0] == "delete" for call in kube2.calls)


def test_a_cleared_progress_does_not_linger_in_the_reconcilers_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gang restart clears status.progress; a copy of the old attempt's, taken from the live body before the
    watch echoed the clear, must go once it has (or the new attempt is judged Stalled by it)."""
    from mlbench_operator import runpods
    from tests.operator.test_reconcile import terminated, workers

    body, ctx, pods = _running("Running")
    old = {"step": 42, "stepChangedAt": "2020-01-01T00:00:00Z"}
    body["status"] = {**body["status"], "progress": old}
    kube = FakeKube()
    rec = _reconciler(body, kube, monkeypatch)
    failed = [terminated(runpods.worker_pod(ctx, 0, 0), 1), *workers(ctx)[1:], pods[-1]]
    asyncio.run(rec.step(failed))
    assert rec.status["restarts"] == 1
    assert rec.status["progress"] is None  # cleared
    asyncio.run(rec.step(failed))  # the watch has not echoed it yet: the live body still has the old one
    stored = dict(body["status"])
    for written in kube.patches():  # the echo: what the API server stores (a merge patch's null deletes)
        stored.update(written)
    body["status"] = {k: v for k, v in stored.items() if v is not None}
    assert "progress" not in body["status"]
    asyncio.run(rec.step([]))
    assert "progress" not in rec.status


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("held", "doing"),
    [
        pytest.param("conflict", "its objects' names were held by another owner", id="a name held by another owner"),
        pytest.param("quota", "the creates of its objects were refused", id="a create refused (quota)"),
    ],
)
def test_the_deadline_ends_a_run_held_before_its_pods(monkeypatch: pytest.MonkeyPatch, held: str, doing: str) -> None:
    """activeDeadlineSeconds is decided by the plan, which a run whose objects cannot be created never reaches:
    without this, such a run (and the sweep slot it holds) waited for ever."""
    from mlbench_operator.kube import ApiError
    from tests.operator.test_reconcile import admitted

    body, _ = admitted(h.run(runPolicy={"activeDeadlineSeconds": 10}))  # admitted at T0, long past
    kube = FakeKube()
    if held == "conflict":
        kube.existing[("ConfigMap", "r1-config")] = {"metadata": {"ownerReferences": [{"uid": "uid-old"}]}}
    else:
        kube.object_errors["Secret"] = ApiError(403, "POST", "/secrets", '{"message": "exceeded quota: secrets=0"}')
    rec = _reconciler(body, kube, monkeypatch, ensured=False)
    asyncio.run(rec.step([]))
    message = f"the run exceeded runPolicy.activeDeadlineSeconds=10 while {doing}"
    assert rec.status["phase"] == "Failed"
    assert {c["type"]: c for c in rec.status["conditions"]}["Failed"]["reason"] == "DeadlineExceeded"
    assert rec.status["message"] == message
    assert ("Warning", "Failed", message) in rec.events
    assert not [call for call in kube.calls if call[:2] == ("create", "Pod")]


@pytest.mark.parametrize(
    ("polls", "resync", "seconds"),
    [
        (0, 60.0, 1.0),
        (1, 60.0, 2.0),
        (5, 60.0, 32.0),
        (6, 60.0, 60.0),
        (40, 60.0, 60.0),
        (3, 0.5, 1.0),
        (5000, 60.0, 60.0),
    ],
)
def test_an_expired_run_asks_a_silent_sweep_less_and_less_often(polls: int, resync: float, seconds: float) -> None:
    from mlbench_operator.run import handlers as run_handlers

    assert run_handlers.sweep_poll_seconds(polls, resync) == seconds


@pytest.mark.multiproc
def test_a_held_run_is_woken_when_its_deadline_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name conflict is looked at again after 30 s: sooner when the deadline passes first."""
    from tests.operator.test_reconcile import T0, admitted

    left = 7
    deadline = int((datetime.now(UTC) - T0).total_seconds()) + left
    body, _ = admitted(h.run(runPolicy={"activeDeadlineSeconds": deadline}))
    kube = FakeKube()
    kube.existing[("ConfigMap", "r1-config")] = {"metadata": {"ownerReferences": [{"uid": "uid-old"}]}}
    rec = _reconciler(body, kube, monkeypatch, ensured=False)
    delay = asyncio.run(rec.step([]))
    assert delay is not None
    assert 0 < delay <= left


@pytest.mark.parametrize(
    ("delay", "left", "expected"),
    [(30.0, None, 30.0), (30.0, 7.0, 7.0), (5.0, 7.0, 5.0), (30.0, -1.0, 0.0), (None, 7.0, None)],
)
def test_a_wait_is_no_longer_than_the_deadline(delay: float | None, left: float | None, expected: float | None) -> None:
    from mlbench_operator.run import lifecycle

    assert lifecycle.by_deadline(delay, left) == expected


def test_interrupted_collections_are_given_up_not_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: an operator killed while reading a launcher's log (a results bomb) must not read it again after
    every restart: each attempt is recorded before the read, and after MAX_COLLECT_ATTEMPTS unfinished ones the
    results are given up with the reason, the log left alone."""
    from mlbench_api.runstatus import MAX_COLLECT_ATTEMPTS

    body, _ctx, pods = _finished("All")
    kube = FakeKube()
    kube.log = results_line(factories.summary())
    status = {**body["status"], "phase": "Succeeded", "results": {"attempts": MAX_COLLECT_ATTEMPTS - 1}}
    rec = _reconciler({**body, "status": status}, kube, monkeypatch)

    class Killed(BaseException):  # the operator dies in the read: nothing after it runs
        pass

    def killed(*_args: Any) -> str:
        raise Killed

    kube.read_log = killed  # type: ignore[method-assign, assignment]
    with pytest.raises(Killed):
        asyncio.run(rec.step(pods))
    assert kube.patches()[-1]["results"] == {"attempts": MAX_COLLECT_ATTEMPTS}  # recorded before the read
    # the restarted operator reads the recorded count, and gives up
    again = FakeKube()
    again.log = kube.log
    restarted = {**body, "status": {**status, "results": {"attempts": MAX_COLLECT_ATTEMPTS}}}
    rec2 = _reconciler(restarted, again, monkeypatch)
    asyncio.run(rec2.step(pods))
    assert not [c for c in again.calls if c[0] == "read_log"]
    message = rec2.status["results"]["message"]
    assert message.startswith(f"collecting the results was started {MAX_COLLECT_ATTEMPTS} times and never ended")
    assert rec2.status["results"]["attempts"] is None
    assert ("Warning", "ResultsNotKept", message) in rec2.events


def test_at_most_two_collections_run_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: many runs ending together do not read and decompress their results all at once."""
    from mlbench_operator.run import results

    active, peak = 0, 0

    class SlowLogs(FakeKube):
        async def run(self, fn: Any, *args: Any) -> Any:
            nonlocal active, peak
            if fn != self.read_log:
                return fn(*args)
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.02)
            active -= 1
            return fn(*args)

    async def scenario() -> list[Any]:
        recs = []
        for _ in range(6):
            body, _ctx, pods = _finished("None")
            kube = SlowLogs()
            kube.log = results_line(factories.summary())
            recs.append((_reconciler(body, kube, monkeypatch), pods))
        await asyncio.gather(*(rec.step(pods) for rec, pods in recs))
        return [rec.status["results"] for rec, _ in recs]

    kept = asyncio.run(scenario())
    assert [r["configMap"] for r in kept] == ["r1-results"] * 6
    assert peak == results.MAX_CONCURRENT_COLLECTIONS == 2


@pytest.mark.parametrize("launcher", [False, True])
def test_an_unlabelled_pod_squatting_on_a_pods_name_is_a_name_conflict(
    monkeypatch: pytest.MonkeyPatch, launcher: bool
) -> None:
    """Issue 33: a pod without the operator's labels under a worker's (or the launcher's) name is invisible to the
    planner; its create's 409 is reported as NameConflict naming it, not retried every pass in silence."""
    from tests.operator.test_reconcile import admitted, workers

    body, ctx = admitted(h.run())
    name = "r1-launcher" if launcher else "r1-worker-1"
    kube = FakeKube()
    kube.existing[("Pod", name)] = {"metadata": {"name": name, "labels": {"app": "squatter"}}}
    rec = _reconciler(body, kube, monkeypatch)
    if launcher:
        rec.service_ensured = True
    pods = workers(ctx) if launcher else []
    assert asyncio.run(rec.step(pods)) is not None
    cond = {c["type"]: c for c in rec.status["conditions"]}["Running" if launcher else "WorkersReady"]
    assert cond["reason"] == "NameConflict"
    assert cond["message"] == (
        f"Pod {name} already exists and was not created by the operator for this run (it has no controller); "
        "waiting for it to be deleted"
    )
    assert ("Warning", "NameConflict", cond["message"]) in rec.events
    assert ("get_pod", name) in kube.calls  # by list: the operator may not get pods (RBAC)


def test_a_deposed_leaders_late_status_write_is_refused_and_the_run_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33 (fencing): a status write carries the resourceVersion it was computed from. The run changed
    since (the new leader wrote version 7; this replica planned from 5): the API server refuses it with 409,
    nothing of the stale pass lands, the run is read again and the next pass plans from that and writes at 7."""
    from mlbench_operator import runpods
    from mlbench_operator.runtime import StatusConflict
    from tests.operator.test_reconcile import terminated, workers

    body, ctx, _ = _running("All")
    body["metadata"]["resourceVersion"] = "5"
    done = terminated(runpods.launcher_pod(ctx, 0), 0, factories.summary().termination_message())
    kube = FakeKube()
    newer = {**body["status"], "message": "written by the new leader"}
    kube.live = {"metadata": {**body["metadata"], "resourceVersion": "7"}, "status": newer}
    rec = _reconciler(body, kube, monkeypatch)
    with pytest.raises(StatusConflict, match="resourceVersion 5 was refused"):
        asyncio.run(rec.step([*workers(ctx), done]))
    assert kube.versions == ["5"]
    assert kube.live["status"] == newer  # the stale write did not land
    assert ("get_run", "r1") in kube.calls
    rec.recover(body["status"])  # the daemon's error path: the run as read, not the watch's older copy
    assert rec.status == newer
    kube.calls.clear()
    asyncio.run(rec.step([*workers(ctx), done]))
    assert kube.versions[1] == "7"
    assert kube.live["status"]["phase"] == "Succeeded"


@pytest.mark.parametrize(
    ("known", "seen", "status", "ours", "expected"),
    [
        ("5", "5", {"phase": "Running"}, {"phase": "Running"}, "5"),
        # only metadata moved (a label, kopf's annotations): the watch's newer version is safe
        ("5", "6", {"phase": "Running"}, {"phase": "Running", "progress": None}, "6"),
        # the watch lags behind our own write: our write's version
        ("8", "7", {"phase": "Pending"}, {"phase": "Running"}, "8"),
        # someone else wrote the status (a new leader): ours, stale, so refused
        ("5", "9", {"phase": "Failed"}, {"phase": "Running"}, "5"),
        ("", "4", {"phase": "Failed"}, {"phase": "Running"}, "4"),  # nothing written yet
    ],
)
def test_fence_version(known: str, seen: str, status: dict[str, Any], ours: dict[str, Any], expected: str) -> None:
    from mlbench_operator.runtime import fence_version

    body = {"metadata": {"resourceVersion": seen}, "status": status}
    assert fence_version(known, body, ours) == expected


def test_a_run_status_patch_carries_its_resource_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client as k8s

    from mlbench_operator.kube import Kube

    kube = Kube(k8s.Configuration(), concurrency=1)
    sent: list[Any] = []

    def request(method: str, path: str, body: Any = None, **_kw: Any) -> dict[str, Any]:
        sent.append(body)
        return {"metadata": {"resourceVersion": "12"}}

    monkeypatch.setattr(kube, "request", request)
    try:
        assert kube.patch_run_status("ns", "r", {"phase": "Running"}, "11") == "12"
        assert kube.patch_run_status("ns", "r", {"phase": "Running"}) == "12"
    finally:
        kube.close()
    assert sent == [
        {"metadata": {"resourceVersion": "11"}, "status": {"phase": "Running"}},
        {"status": {"phase": "Running"}},
    ]


class _Quota(FakeKube):
    """An API server that throttles: pod creates get 429 while ``throttled``, each create_many call recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.throttled = True
        self.rounds: list[int] = []

    def create_many_now(self, objs: list[dict[str, Any]]) -> list[Any]:
        from mlbench_operator.kube import ApiError

        pods = [o for o in objs if o["kind"] == "Pod"]
        if pods:
            self.rounds.append(len(pods))
        if self.throttled and pods:
            self.create_error = ApiError(429, "POST", "/pods", '{"message": "too many requests"}')
        else:
            self.create_error = None
        return super().create_many_now(objs)


def test_pod_creates_slow_start_after_a_429_and_grow_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: after the first 429 the next creates go in batches of 1, 2, 4, ... (as Job and JobSet do), each
    only after the one before went through, not all 16 workers at an API server that just throttled us."""
    import kopf

    from tests.operator.test_reconcile import admitted

    body, _ = admitted(h.run(workers=16))
    kube = _Quota()
    rec = _reconciler(body, kube, monkeypatch)
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(rec.step([]))
    assert kube.rounds == [16]  # all at once: nothing was refused before
    assert rec.pacing.batch == 1
    kube.throttled = False
    rec.pacing.create_backoff_until = 0.0  # the backoff has ended
    asyncio.run(rec.step([]))
    assert kube.rounds[1:] == [1, 2, 4, 8, 1]  # 16 workers, then the launcher, in growing batches
    assert rec.pacing.batch == 32


# -- an operator restart: the run's objects are read and reused, not generated and created again -----------------
def _no_keygen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """ssh-keygen replaced: records each call (a restarted operator must not make new keys for a run that has them)."""
    from mlbench_operator import sshkeys

    made: list[str] = []

    def keygen(comment: str) -> Any:
        made.append(comment)
        return sshkeys.RunKeys("client-private", "client-public", "host-private", "host-public")

    monkeypatch.setattr(sshkeys, "generate_keypair", keygen)
    return made


@pytest.mark.parametrize("missing", [(), ("Secret",), ("ConfigMap", "NetworkPolicy")])
def test_a_restarted_operator_reuses_the_runs_objects(
    monkeypatch: pytest.MonkeyPatch, missing: tuple[str, ...]
) -> None:
    """A run admitted before the operator (re)started: its ConfigMap, Secret and NetworkPolicy are read; those
    that exist and are the run's are reused (no create answered 409 for each, no new keys), only the missing
    ones are built and created."""
    from tests.operator.test_reconcile import admitted

    keygen = _no_keygen(monkeypatch)
    body, _ = admitted(h.run())
    kube = FakeKube()
    objects = {("ConfigMap", "r1-config"), ("Secret", "r1-ssh"), ("NetworkPolicy", "r1")}
    for key in objects:
        if key[0] not in missing:
            kube.existing[key] = ours()
    rec = _reconciler(body, kube, monkeypatch, ensured=False)
    asyncio.run(rec.step([]))
    assert rec.ensured
    read = {call[1:] for call in kube.calls if call[0] == "get"}
    assert objects <= read
    created = {call[1:] for call in kube.calls if call[0] == "create" and call[1] != "Pod"}
    assert created == {key for key in objects if key[0] in missing}
    assert len(keygen) == ("Secret" in missing)
    assert [call for call in kube.calls if call[:2] == ("create", "Pod")]  # and the pass goes on to the workers


@pytest.mark.parametrize(
    ("status", "may_exist"),
    [
        ({}, False),  # a new run: admitted by this daemon, its objects created without reading first
        ({"phase": "Pending"}, False),
        ({"phase": "Running", "taskSnapshot": {"model": {}}}, True),
        ({"phase": "Suspended", "taskSnapshot": {"model": {}}}, True),
    ],
)
def test_objects_may_exist(status: dict[str, Any], may_exist: bool) -> None:
    from mlbench_operator.run import ownership

    assert ownership.objects_may_exist(status) is may_exist


@pytest.mark.parametrize(
    ("existing", "create", "held"),
    [
        ({}, ["ConfigMap", "Secret"], None),
        ({"ConfigMap": ours()}, ["Secret"], None),
        ({"ConfigMap": ours(), "Secret": ours()}, [], None),
        ({"ConfigMap": ours(uid="uid-old")}, [], "ConfigMap"),  # a deleted run's: a NameConflict, nothing created
        ({"Secret": ours(run="other")}, [], "Secret"),
    ],
)
def test_to_create(existing: dict[str, Any], create: list[str], held: str | None) -> None:
    from mlbench_operator.run import ownership

    wanted = [("ConfigMap", "r1-config"), ("Secret", "r1-ssh")]
    found = {key: existing.get(key[0]) for key in wanted}
    missing, conflict = ownership.to_create(wanted, found, "r1", "uid-r1")
    assert [kind for kind, _ in missing] == create
    assert (conflict[0] if conflict else None) == held
