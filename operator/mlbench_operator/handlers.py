"""kopf glue: thin handlers that feed observations to :mod:`.reconcile` and execute its plans.

* :class:`PodWatch` (a thread per watched namespace, or one cluster-wide) lists and watches the
  operator's pods into a :class:`~.podview.PodIndex` by run (``memo.pods``) and wakes the run's
  reconciler at each change; the first listing is in before kopf starts, so a restarted operator sees
  all pods first. Not kopf's ``@kopf.index``/``@kopf.on.event``: see :class:`PodWatch`.
* ``run_event`` (and a fetch Job's ``fetch_job_event``) wake the run's reconciler too (no polling:
  events drive status).
* ``reconcile_run`` (daemon, one per unfinished run; resumed on operator start) admits the run
  once, then loops: plan from (run, pods, now) -> execute -> sleep until woken. Bursts of pod
  events coalesce into one pass, so 1000 workers do not mean 1000 status writes.
* ``scrape_progress`` (timer) copies rank 0's metrics into ``status.progress`` while Running.

Configuration: an :class:`~.settings.OperatorConfig` in the operator memo (``memo.config``), put
there by :mod:`.main`, or parsed from the environment by :func:`configure` when kopf runs this module
without it (``kopf run -m mlbench_operator.handlers``). Pacing (how soon a run's daemon may create or
delete again) is :class:`~.pacing.Pacing`, fed ``time.monotonic()`` here.

One active replica: the Deployment runs two pods, and only the holder of the ``mlbench-operator``
Lease runs kopf (:mod:`.leader`, started by :mod:`.main`); kopf itself runs standalone (no
peering). kopf's own bookkeeping lives under ``mlbench.io`` annotations/finalizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from mlbench_api import bundle
from mlbench_api.common import GROUP, VERSION
from mlbench_operator import builders, datasets, logs, netpol, progress, reconcile, results, sshkeys, sweeps
from mlbench_operator import conditions as c
from mlbench_operator import metrics as m
from mlbench_operator import naming as n
from mlbench_operator import pacing as pc
from mlbench_operator.kube import ApiError, Kube, transient
from mlbench_operator.podview import PodChange, PodIndex, PodView, RunKey
from mlbench_operator.settings import OperatorConfig, SettingsError

PLURAL = "benchmarkruns"
#: A sweep's run whose TTL expired before the sweep wrote down how it ended: look again this often
#: (the run's last phase change wakes the sweep at once, so this is rarely more than one wait).
SWEEP_RECORD_POLL_SECONDS = 1.0
#: While a dataset is fetched: look again this often even without a Job event.
DATASET_POLL_SECONDS = 10.0
#: Rank 0's metrics port on worker 0 (RunConfig.metricsPort + local rank 0).
PROGRESS_PORT = n.METRICS_PORT
#: What handlers given no configured memo use (unit tests calling them directly); under kopf,
#: :func:`configure` has always put a config in the memo before any resource handler runs.
DEFAULT_CONFIG = OperatorConfig()


def pods_of(memo: object, key: RunKey) -> list[PodView]:
    """A run's pods from the operator's :class:`PodIndex` (``memo.pods``, filled by :class:`PodWatch`)."""
    index = getattr(memo, "pods", None)
    return index.get(key) if isinstance(index, PodIndex) else []


def config_of(memo: object) -> OperatorConfig:
    """The operator's configuration, typed, from kopf's memo (``memo.config``; every resource's memo is
    a shallow copy of the operator's, so it is there too)."""
    config = getattr(memo, "config", None)
    return config if isinstance(config, OperatorConfig) else DEFAULT_CONFIG


log = logs.get_logger()


class Wakeups:
    """One asyncio.Event per run key; pod and run events set it, the run's daemon waits on it."""

    def __init__(self) -> None:
        # A list: a run deleted and re-created under the same name briefly has two daemons.
        self._events: dict[tuple[str, str], list[asyncio.Event]] = {}

    def register(self, key: tuple[str, str]) -> asyncio.Event:
        event = asyncio.Event()
        self._events.setdefault(key, []).append(event)
        return event

    def unregister(self, key: tuple[str, str], event: asyncio.Event) -> None:
        events = self._events.get(key, [])
        if event in events:
            events.remove(event)
        if not events:
            self._events.pop(key, None)

    def wake(self, key: tuple[str, str]) -> None:
        for event in self._events.get(key, []):
            event.set()

    def wake_namespace(self, namespace: str) -> None:
        """A fetch Job changed: any run of the namespace may be waiting for it (they are few)."""
        for key in [k for k in self._events if k[0] == namespace]:
            self.wake(key)

    @staticmethod
    async def sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, delay: float | None, debounce: float) -> bool:
        """A daemon's pause between passes: until ``wake`` is set, the daemon is stopped, or ``delay`` passes
        (None: no time limit); then ``debounce`` more, so a burst of events (1000 pods starting) makes one
        pass. True: stop now."""
        woken = asyncio.ensure_future(wake.wait())
        stopping = asyncio.ensure_future(stopped.wait())
        timeout = None if delay is None else max(delay, 0.05)
        try:
            await asyncio.wait({woken, stopping}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            stopping.cancel()
        if stopped:
            return True
        await asyncio.sleep(debounce)
        return False


#: A failed launcher's log tail kept in an Event at a gang restart: lines read, and the wait for them.
LAUNCHER_LOG_LINES = 30
#: ... and at most this much of them (the Event keeps its last KiB).
LAUNCHER_LOG_BYTES = 64 * 1024
LAUNCHER_LOG_SECONDS = 5.0


def _now() -> datetime:
    return datetime.now(UTC)


# -- operator lifecycle ------------------------------------------------------------------------------
@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Settings for the one active replica (the Lease holder), whose traces on objects are all under mlbench.io."""
    logs.configure()
    if not isinstance(memo.get("config"), OperatorConfig):  # ``kopf run -m mlbench_operator.handlers``: no main.py
        try:
            memo.config = OperatorConfig.from_env(os.environ)
        except SettingsError as err:  # permanent: kopf stops the operator with the variable named
            raise kopf.PermanentError(str(err)) from None
    config: OperatorConfig = memo.config
    settings.peering.standalone = True
    settings.scanning.disabled = True  # no CRD/namespace watching: less RBAC; CRDs exist before we start
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Server-side filtering: watch only the operator's Jobs (and pods: PodWatch), not every one in the cluster.
    settings.watching.label_selectors["batch", "jobs"] = f"{n.LABEL_MANAGED_BY}={n.MANAGER},{n.LABEL_DATASET}"
    # Optional: serve only runs matching a label selector (e.g. one test session on a shared cluster).
    run_selector = config.run_selector
    if run_selector:
        settings.watching.label_selectors[GROUP, PLURAL] = run_selector
    settings.posting.level = 100  # only the explicit kopf.event/info/warning calls become Events
    settings.watching.server_timeout = 300
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    memo.kube = memo.get("kube") or Kube()
    memo.wakeups = Wakeups()
    memo.pods = PodIndex()
    loop = asyncio.get_running_loop()
    memo.pod_watches = [
        PodWatch(
            memo.kube,
            memo.pods,
            memo.wakeups,
            loop,
            namespace=ns,
            timeout_seconds=int(settings.watching.server_timeout or 300),
        )
        for ns in (config.namespaces or (None,))
    ]
    for watch in memo.pod_watches:
        watch.start()
    # kopf starts watching runs once the startup handlers are done: their daemons find every pod listed
    await asyncio.gather(*(watch.synced.wait() for watch in memo.pod_watches))
    port = config.metrics_port
    if port and not memo.get("metrics_started"):
        from prometheus_client import start_http_server

        start_http_server(port)
        memo.metrics_started = True
    log.info("operator_started", metrics_port=port, version=_version(), run_selector=run_selector or None)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    for watch in memo.get("pod_watches") or ():
        watch.stop()
    kube = memo.get("kube")
    if isinstance(kube, Kube) and memo.get("owns_kube", True):
        kube.close()


#: A liveness probe whose no-op call on the API thread pool does not return in this time fails.
PROBE_SECONDS = 10.0


@kopf.on.probe(id="api_pool")
async def api_pool_alive(memo: kopf.Memo, **_: Any) -> bool:
    """Liveness: the event loop answers (this runs on it) and the API pool still runs tasks.

    A pool whose threads are all stuck (a hung API call on every thread) would leave every run
    waiting while kopf's own endpoint stays green; failing the probe makes Kubernetes restart us,
    and the state lives in the resources, so a restart resumes every run.
    """
    kube = memo.get("kube")
    if not isinstance(kube, Kube):
        return True
    try:
        return await asyncio.wait_for(kube.run(bool, 1), PROBE_SECONDS)
    except TimeoutError:
        # permanent: kopf answers the probe with HTTP 500 at once instead of retrying the handler
        raise kopf.PermanentError(f"the API thread pool ran no task in {PROBE_SECONDS:.0f}s: stuck") from None


def _version() -> str:
    from mlbench_operator import __version__

    return __version__


# -- observations ----------------------------------------------------------------------------------------
#: The operator's pods (server-side filtered: not every pod of the cluster).
POD_SELECTOR = f"{n.LABEL_MANAGED_BY}={n.MANAGER},{n.LABEL_RUN}"
#: Waits before listing again after a failed listing or watch: doubling from the first, up to the last.
POD_WATCH_BACKOFF = (1.0, 30.0)


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


class PodWatch:
    """The operator's pods in a namespace (None: all), listed then watched on a thread of its own into a
    :class:`PodIndex`; every change wakes its run's daemon.

    Why not kopf's ``@kopf.index`` and ``@kopf.on.event`` on pods: kopf takes every watch event through
    its per-object machinery (a worker task, memories, loggers, cause detection, handler invocation):
    about 0.5 ms of the event loop's CPU per event, decoding aside, and a run of 1000 workers brings
    3000 events (created, scheduled, Running) while the same loop and its API threads are creating
    those pods. Here an event costs its decoding and a :class:`PodView` (about 0.08 ms), done on this
    thread, and the loop only files the change (docs/operator.md, "Scale").

    The same guarantees as kopf's index: the first listing is in the index before :attr:`synced` is set
    (``configure`` waits for it, and kopf starts the run daemons after it), a lost watch is resumed from
    its last resourceVersion, and an expired one (410) or a failure lists again, which also drops the
    pods deleted meanwhile.
    """

    def __init__(
        self,
        kube: Kube,
        index: PodIndex,
        wakeups: Wakeups,
        loop: asyncio.AbstractEventLoop,
        *,
        namespace: str | None,
        timeout_seconds: int = 300,
    ) -> None:
        self.kube = kube
        self.index = index
        self.wakeups = wakeups
        self.loop = loop
        self.namespace = namespace
        self.path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        self.timeout_seconds = timeout_seconds
        #: Set (on the loop) once the first listing is in the index.
        self.synced = asyncio.Event()
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"pod-watch-{namespace or 'all'}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the watch (the thread ends at its next event, or now when its stream is shut down)."""
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                pods, version = self.kube.list_objects(self.path, POD_SELECTOR, "pods")
                self._hand([c for c in (PodChange.of("ADDED", p) for p in pods) if c is not None], listing=True)
                failures = 0
                while not self._stop.is_set():  # the server ends a watch after timeout_seconds: resume it
                    version = self._follow(version)
            except _Expired:
                log.info("pod_watch_expired", namespace=self.namespace)
            except Exception as err:
                if self._stop.is_set():
                    return
                failures += 1
                delay = min(POD_WATCH_BACKOFF[0] * 2 ** (failures - 1), POD_WATCH_BACKOFF[1])
                log.warning("pod_watch_failed", namespace=self.namespace, error=str(err)[:500], retry_in=delay)
                self._stop.wait(delay)

    def _follow(self, version: str) -> str:
        """One watch from ``version``; returns the last resourceVersion seen when the server ends it."""
        for events in self.kube.watch(
            self.path, POD_SELECTOR, version, self.timeout_seconds, resource="pods", on_response=self._keep
        ):
            changes: list[PodChange] = []
            for event in events:
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired
                    raise ApiError(int(obj.get("code") or 500), "WATCH", self.path, json.dumps(obj))
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                change = PodChange.of(str(kind), obj) if kind != "BOOKMARK" else None
                if change is not None:
                    changes.append(change)
            if changes:
                _POD_EVENTS.inc(len(changes))
                self._hand(changes)
            if self._stop.is_set():
                break
        return version

    def _keep(self, response: Any) -> None:
        self._response = response
        if self._stop.is_set():  # stopped while connecting
            with contextlib.suppress(Exception):
                response.shutdown()

    def _hand(self, changes: list[PodChange], listing: bool = False) -> None:
        """To the loop, which owns the index and the wake-ups (raises once the loop is closed: the thread ends)."""
        self.loop.call_soon_threadsafe(self.apply, changes, listing)

    def apply(self, changes: list[PodChange], listing: bool = False) -> None:
        """On the loop: file the changes (a listing replaces the namespace's pods), wake the runs they touch."""
        if listing:
            touched = self.index.reset(changes, self.namespace)
        else:
            touched = set()
            for change in changes:
                touched |= self.index.update(change)
        for key in touched:
            self.wakeups.wake(key)
        self.synced.set()


_POD_EVENTS = m.WATCH_EVENTS.labels("pods")


@kopf.on.event("batch", "v1", "jobs", labels={n.LABEL_DATASET: kopf.PRESENT, n.LABEL_MANAGED_BY: n.MANAGER})
async def fetch_job_event(namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A dataset fetch Job progressed: wake the namespace's runs (those waiting for it re-read it)."""
    m.WATCH_EVENTS.labels("jobs").inc()
    memo.wakeups.wake_namespace(namespace or "")


@kopf.on.event(GROUP, VERSION, PLURAL)
async def run_event(
    *,
    type: str,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    m.WATCH_EVENTS.labels(PLURAL).inc()
    key = (namespace or "", name)
    task = (spec.get("taskRef") or {}).get("name", "")
    serves = reconcile.serves_metrics(status)
    m.track_phase(key, status.get("phase"), deleted=type == "DELETED", task=task, serves_metrics=serves)
    memo.wakeups.wake(key)
    if type != "DELETED":
        stale = reconcile.generation_patch(body)
        if stale is not None:  # a finished run's runPolicy was edited: its daemon has stopped
            await memo.kube.run(memo.kube.patch_run_status, namespace or "", name, stale)


# -- the reconciler ----------------------------------------------------------------------------------------
def _needs_daemon(body: kopf.Body, namespace: str | None, name: str, **kwargs: Any) -> bool:
    """Unfinished runs, and finished ones whose results are not yet kept or whose cleanPodPolicy still
    wants pods deleted (e.g. the operator died between writing the final status and deleting the pods), or
    whose cleanup is not recorded yet (it died between deleting the pods and saying so)."""
    status = body.get("status") or {}
    if status.get("phase") not in reconcile.TERMINAL:
        return True
    pods = pods_of(kwargs.get("memo"), (namespace or "", name))
    if reconcile.cleanup_unrecorded(body, pods):
        return True
    if not pods:
        return False
    uid = body.get("metadata", {}).get("uid", "")
    launcher = results.launcher(pods, uid)  # results are only worth a daemon while the launcher is there
    wait = results.wait_for(config_of(kwargs.get("memo")).results_wait_seconds, (body.get("spec") or {}).get("network"))
    pending = launcher is not None and results.decide(status, launcher, _now(), wait).action is not results.Action.NONE
    return pending or bool(reconcile.cleanup_pending(body, pods))


def _waits_for_ttl(status: kopf.Status, spec: kopf.Spec, **_: Any) -> bool:
    """Finished runs with ttlSecondsAfterFinished (also when it was set after the run finished)."""
    return (
        status.get("phase") in reconcile.TERMINAL
        and (spec.get("runPolicy") or {}).get("ttlSecondsAfterFinished") is not None
    )


@dataclasses.dataclass(frozen=True)
class _Stop:
    """A pass that ends before the plan: what :meth:`RunReconciler.step` returns (the next wake-up, or None)."""

    delay: float | None


class _Refused(Exception):
    """The API server refused some of a run's objects: (what, HTTP status, its message) each."""

    def __init__(self, failures: list[tuple[str, int, str]]) -> None:
        super().__init__(failures)
        self.failures = failures


class StatusRefused(kopf.TemporaryError):
    """The API server refused a status write (422); what was written instead is in the message."""

    def __init__(self, message: str) -> None:
        super().__init__(message, delay=0.1)


class RunReconciler:
    """The state of one run's daemon: only caches; truth is re-read from the run and the pods."""

    def __init__(self, body: kopf.Body, kube: Kube, logger: Any, config: OperatorConfig | None = None) -> None:
        self.config = config if config is not None else DEFAULT_CONFIG
        self.body = body
        self.kube = kube
        self.name: str = body["metadata"]["name"]
        self.namespace: str = body["metadata"]["namespace"]
        # The operator is the only writer of these status fields (one replica, one daemon per run), so
        # our last write is authoritative even before the watch echoes it back.
        self.status: dict[str, Any] = dict(body.get("status") or {})
        self.log = log.bind(run=self.name, namespace=self.namespace)
        self.kopf_logger = logger
        self.ensured = False  #: the ConfigMap, Secret and NetworkPolicy exist
        self.service_ensured = False  #: the headless Service exists (created with the launcher: see ensure_service)
        self.pacing = pc.Pacing(resync_seconds=self.config.resync_seconds)  # fed time.monotonic()
        self.datasets = self.config.datasets
        self.linger = self.config.metrics_linger_seconds
        self.results_wait = results.wait_for(self.config.results_wait_seconds, body["spec"].get("network"))
        self.pvc_ensured = False
        #: The operator's pod index (memo.pods), told at once of the pods a cleanup deleted (see finished).
        self.index: PodIndex | None = None

    def view(self) -> dict[str, Any]:
        """The run as the planner should see it: live metadata/spec, our own status."""
        return {"metadata": dict(self.body["metadata"]), "spec": dict(self.body["spec"]), "status": self.status}

    def recover(self, live_status: Mapping[str, Any]) -> None:
        """After a failed pass: trust the cluster's status again (a write may have landed although its
        answer was an error), except where ours is provably newer, written by us and not yet echoed by the
        watch: a finished status (re-planning from the older one while the cleanup deletes pods would misread
        the result as a lost launcher), or more restarts (the count only grows; planning from the older one
        would announce and count the same gang restart again)."""
        live = dict(live_status or {})
        if self.status.get("phase") in reconcile.TERMINAL:
            return
        if int(self.status.get("restarts") or 0) > int(live.get("restarts") or 0):
            return
        self.status = live

    def event(self, type_: str, reason: str, message: str) -> None:
        kopf.event(self.body, type=type_, reason=reason, message=c.clean(message)[:1024])

    async def patch(self, new: dict[str, Any]) -> None:
        """Write the status (as :func:`reconcile.finalize` completes it). A 422 (a value the API server
        cannot store) ends an unfinished run as Failed/InvalidResult with a minimal status instead of
        retrying the same refused write forever; a finished run keeps its phase and outcome, the refused
        part dropped or recorded (:func:`results.refused_write`). Either way :class:`StatusRefused`
        stops the pass, and the next one goes on (cleans up)."""
        now = _now()
        changes = reconcile.status_patch(self.status, reconcile.finalize(new, now))
        if not changes:
            return
        try:
            await self.kube.run(self.kube.patch_run_status, self.namespace, self.name, changes)
        except ApiError as err:
            if err.status != 422:
                raise
            finished = self.status.get("phase") in reconcile.TERMINAL
            instead = (
                results.refused_write(changes, err.detail, now)
                if finished
                else reconcile.unstorable_status(self.status, err.detail, now)
            )
            fallback = reconcile.status_patch(self.status, instead)
            if fallback:
                await self.kube.run(self.kube.patch_run_status, self.namespace, self.name, fallback)
            # A finished run's refused changes are dropped for good: our copy takes them as written, so
            # that the next pass does not send them again (every 0.1 s, an Event each time).
            self.status = {**self.status, **(changes if finished else {}), **fallback}
            self.log.warning("status_refused", detail=err.detail[:500], keys=sorted(changes), finished=finished)
            if finished:
                text = f"a status write was refused (HTTP 422) and dropped: {err.detail}"
                self.event("Warning", "StatusRefused", text)
                phase = self.status.get("phase")
                raise StatusRefused(f"the status was refused (422); the {phase} run keeps its phase") from err
            self.event("Warning", c.Reason.INVALID_RESULT, self.status["message"])
            raise StatusRefused("the status was refused (422); the run failed with InvalidResult") from err
        self.status = {**self.status, **changes}

    async def step(self, pods: list[PodView]) -> float | None:
        """One pass. Returns seconds until the next unprompted pass, or None when nothing is left to do (the
        daemon then waits to be woken: see :func:`reconcile_run`).

        The pass is a pipeline that may stop early at each stage: the run's context (admission, or
        rebuilt from the snapshot), the run's objects and dataset, then the plan and its execution.
        """
        m.RECONCILES.labels(m.RUN_KIND).inc()
        now = _now()
        if self.body["metadata"].get("deletionTimestamp"):
            return self.config.resync_seconds  # kopf stops us; owner references clean up the rest
        if self.status.get("phase") in reconcile.TERMINAL:
            return await self.finished(now, pods)
        live = (self.body.get("status") or {}).get("progress")
        if live is not None:  # written by the scrape timer, not by us: the planner's NoProgress reads it
            self.status["progress"] = live
        else:  # none, or cleared by a gang restart: a copy read before the watch echoed that must not linger
            self.status.pop("progress", None)
        ctx = await self.run_context(now, pods)
        if isinstance(ctx, _Stop):
            return ctx.delay
        ready = await self.prepare(ctx, now, pods)
        if ready is not None:
            return ready.delay
        return await self.execute(reconcile.plan(self.view(), ctx, pods, now), ctx, now, pods)

    async def run_context(self, now: datetime, pods: list[PodView]) -> builders.RunContext | _Stop:
        """Admit the run (first pass: resolve its task, snapshot it, check the policy) or rebuild its
        context from the snapshot; a run that cannot start or be rebuilt ends here, Failed."""
        snapshot = self.status.get("taskSnapshot")
        if snapshot:
            try:
                ctx = reconcile.context(self.view(), snapshot, self.config.runner_uid, self.datasets.volume_name)
            except ValueError as err:
                # Final status first, then the cleanup by the raw spec.runPolicy.cleanPodPolicy (in finished).
                message = f"cannot rebuild the configuration: {err}"
                await self.patch(reconcile.failed_status(self.view(), c.Reason.INVALID_CONFIG, message, now))
                self.event("Warning", c.Reason.INVALID_CONFIG, message)
                return _Stop(await self.finished(now, pods))
            return dataclasses.replace(ctx, metrics_linger_seconds=self.linger)
        task_name = (self.body["spec"].get("taskRef") or {}).get("name", "")
        task = await self.kube.run(self.kube.get_task, task_name)
        admission = reconcile.admit(
            self.view(), task, self.config.runner_uid, self.datasets.volume_name, self.config.policy
        )
        if isinstance(admission, reconcile.Rejection):
            await self.patch(reconcile.rejected_status(self.view(), admission, now))
            self.event("Warning", admission.reason, admission.message)
            self.log.warning("run_rejected", reason=admission.reason, message=admission.message)
            return _Stop(await self.finished(now, pods))
        ctx, snapshot = admission
        ctx = dataclasses.replace(ctx, metrics_linger_seconds=self.linger)
        await self.patch(reconcile.admitted_status(self.view(), ctx, snapshot, now))
        self.event("Normal", "Admitted", f"task {ctx.task_name} snapshotted; creating {ctx.spec.workers} workers")
        self.log.info("run_admitted", task=ctx.task_name, workers=ctx.spec.workers)
        return ctx

    async def prepare(self, ctx: builders.RunContext, now: datetime, pods: list[PodView]) -> _Stop | None:
        """The run's ConfigMap, Secret and NetworkPolicy, then its dataset; None when the pods may come."""
        if not self.ensured:
            try:
                if not await self.ensure_objects(ctx, now):  # a name conflict is shown; look again later
                    held = await self.held_past_deadline(now, pods, "its objects' names were held by another owner")
                    return held or self.until_deadline(min(30.0, self.config.resync_seconds), now)
            except _Refused as err:  # quota, policy, an invalid object: a condition, not a silent retry
                held = await self.held_past_deadline(now, pods, "the creates of its objects were refused")
                return held or self.until_deadline(await self.creation_refused(err.failures, now, pods), now)
        dataset = ctx.task.dataset_spec  # None for a collectives task: nothing to fetch
        if (
            dataset is not None
            and dataset.source is not None
            and not c.is_true(self.status.get("conditions"), c.DATASET_READY)
        ):
            waiting = await self.ensure_dataset(ctx, now, pods)
            if waiting is not None:
                return _Stop(waiting if waiting >= 0 else await self.finished(now, pods))
        return None

    async def execute(
        self, plan: reconcile.Plan, ctx: builders.RunContext, now: datetime, pods: list[PodView]
    ) -> float | None:
        """Carry out a plan: the status first (a result, a restart), then deletes, then creates."""
        if plan.create_launcher and not self.service_ensured and not self.pacing.creates_paused(time.monotonic()):
            stopped = await self.ensure_service(ctx, now, pods)  # before the status says "creating the launcher"
            if stopped is not None:
                return stopped.delay
        was_ready = c.is_true(self.status.get("conditions"), c.WORKERS_READY)
        restarted = int(plan.status.get("restarts", 0)) > int(self.status.get("restarts", 0))
        await self.patch(plan.status)  # results and restarts are recorded before the world is changed
        # the status says it now: its Events too, before a delete or create below can fail the pass (the
        # retry plans from the new status and would not say it again)
        self.emit(plan)
        if restarted:  # counted where it is recorded, once, whether or not stale pods remain to delete
            m.RESTARTS.inc()
        if plan.terminal:
            # Once the result is written, nothing can turn the run back into a running one. The cleanup
            # follows (finished), re-driven from the cluster's state until done.
            self.log.info("run_finished", phase=plan.status.get("phase"), message=plan.status.get("message"))
            return await self.finished(now, pods)
        if plan.keep_log_of:
            await self.keep_launcher_log(plan.keep_log_of, int(plan.status.get("restarts", 0)))
        if plan.force_delete:
            self.log.warning("force_delete_pods", pods=plan.force_delete)
            await self.kube.delete_pods_named(self.namespace, plan.force_delete, 0)
        pacing = self.pacing
        pacing.begin_pass()
        if plan.delete_stale and pacing.may_delete_stale(time.monotonic()):
            await self.kube.delete_pods_named(self.namespace, plan.delete_stale, uids=plan.delete_stale)
            pacing.stale_deleted(time.monotonic())
        if (plan.create_workers or plan.create_launcher) and pacing.creates_paused(time.monotonic()):
            return pacing.wake_in(plan.requeue_after)
        refused = await self.create_pods(plan, ctx, now)
        if refused:
            return await self.creation_refused(refused, now, pods)
        attempt = int(plan.status.get("restarts", 0))
        if not was_ready and c.is_true(plan.status.get("conditions"), c.WORKERS_READY) and attempt == 0:
            created = c.parse_time(self.body["metadata"].get("creationTimestamp"))
            if created is not None:
                m.WORKERS_READY_SECONDS.observe(max((now - created).total_seconds(), 0.0))
        return pacing.wake_in(plan.requeue_after)

    async def create_pods(
        self, plan: reconcile.Plan, ctx: builders.RunContext, now: datetime
    ) -> list[tuple[str, int, str]]:
        """The plan's workers and launcher, in parallel; returns the refused ones (403/422), raises on other errors."""
        pacing = self.pacing
        attempt = int(plan.status.get("restarts", 0))
        # the kubelet enforces what is left of runPolicy.activeDeadlineSeconds, also while we are down
        run_deadline = ctx.spec.run_policy.active_deadline_seconds if ctx.spec.run_policy else None
        deadline = builders.pod_deadline(c.parse_time(self.status.get("startTime")), run_deadline, now)
        todo = [
            builders.worker_pod(ctx, rank, attempt, deadline)
            for rank in plan.create_workers
            if pacing.may_create(n.worker_name(self.name, rank), time.monotonic())
        ]
        if plan.create_launcher and pacing.may_create(n.launcher_name(self.name), time.monotonic()):
            todo.append(builders.launcher_pod(ctx, attempt, deadline))
        if not todo:
            return []
        outcomes = await self.kube.create_many(todo)
        errors = [r for r in outcomes if isinstance(r, BaseException)]
        refused: list[tuple[str, int, str]] = []
        for obj, res in zip(todo, outcomes, strict=True):
            if isinstance(res, BaseException):
                pacing.create_failed(obj["metadata"]["name"])
                if isinstance(res, ApiError) and res.status in (403, 422):
                    refused.append((f"pod {obj['metadata']['name']}", res.status, res.detail))
        if refused:
            return refused
        if errors:
            delay = 5.0
            if any(transient(e) for e in errors):
                # an overloaded or failing API server: the 403 backoff, which a pod event does not cut short
                delay = pacing.creates_refused(time.monotonic())
            raise kopf.TemporaryError(f"{len(errors)} of {len(todo)} pod creations failed: {errors[0]}", delay=delay)
        pacing.creates_succeeded()
        return []

    async def keep_launcher_log(self, pod: str, restart: int) -> None:
        """The failed attempt's launcher log tail as a Warning Event (best effort: a node that serves no
        logs, e.g. kwok's, or a timeout only costs the Event)."""
        try:
            text = await asyncio.wait_for(
                self.kube.run(
                    self.kube.read_log,
                    self.namespace,
                    pod,
                    n.LAUNCHER_CONTAINER,
                    LAUNCHER_LOG_LINES,
                    LAUNCHER_LOG_BYTES,
                ),
                LAUNCHER_LOG_SECONDS,
            )
        except Exception as err:
            self.log.info("launcher_log_not_kept", pod=pod, error=f"{type(err).__name__}: {err}"[:300])
            return
        head = f"attempt {restart - 1} launcher log, last lines:\n"
        tail = results.log_tail(text, 1024 - len(head))
        if tail:
            self.event("Warning", "LauncherLog", head + tail)

    def emit(self, plan: reconcile.Plan) -> None:
        for type_, reason, message in plan.events:
            self.event(type_, reason, message)
            self.log.info("run_transition", reason=reason, message=message)

    def until_deadline(self, delay: float | None, now: datetime) -> _Stop:
        """A held run's next pass: after ``delay``, or when its deadline passes if that comes first."""
        return _Stop(reconcile.by_deadline(delay, reconcile.deadline_left(self.view(), now)))

    async def held_past_deadline(self, now: datetime, pods: list[PodView], doing: str) -> _Stop | None:
        """The run ends ``Failed``/``DeadlineExceeded`` if its deadline has passed while it was held before its
        pods (:func:`reconcile.deadline_while`); None: not yet."""
        plan = reconcile.deadline_while(self.view(), now, doing)
        if plan is None:
            return None
        await self.patch(plan.status)
        self.emit(plan)
        return _Stop(await self.finished(now, pods))

    async def creation_refused(
        self, refused: list[tuple[str, int, str]], now: datetime, pods: list[PodView]
    ) -> float | None:
        """403/422 on pod creates: a visible condition and Event; a final refusal (422, Pod Security) fails the
        run, another backs off (:func:`reconcile.refusal_is_final`)."""
        plan = reconcile.creation_failed(self.view(), refused, now)
        await self.patch(plan.status)
        self.emit(plan)
        if plan.terminal:
            self.log.warning("run_failed_create_refused", message=plan.status.get("message"))
            return await self.finished(now, pods)
        delay = self.pacing.creates_refused(time.monotonic())
        self.log.warning("pod_create_refused", message=plan.status.get("message"), retry_in=delay)
        return delay

    async def ensure_objects(self, ctx: builders.RunContext, now: datetime) -> bool:
        """ConfigMap, the SSH Secret and the NetworkPolicy, before any pod (the Service comes with the
        launcher: :meth:`ensure_service`); False on a NameConflict (see :meth:`create_owned`)."""
        keys = await self.kube.run(sshkeys.generate_keypair, f"mlbench-{ctx.namespace}-{ctx.name}")
        objs = [
            builders.config_map(ctx),
            builders.ssh_secret(ctx, keys),
            netpol.network_policy(ctx, self.config.scraper_namespaces),
        ]
        self.ensured = await self.create_owned(objs, ctx, now)
        return self.ensured

    async def ensure_service(self, ctx: builders.RunContext, now: datetime, pods: list[PodView]) -> _Stop | None:
        """The headless Service that gives the workers their DNS names, right before the launcher (the
        only one that resolves them): None when it exists, else where the pass stops (a NameConflict,
        a refusal; as for the other objects).

        Not with the others before the workers: a Service selecting N workers while they start has the
        endpoints controllers rewrite its Endpoints and EndpointSlices (up to N addresses each) hundreds
        of times, 400 Endpoints writes for 1000 workers, about a fifth more control-plane CPU than the
        pods themselves (docs/operator.md, "Scale"). Created once they are all Ready, it is computed once.
        """
        try:
            if not await self.create_owned([builders.service(ctx)], ctx, now):
                return _Stop(min(30.0, self.config.resync_seconds))  # a name conflict is shown; look again later
        except _Refused as err:
            return _Stop(await self.creation_refused(err.failures, now, pods))
        self.service_ensured = True
        return None

    async def create_owned(self, objs: list[dict[str, Any]], ctx: builders.RunContext, now: datetime) -> bool:
        """Create the run's objects in parallel. 409 is fine only when the existing object is this run's (a
        retry); one of another owner (e.g. a deleted run of the same name whose garbage collection has
        not finished) is reported as NameConflict and nothing proceeds (False), and one gone by the time
        it is read is retried (it exists for nobody). Refusals (403/422) raise :class:`_Refused`, other
        errors a retry."""
        outcomes = await self.kube.create_many(objs)
        refused = [
            (f"{obj['kind']} {obj['metadata']['name']}", res.status, res.detail)
            for obj, res in zip(objs, outcomes, strict=True)
            if isinstance(res, ApiError) and res.status in (403, 422)
        ]
        if refused:
            raise _Refused(refused)
        errors = [r for r in outcomes if isinstance(r, BaseException)]
        if errors:
            raise kopf.TemporaryError(f"creating the run's objects failed: {errors[0]}", delay=5)
        for obj, created in zip(objs, outcomes, strict=True):
            if created is False:  # 409: whose is it?
                kind, name = obj["kind"], obj["metadata"]["name"]
                existing = await self.kube.run(self.kube.get, kind, self.namespace, name)
                if existing is None:  # deleted in between (the garbage collector, a previous owner's): not ours
                    raise kopf.TemporaryError(f"{kind} {name} vanished after a conflict; creating it again", delay=1)
                owner = reconcile.controller_uid(existing)
                if owner != ctx.uid:
                    plan = reconcile.object_conflict(self.view(), kind, name, owner, now)
                    await self.patch(plan.status)
                    self.emit(plan)
                    self.log.warning("name_conflict", kind=kind, object=name, owner=owner)
                    return False
        return True

    async def ensure_dataset(self, ctx: builders.RunContext, now: datetime, pods: list[PodView]) -> float | None:
        """The dataset volume and the fetch Job, before any worker exists.

        Returns None when the data is ready (the pass goes on to the workers), seconds until the next
        look while it is fetched, or -1 when the fetch failed (the run's final status is written).
        """
        settings = self.datasets
        name = builders.fetch_job_name(ctx.task.dataset)
        admitted = c.parse_time(self.status.get("startTime"))
        try:
            if not self.pvc_ensured:  # a shared per-namespace cache: created when missing, never owned by a run
                await self.kube.run(self.kube.create, builders.dataset_pvc(self.namespace, settings))
                self.pvc_ensured = True
            job = await self.kube.run(self.kube.get, "Job", self.namespace, name)
            job_pods: list[dict[str, Any]] = []
            if job is not None:
                job_pods = await self.kube.run(self.kube.list_pods, self.namespace, f"{n.LABEL_JOB_NAME}={name}")
            state = datasets.fetch_state(name, job, job_pods, admitted, settings.volume_name)
            if state.action is datasets.FetchAction.CREATE:  # 409: another run's, shared
                await self.kube.run(self.kube.create, builders.fetch_job(ctx, settings))
        except ApiError as err:
            if err.status not in (403, 422):
                raise
            # 403 (quota, policy) may pass later: shown and retried; 422 (invalid) never will: the run fails
            state = datasets.refused(err.status, err.detail, settings.volume_name, name)
        if state.action is datasets.FetchAction.REPLACE:
            self.log.info("dataset_job_replaced", job=name, message=state.message)
            await self.kube.run(self.kube.delete_job, self.namespace, name)
        plan = reconcile.dataset_plan(self.view(), state, now)
        await self.patch(plan.status)
        self.emit(plan)
        if plan.terminal:
            self.log.warning("dataset_failed", job=name, reason=state.reason.value, message=state.message)
            return -1
        if state.action is datasets.FetchAction.READY:
            self.log.info("dataset_ready", job=name)
            return None
        # Job events wake us; the timer covers pod-only changes (e.g. a pod stuck Pending) and deletions.
        return min(plan.requeue_after or DATASET_POLL_SECONDS, DATASET_POLL_SECONDS)

    async def finished(self, now: datetime, pods: list[PodView]) -> float | None:
        """Terminal: keep the results, then apply cleanPodPolicy until done (idempotent: derived from
        the pods still there).

        Returns None (nothing left to do) once the results are recorded and nothing is left to delete;
        ttlSecondsAfterFinished is handled by :func:`expire_run`.
        """
        decision = await self.keep_results(now, pods)
        todo = reconcile.cleanup_pending(self.view(), pods)
        spared = {n.launcher_name(self.name)} if decision.holds_launcher else set()  # its log is still to be read
        if decision.spares_worker0:  # a launcher still running may be reading rank 0's files there
            spared.add(n.worker_name(self.name, 0))
        todo = [p for p in todo if p not in spared]
        if not todo:
            if reconcile.cleanup_unrecorded(self.view(), pods):  # deleted before a restart, never recorded
                await self.patch(reconcile.cleaned_up_status(self.view(), pods, now))
            return decision.retry_after
        self.log.info("cleanup", pods=len(todo))
        # All or nothing: an error raises, and the next pass (or a restarted operator) deletes what is left.
        await self.kube.delete_pods_named(self.namespace, todo)
        deleted = set(todo)
        after = [dataclasses.replace(p, terminating=True) if p.name in deleted else p for p in pods]
        if self.index is not None:  # before the status write below: kopf re-checks _needs_daemon on its event,
            # which may come before the pod watch's; with the pods still live there it would keep this daemon
            for pod in after:
                if pod.name in deleted:
                    self.index.update(PodChange(pod.uid or pod.name, (self.namespace, self.name), pod))
        # In the same pass (kopf may stop this daemon once the index shows the pods Terminating):
        # workers.ready recounted, and the run's last event, on which kopf releases the finalizer.
        await self.patch(reconcile.cleaned_up_status(self.view(), after, now))
        return decision.retry_after

    async def keep_results(self, now: datetime, pods: list[PodView]) -> results.Decision:
        """Copy the launcher's results line into the ``<run>-results`` ConfigMap (once; see .results).

        Never raises for a problem with the log or the ConfigMap: those retry within the policy's
        window and then give up, so the cleanup is never blocked by the results. A status write the
        API server refuses is not such a problem and is not reported as one: it raises
        :class:`StatusRefused` (see :meth:`patch`).
        """
        uid = self.body["metadata"].get("uid", "")
        pod = results.launcher(pods, uid)
        decision = results.decide(self.status, pod, now, self.results_wait)
        if decision.action is results.Action.COLLECT and pod is not None:
            decision = await self.collect(pod, uid, now)
        if decision.action is results.Action.GIVE_UP:
            missing = self.results_record(results.missing_status(decision.message, now))
            await self.patch({**self.status, "results": missing})
            if pod is not None:  # a run that never launched has nothing to lose: no Event
                self.event("Warning", "ResultsNotKept", decision.message)
            self.log.warning("results_not_kept", message=decision.message)
        return decision

    def results_record(self, outcome: dict[str, Any]) -> dict[str, Any]:
        """``status.results`` = ``outcome``, keeping ``failingSince`` (the status is a merge patch: it stays
        stored anyway, and our copy must say what is stored)."""
        since = (self.status.get("results") or {}).get("failingSince")
        return {"failingSince": since, **outcome} if since else outcome

    async def collect(self, pod: PodView, uid: str, now: datetime) -> results.Decision:
        """Read the launcher's log and keep its results line; a failure is retried (see :meth:`retry_later`)."""
        try:
            text = await self.kube.run(
                self.kube.read_log,
                self.namespace,
                pod.name,
                n.LAUNCHER_CONTAINER,
                results.TAIL_LINES,
                results.LOG_BYTES,
            )
        except Exception as err:  # the API, the kubelet or the network: retried, then given up
            return await self.retry_later(err, results.READING_LOG, now)
        # decoding, unzipping and compressing again take CPU seconds at the limits: off the event loop
        found, why = await asyncio.to_thread(results.from_log, text)
        if found is not None:
            await asyncio.to_thread(found.compressed_size)  # computed once, kept
        if found is None:
            return results.Decision(results.Action.GIVE_UP, why)
        return await self.store_results(found, uid, now)

    async def retry_later(self, err: Exception, doing: str, now: datetime) -> results.Decision:
        """A failed attempt at the results: WAIT (the first failure's time recorded in
        ``status.results.failingSince``, so the window survives an operator restart) or GIVE_UP."""
        gone = doing == results.READING_LOG and isinstance(err, ApiError) and err.status == 404
        detail = err.detail if isinstance(err, ApiError) else f"{type(err).__name__}: {err}"
        decision = results.after_error(self.status, detail[:500], gone, now, doing=doing, wait=self.results_wait)
        if decision.action is results.Action.WAIT:
            self.log.info("results_retry", doing=doing, error=detail[:300], retry_in=decision.retry_after)
            retrying = results.retrying_status(self.status, now)
            if (self.status.get("results") or {}) != retrying:
                await self.patch({**self.status, "results": retrying})
        return decision

    async def store_results(self, found: bundle.Bundle, uid: str, now: datetime) -> results.Decision:
        task = (self.body["spec"].get("taskRef") or {}).get("name", "")
        obj = builders.results_config_map(self.name, self.namespace, uid, task, found)
        name = obj["metadata"]["name"]
        if found.compressed_size() > bundle.BUDGET_BYTES:  # a launcher of another version: never sent as is
            size = found.compressed_size()
            return results.Decision(results.Action.GIVE_UP, f"the results are {size} bytes compressed, over the limit")
        try:
            refused = await self.create_results_config_map(obj, uid)
        except Exception as err:  # 429, 5xx, a timeout, deleted in between: retried, then given up
            return await self.retry_later(err, f"keep the results in ConfigMap {name}", now)
        if refused is not None:
            return refused
        await self.patch({**self.status, "results": self.results_record(results.kept_status(self.name, found, now))})
        message = f"results kept in ConfigMap {name} ({found.compressed_size()} bytes compressed)"
        self.event("Normal", "ResultsKept", message)
        self.log.info("results_kept", config_map=name, bytes=found.compressed_size(), truncated=found.truncated)
        return results.Decision(results.Action.NONE)

    async def create_results_config_map(self, obj: dict[str, Any], uid: str) -> results.Decision | None:
        """Create ``<run>-results``: None when it exists and is this run's, a GIVE_UP when it never will be;
        raises what a retry may get past."""
        name = obj["metadata"]["name"]
        try:
            created = await self.kube.run(self.kube.create, obj)
        except ApiError as err:
            if not transient(err):  # quota, policy, too large: a retry will not pass
                return results.Decision(results.Action.GIVE_UP, f"cannot create ConfigMap {name}: {err.detail}")
            raise
        if not created:  # 409: ours from an interrupted pass, or someone else's
            existing = await self.kube.run(self.kube.get, "ConfigMap", self.namespace, name)
            if existing is None:  # deleted in between (garbage collection): create it on the next pass
                raise kopf.TemporaryError(f"ConfigMap {name} vanished after a conflict", delay=1)
            if reconcile.controller_uid(existing) != uid:
                return results.Decision(results.Action.GIVE_UP, f"ConfigMap {name} exists and is not this run's")
        return None


@kopf.daemon(GROUP, VERSION, PLURAL, when=_needs_daemon, cancellation_backoff=5, cancellation_timeout=5)
async def reconcile_run(
    *,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: kopf.Memo,
    logger: Any,
    stopped: kopf.DaemonStopped,
    **kwargs: Any,
) -> None:
    """The run's reconcile loop; event-driven (woken by pod/run events), resumed after operator restarts.

    A pass with nothing left to do (a finished run, cleaned up, results kept) does not end the loop: it
    waits to be woken. kopf never spawns again a daemon that returned on its own, so a cleanPodPolicy
    edited after the run finished would go unheeded until the operator restarts. kopf stops the daemon
    when :func:`_needs_daemon` no longer holds, and spawns it again when it does."""
    key = (namespace or "", name)
    wake = memo.wakeups.register(key)
    config = config_of(memo)
    rec = RunReconciler(body, memo.kube, logger, config)
    rec.index = getattr(memo, "pods", None)
    failures = 0
    try:
        while True:
            wake.clear()
            try:
                delay = await rec.step(pods_of(memo, key))
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as err:  # any error: record, back off, retry from the cluster's state
                failures += 1
                m.RECONCILE_ERRORS.labels(m.RUN_KIND, type(err).__name__).inc()
                rec.log.warning("reconcile_error", error=str(err), failures=failures)
                delay = getattr(err, "delay", None) or min(2.0**failures, 60.0)
                rec.recover(body.get("status") or {})
            if stopped or await Wakeups.sleep(wake, stopped, delay, config.debounce_seconds):
                return
    finally:
        memo.wakeups.unregister(key, wake)


@kopf.daemon(GROUP, VERSION, PLURAL, when=_waits_for_ttl, cancellation_timeout=5)
async def expire_run(
    *, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """ttlSecondsAfterFinished: delete the finished run when it expires. A daemon of its own, spawned
    whenever the filter starts to match, so a TTL added (or changed) after the run finished counts."""
    kube: Kube = memo.kube
    resync = config_of(memo).resync_seconds
    polls = 0  # looks at the sweep so far: a sweep that never records (invalid since) is asked less and less often
    while not stopped:
        ttl = (body.get("spec", {}).get("runPolicy") or {}).get("ttlSecondsAfterFinished")
        left = reconcile.ttl_expired(body.get("status") or {}, ttl, _now())
        if left is None:  # not finished / no TTL any more: kopf stops us on the next event
            await stopped.wait(resync)
            continue
        if left > 0:
            await stopped.wait(min(left, 60.0))  # the live body may change the TTL meanwhile
            continue
        if not await _sweep_recorded(kube, namespace or "", body):
            if not polls:
                log.info("run_ttl_waits_for_sweep", run=name, namespace=namespace, ttl=ttl)
            await stopped.wait(sweep_poll_seconds(polls, resync))
            polls += 1
            continue
        log.info("run_ttl_expired", run=name, namespace=namespace, ttl=ttl)
        await kube.run(kube.delete_run, namespace or "", name)
        return


def sweep_poll_seconds(polls: int, resync: float) -> float:
    """The wait before looking at a sweep again after ``polls`` looks found the run's outcome unrecorded: 1 s, then
    doubling up to ``resync``. The sweep records at once on the run's last phase change, so the first wait is
    the usual one; a sweep that does not (made invalid by an upgrade: it stops writing) is not asked every second
    by each of its expired runs for as long as it stays so."""
    return min(SWEEP_RECORD_POLL_SECONDS * 2.0 ** min(polls, 30), max(resync, SWEEP_RECORD_POLL_SECONDS))


async def _sweep_recorded(kube: Kube, namespace: str, body: kopf.Body) -> bool:
    """A sweep's run: whether its sweep has written down how it ended (see :func:`.sweeps.outcome_recorded`)."""
    sweep_name = sweeps.sweep_of(body)
    if not sweep_name:
        return True
    return sweeps.outcome_recorded(await kube.run(kube.get, "BenchmarkSweep", namespace, sweep_name), body)


# -- progress ------------------------------------------------------------------------------------------------
def _is_running(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") == "Running"


async def scrape_rank0(namespace: str, name: str, pods: PodIndex, uid: str, attempt: int) -> dict[str, Any] | None:
    """``status.progress`` from rank 0 (worker 0 of the run's current attempt, :func:`reconcile.rank0`); None
    when unreachable (kwok, start-up) or empty."""
    rank0 = reconcile.rank0(pods.get((namespace, name)), uid, attempt)
    if rank0 is None or rank0.ip is None:
        return None
    return await progress.scrape(rank0.ip, PROGRESS_PORT, _now())


#: How often rank 0's metrics are copied into ``status.progress`` (``kubectl get br``'s EPOCH, ACCURACY).
#: Read from the environment at import, not from ``memo.config``: ``@kopf.timer(interval=...)`` below
#: takes it when the module is imported, before main.py (or kopf) has any memo to give.
PROGRESS_SECONDS = float(os.environ.get("MLBENCH_PROGRESS_SECONDS", "30"))


@kopf.timer(
    GROUP, VERSION, PLURAL, interval=PROGRESS_SECONDS, initial_delay=min(15.0, PROGRESS_SECONDS), when=_is_running
)
async def scrape_progress(
    *,
    namespace: str | None,
    name: str,
    uid: str | None,
    status: kopf.Status,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Live progress while Running; an unreachable endpoint just means no update. Written only if the run
    is still Running in the same attempt when the scrape returns (:meth:`Kube.patch_running_progress`)."""
    restarts = status.get("restarts")
    ns = namespace or ""
    value = await scrape_rank0(ns, name, memo.get("pods") or PodIndex(), uid or "", int(restarts or 0))
    if value is None:
        return
    kube: Kube = memo.kube
    new = progress.advance(status.get("progress"), value, _now())
    if not await kube.run(kube.patch_running_progress, ns, name, new, restarts):
        log.info("progress_dropped", run=name, namespace=ns, reason="the run is no longer Running in that attempt")


from mlbench_operator import sweep_handlers  # noqa: E402,F401  (registers the sweep handlers)
