"""The run's executor: one daemon's state, a pass from the run's context to the plan carried out."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from mlbench_api import bundle, hardware
from mlbench_api.run import TERMINAL, Phase
from mlbench_operator import builders, datasets, logs, netpol, sshkeys
from mlbench_operator import conditions as c
from mlbench_operator import metrics as m
from mlbench_operator import naming as n
from mlbench_operator import pacing as pc
from mlbench_operator.kube import ApiError, Kube, transient
from mlbench_operator.podview import PodChange, PodIndex, PodView
from mlbench_operator.run import (
    admission,
    kueue,
    lifecycle,
    mounts,
    nodes,
    ownership,
    policies,
    queueing,
    results,
    suspension,
)
from mlbench_operator.run.nodes import NodeState
from mlbench_operator.run.status import (
    Plan,
    failed_status,
    finalize,
    first_ready,
    kept_after_failure,
    restarted,
    unstorable_status,
)
from mlbench_operator.runtime import DEFAULT_CONFIG, status_patch, write_status
from mlbench_operator.settings import OperatorConfig

log = logs.get_logger()


def _now() -> datetime:
    return datetime.now(UTC)


#: While a dataset is fetched: look again this often even without a Job event.
DATASET_POLL_SECONDS = 10.0


#: While a run waits for Kueue: look at its Workload again this often (no watch on Workloads).
QUEUE_POLL_SECONDS = 3.0


#: A failed launcher's log tail kept in an Event at a gang restart: lines read, and the wait for them.
LAUNCHER_LOG_LINES = 30


#: ... and at most this much of them (the Event keeps its last KiB).
LAUNCHER_LOG_BYTES = 64 * 1024


LAUNCHER_LOG_SECONDS = 5.0


#: One semaphore per event loop (the operator has one; tests start many): results collections at once.
_COLLECTING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def collecting() -> asyncio.Semaphore:
    """The running loop's limit on concurrent results collections (:data:`results.MAX_CONCURRENT_COLLECTIONS`)."""
    loop = asyncio.get_running_loop()
    if loop not in _COLLECTING:
        _COLLECTING[loop] = asyncio.Semaphore(results.MAX_CONCURRENT_COLLECTIONS)
    return _COLLECTING[loop]


@dataclasses.dataclass(frozen=True)
class _Stop:
    """A pass that ends before the plan: what :meth:`RunReconciler.step` returns (the next wake-up, or None)."""

    delay: float | None


class _Refused(Exception):
    """The API server refused some of a run's objects: (what, HTTP status, its message) each."""

    def __init__(self, failures: list[tuple[str, int, str]]) -> None:
        super().__init__(failures)
        self.failures = failures


class _Conflict(Exception):
    """A name the run needs is held by an object the operator did not create for the run."""

    def __init__(self, kind: str, name: str, why: str) -> None:
        super().__init__(kind, name, why)
        self.kind, self.name, self.why = kind, name, why


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
        self.queue_released = False  #: a finished run's Kueue Workload is marked Finished
        #: The operator's pod index (memo.pods), told at once of the pods a cleanup deleted (see finished).
        self.index: PodIndex | None = None

    def view(self) -> dict[str, Any]:
        """The run as the planner should see it: live metadata/spec, our own status."""
        return {"metadata": dict(self.body["metadata"]), "spec": dict(self.body["spec"]), "status": self.status}

    def recover(self, live_status: Mapping[str, Any]) -> None:
        """After a failed pass: trust the cluster's status again, unless ours is provably newer
        (:func:`.status.kept_after_failure`)."""
        self.status = dict(kept_after_failure(self.status, live_status or {}))

    def event(self, type_: str, reason: str, message: str) -> None:
        kopf.event(self.body, type=type_, reason=reason, message=c.clean(message)[:1024])

    async def patch(self, new: dict[str, Any]) -> None:
        """Write the status (as :func:`finalize` completes it). A 422 (a value the API server
        cannot store) ends an unfinished run as Failed/InvalidResult with a minimal status instead of
        retrying the same refused write forever; a finished run keeps its phase and outcome, the refused
        part dropped or recorded (:func:`results.refused_write`). Either way :class:`StatusRefused`
        stops the pass, and the next one goes on (cleans up)."""
        now = _now()
        changes = status_patch(self.status, finalize(new, now))
        if not changes:
            return
        try:
            await write_status(self.kube, self.kube.patch_run_status, self.namespace, self.name, changes)
        except ApiError as err:
            if err.status != 422:
                raise
            finished = self.status.get("phase") in TERMINAL
            instead = (
                results.refused_write(changes, err.detail, now)
                if finished
                else unstorable_status(self.status, err.detail, now)
            )
            fallback = status_patch(self.status, instead)
            await write_status(self.kube, self.kube.patch_run_status, self.namespace, self.name, fallback)
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
        if not suspension.managed_here(self.body["spec"]):
            return None  # spec.managedBy names another controller: not ours to touch
        if self.status.get("phase") in TERMINAL:
            return await self.finished(now, pods)
        live = (self.body.get("status") or {}).get("progress")
        if live is not None:  # written by the scrape timer, not by us: the planner's NoProgress reads it
            self.status["progress"] = live
        else:  # none, or cleared by a gang restart: a copy read before the watch echoed that must not linger
            self.status.pop("progress", None)
        ctx = await self.run_context(now, pods)
        if not isinstance(ctx, _Stop):
            ctx = await self.gate(ctx, now, pods)
        if isinstance(ctx, _Stop):
            return ctx.delay
        ready = await self.prepare(ctx, now, pods)
        if ready is not None:
            return ready.delay
        volumes = await self.mount_failures(ctx, pods, now)
        states = await self.node_states(ctx, pods, now)
        return await self.execute(
            policies.plan(self.view(), ctx, pods, now, mounts=volumes, nodes=states), ctx, now, pods
        )

    def _current(self, ctx: builders.RunContext, pods: list[PodView]) -> list[PodView]:
        attempt = int(self.status.get("restarts") or 0)
        return [p for p in pods if p.attempt == attempt and p.owner_uid == ctx.uid]

    async def node_states(self, ctx: builders.RunContext, pods: list[PodView], now: datetime) -> dict[str, NodeState]:
        """What the current workers' nodes say (Ready, the kubelet's Lease), read only once the launcher failed
        (:mod:`.nodes`): a node lost under a running world is a disruption, not the run's failure."""
        current = self._current(ctx, pods)
        launcher = next((p for p in current if p.role == n.ROLE_LAUNCHER), None)
        found: dict[str, NodeState] = {}
        for node in nodes.to_check([p for p in current if p.role == n.ROLE_WORKER], launcher):
            try:
                obj = await self.kube.run(self.kube.node, node)
                lease = await self.kube.run(self.kube.node_lease, node)
            except ApiError as err:  # a diagnosis only: without it the failure is the launcher's, as before
                self.log.warning("node_unreadable", node=node, status=err.status, detail=err.detail[:300])
                continue
            found[node] = nodes.judge(obj, lease, now)
        return found

    async def mount_failures(
        self, ctx: builders.RunContext, pods: list[PodView], now: datetime
    ) -> dict[str, tuple[c.Reason, str]]:
        """What the Events say of the current workers that wait, scheduled, for their volumes (:mod:`.mounts`)."""
        workers = [p for p in self._current(ctx, pods) if p.role == n.ROLE_WORKER]
        found: dict[str, tuple[c.Reason, str]] = {}
        for pod in mounts.to_check(workers, now):
            try:
                events = await self.kube.run(self.kube.list_events, self.namespace, mounts.field_selector(pod))
            except ApiError as err:  # a diagnosis only: without it the run still waits, as before
                self.log.warning("events_unreadable", pod=pod.name, status=err.status, detail=err.detail[:300])
                return found
            failure = mounts.failure(events)
            if failure is not None:
                found[pod.name] = failure
        return found

    async def run_context(self, now: datetime, pods: list[PodView]) -> builders.RunContext | _Stop:
        """Admit the run (first pass: resolve its task, snapshot it, check the policy) or rebuild its
        context from the snapshot; a run that cannot start or be rebuilt ends here, Failed."""
        snapshot = self.status.get("taskSnapshot")
        if snapshot:
            try:
                ctx = admission.context(self.view(), snapshot, self.config.runner_uid, self.datasets.volume_name)
            except ValueError as err:
                # Final status first, then the cleanup by the raw spec.runPolicy.cleanPodPolicy (in finished).
                message = f"cannot rebuild the configuration: {err}"
                await self.patch(failed_status(self.view(), c.Reason.INVALID_CONFIG, message, now))
                self.event("Warning", c.Reason.INVALID_CONFIG, message)
                return _Stop(await self.finished(now, pods))
            return self._configured(ctx)
        task_name = (self.body["spec"].get("taskRef") or {}).get("name", "")
        task = await self.kube.run(self.kube.get_task, task_name)
        admitted = admission.admit(
            self.view(), task, self.config.runner_uid, self.datasets.volume_name, self.config.policy
        )
        if isinstance(admitted, admission.Rejection):
            await self.patch(admission.rejected_status(self.view(), admitted, now))
            self.event("Warning", admitted.reason, admitted.message)
            self.log.warning("run_rejected", reason=admitted.reason, message=admitted.message)
            return _Stop(await self.finished(now, pods))
        ctx, snapshot = admitted
        ctx = self._configured(ctx)
        await self.patch(admission.admitted_status(self.view(), ctx, snapshot, now))
        self.event("Normal", "Admitted", f"task {ctx.task_name} snapshotted; creating {ctx.spec.workers} workers")
        self.log.info("run_admitted", task=ctx.task_name, workers=ctx.spec.workers)
        return ctx

    async def gate(self, ctx: builders.RunContext, now: datetime, pods: list[PodView]) -> builders.RunContext | _Stop:
        """spec.suspend and a queue's admission (:mod:`.suspension`, :mod:`.kueue`): a held run releases its pods
        and stops here; an admitted one gets its flavors' placement."""
        queue = kueue.queue_name(self.body)
        queued = await self.kueue_admission(ctx, queue) if queue else None
        held = suspension.gate(self.body["spec"], queued)
        if held is not None:
            plan = suspension.held_plan(self.view(), ctx.uid, pods, held, now)
            await self.patch(plan.status)
            self.emit(plan)
            if plan.delete_stale:
                await self.kube.delete_pods_named(self.namespace, plan.delete_stale, uids=plan.delete_stale)
            return _Stop(QUEUE_POLL_SECONDS if queue else None)  # a Workload's change wakes nobody: look again
        held_before = self.status.get("phase") == Phase.SUSPENDED  # the parse below only then
        resumed = suspension.resumed_status(self.view(), queued, now) if held_before else None
        refused = admission.scheduling_rejection(self.view(), self.config.policy) if resumed is not None else None
        if refused is not None:  # spec.scheduling changed while suspended: the admin's policy again
            await self.patch(admission.rejected_status(self.view(), refused, now))
            self.event("Warning", refused.reason, refused.message)
            return _Stop(await self.finished(now, pods))
        if resumed is not None:
            await self.patch(resumed)
            self.event("Normal", c.SUSPENDED, resumed.get("message", ""))
        if queued is None or not queued.flavors:
            return ctx
        flavors = [await self.kube.run(queueing.get_flavor, self.kube, f) for f in queued.flavors]
        labels, tolerations = kueue.placement(flavors)
        return dataclasses.replace(ctx, spec=kueue.with_placement(ctx.spec, labels, tolerations))

    async def kueue_admission(self, ctx: builders.RunContext, queue: str) -> kueue.Admission:
        """The run's Workload, created when missing, as Kueue has admitted it or not."""
        name = kueue.workload_name(self.name, ctx.uid)
        found = await self.kube.run(queueing.get_workload, self.kube, self.namespace, name)
        if found is None:
            worker, launcher = builders.worker_pod(ctx, 0, 0), builders.launcher_pod(ctx, 0)
            obj = kueue.workload(
                self.name,
                self.namespace,
                ctx.uid,
                queue=queue,
                worker=worker,
                launcher=launcher,
                count=ctx.spec.workers,
            )
            await self.kube.run(queueing.create_workload, self.kube, obj)
            self.log.info("workload_created", workload=name, queue=queue)
        return kueue.admission(found, name, queue)

    async def release_queue(self) -> None:
        """A finished run's Workload is marked Finished once (Kueue releases its quota)."""
        queue, phase = kueue.queue_name(self.body), self.status.get("phase")
        if queue is None or self.queue_released or phase not in TERMINAL:
            return
        name = kueue.workload_name(self.name, self.body["metadata"].get("uid", ""))
        await self.kube.run(
            queueing.finish_workload, self.kube, self.namespace, name, kueue.finished_patch(phase, _now())
        )
        self.queue_released = True

    def _configured(self, ctx: builders.RunContext) -> builders.RunContext:
        """The operator's settings that shape the pods but are no part of the run's snapshot."""
        return dataclasses.replace(
            ctx, metrics_linger_seconds=self.linger, node_loss_seconds=self.config.node_loss_seconds
        )

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

    async def execute(self, plan: Plan, ctx: builders.RunContext, now: datetime, pods: list[PodView]) -> float | None:
        """Carry out a plan: the status first (a result, a restart), then deletes, then creates."""
        if plan.create_launcher and not self.service_ensured and not self.pacing.creates_paused(time.monotonic()):
            stopped = await self.ensure_service(ctx, now, pods)  # before the status says "creating the launcher"
            if stopped is not None:
                return stopped.delay
        ready_now = first_ready(self.status, plan.status)
        restart = restarted(self.status, plan.status)
        await self.patch(plan.status)  # results and restarts are recorded before the world is changed
        # the status says it now: its Events too, before a delete or create below can fail the pass (the
        # retry plans from the new status and would not say it again)
        self.emit(plan)
        if restart:  # counted where it is recorded, once, whether or not stale pods remain to delete
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
        try:
            refused = await self.create_pods(plan, ctx, now)
        except _Conflict as held:
            return await self.name_conflict(held, now)
        if refused:
            return await self.creation_refused(refused, now, pods)
        if ready_now:
            created = c.parse_time(self.body["metadata"].get("creationTimestamp"))
            if created is not None:
                m.WORKERS_READY_SECONDS.observe(max((now - created).total_seconds(), 0.0))
        return pacing.wake_in(plan.requeue_after)

    async def create_pods(self, plan: Plan, ctx: builders.RunContext, now: datetime) -> list[tuple[str, int, str]]:
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
        await self.check_held([obj for obj, res in zip(todo, outcomes, strict=True) if res is False], ctx.uid)
        await self.record_launcher(todo, outcomes, attempt)
        if errors:
            delay = 5.0
            if any(transient(e) for e in errors):
                # an overloaded or failing API server: the 403 backoff, which a pod event does not cut short
                delay = pacing.creates_refused(time.monotonic())
            raise kopf.TemporaryError(f"{len(errors)} of {len(todo)} pod creations failed: {errors[0]}", delay=delay)
        pacing.creates_succeeded()
        return []

    async def record_launcher(self, todo: list[dict[str, Any]], outcomes: list[Any], attempt: int) -> None:
        """``status.launcher``: the UID the API server answered the launcher's create with (only that pod is
        accepted as the attempt's launcher: :func:`ownership.launcher_refused`)."""
        launcher = n.launcher_name(self.name)
        for obj, res in zip(todo, outcomes, strict=True):
            if obj["metadata"]["name"] == launcher and isinstance(res, str):
                await self.patch({**self.status, "launcher": {"uid": res, "attempt": attempt}})

    async def check_held(self, objs: list[dict[str, Any]], uid: str) -> None:
        """Objects whose create was answered 409: raise :class:`_Conflict` for the first one the operator did not
        create for this run (an unlabelled pod under a worker's name is invisible to the planner: without this
        it would be created again every pass, in silence); one gone since is created again by the next pass."""
        for obj in objs:
            kind, name = obj["kind"], obj["metadata"]["name"]
            read = self.kube.get_pod if kind == "Pod" else functools.partial(self.kube.get, kind)
            existing = await self.kube.run(read, self.namespace, name)
            why = None if existing is None else ownership.not_ours(existing, self.name, uid)
            if why is not None:
                raise _Conflict(kind, name, why)

    async def name_conflict(self, held: _Conflict, now: datetime) -> float:
        """Report a held name (:func:`lifecycle.object_conflict`) and look again later."""
        launcher = held.kind == "Pod" and held.name == n.launcher_name(self.name)
        condition = c.RUNNING if launcher else c.WORKERS_READY
        plan = lifecycle.object_conflict(self.view(), held.kind, held.name, held.why, now, condition=condition)
        await self.patch(plan.status)
        self.emit(plan)
        self.log.warning("name_conflict", kind=held.kind, object=held.name, why=held.why)
        return min(30.0, self.config.resync_seconds)

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

    def emit(self, plan: Plan) -> None:
        for type_, reason, message in plan.events:
            self.event(type_, reason, message)
            self.log.info("run_transition", reason=reason, message=message)

    def until_deadline(self, delay: float | None, now: datetime) -> _Stop:
        """A held run's next pass: after ``delay``, or when its deadline passes if that comes first."""
        return _Stop(lifecycle.by_deadline(delay, lifecycle.deadline_left(self.view(), now)))

    async def held_past_deadline(self, now: datetime, pods: list[PodView], doing: str) -> _Stop | None:
        """The run ends ``Failed``/``DeadlineExceeded`` if its deadline has passed while it was held before its
        pods (:func:`lifecycle.deadline_while`); None: not yet."""
        plan = lifecycle.deadline_while(self.view(), now, doing)
        if plan is None:
            return None
        await self.patch(plan.status)
        self.emit(plan)
        return _Stop(await self.finished(now, pods))

    async def creation_refused(
        self, refused: list[tuple[str, int, str]], now: datetime, pods: list[PodView]
    ) -> float | None:
        """403/422 on pod creates: a visible condition and Event; a final refusal (422, Pod Security) fails the
        run, another backs off (:func:`lifecycle.refusal_is_final`)."""
        plan = lifecycle.creation_failed(self.view(), refused, now)
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
            netpol.network_policy(ctx, self.config.scraper_namespaces, self.config.scraper_cidrs),
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
                why = ownership.not_ours(existing, self.name, ctx.uid)
                if why is not None:
                    await self.name_conflict(_Conflict(kind, name, why), now)
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
                policy = netpol.fetch_network_policy(name, self.namespace, ctx.task.dataset.name, settings.egress_cidrs)
                await self.kube.run(self.kube.create, policy)
                await self.kube.run(self.kube.create, builders.fetch_job(ctx, settings))
        except ApiError as err:
            if err.status not in (403, 422):
                raise
            # 403 (quota, policy) may pass later: shown and retried; 422 (invalid) never will: the run fails
            state = datasets.refused(err.status, err.detail, settings.volume_name, name)
        if state.action is datasets.FetchAction.REPLACE:
            self.log.info("dataset_job_replaced", job=name, message=state.message)
            await self.kube.run(self.kube.delete_job, self.namespace, name)
        plan = lifecycle.dataset_plan(self.view(), state, now)
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
        await self.release_queue()
        decision = await self.keep_results(now, pods)
        todo = lifecycle.cleanup_pending(self.view(), pods)
        spared = {n.launcher_name(self.name)} if decision.holds_launcher else set()  # its log is still to be read
        if decision.spares_worker0:  # a launcher still running may be reading rank 0's files there
            spared.add(n.worker_name(self.name, 0))
        todo = [p for p in todo if p not in spared]
        if not todo:
            if lifecycle.cleanup_unrecorded(self.view(), pods):  # deleted before a restart, never recorded
                await self.patch(lifecycle.cleaned_up_status(self.view(), pods, now))
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
        await self.patch(lifecycle.cleaned_up_status(self.view(), after, now))
        return decision.retry_after

    async def keep_results(self, now: datetime, pods: list[PodView]) -> results.Decision:
        """Copy the launcher's results line into the ``<run>-results`` ConfigMap (once; see .results).

        Never raises for a problem with the log or the ConfigMap: those retry within the policy's
        window and then give up, so the cleanup is never blocked by the results. A status write the
        API server refuses is not such a problem and is not reported as one: it raises
        :class:`StatusRefused` (see :meth:`patch`).
        """
        uid = self.body["metadata"].get("uid", "")
        pod = results.launcher(pods, uid, self.status.get("launcher"))
        decision = results.decide(self.status, pod, now, self.results_wait)
        if decision.action is results.Action.COLLECT and pod is not None:
            decision = results.interrupted(self.status) or await self.attempt(pod, uid, now)
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
        return results.ended(self.status, {"failingSince": since, **outcome} if since else outcome)

    async def attempt(self, pod: PodView, uid: str, now: datetime) -> results.Decision:
        """One collection, at most :data:`results.MAX_CONCURRENT_COLLECTIONS` at once operator-wide, recorded
        in ``status.results.attempts`` before the log is read (see :func:`results.interrupted`)."""
        async with collecting():
            await self.patch({**self.status, "results": results.attempt_status(self.status)})
            return await self.collect(pod, uid, now)

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
            found = results.with_hardware(found, await self.node_labels(results.nodes_to_read(found)))
            await asyncio.to_thread(found.compressed_size)  # computed once, kept
        if found is None:
            return results.Decision(results.Action.GIVE_UP, why)
        return await self.store_results(found, uid, now)

    async def node_labels(self, nodes: list[str]) -> dict[str, dict[str, str]]:
        """The labels of the nodes the ranks ran on (the result's hardware). A node that cannot be read (gone,
        forbidden, the API busy) is left out: its fields stay null, and the results are kept regardless."""
        found: dict[str, dict[str, str]] = {}
        for node in nodes[: hardware.MAX_NODES_READ]:
            try:
                labels = await self.kube.run(self.kube.node_labels, node)
            except Exception as err:  # never a reason to lose the results
                self.log.warning("node_labels_unread", node=node, error=f"{type(err).__name__}: {err}"[:300])
                continue
            if labels is not None:
                found[node] = labels
        return found

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
            why = ownership.not_ours(existing, self.name, uid)
            if why is not None:
                text = f"{c.Reason.NAME_CONFLICT}: {ownership.conflict_text('ConfigMap', name, why)}"
                return results.Decision(results.Action.GIVE_UP, text.removesuffix("; waiting for it to be deleted"))
        return None
