"""The sweep's kopf handlers: events wake its daemon, the daemon creates the planned runs and writes the status."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from mlbench_api.common import GROUP, VERSION
from mlbench_api.sweep import LABEL_SWEEP
from mlbench_operator import logs, runtime
from mlbench_operator import metrics as m
from mlbench_operator.kube import ApiError, Kube
from mlbench_operator.podview import controller_uid
from mlbench_operator.runtime import Wakeups, config_of
from mlbench_operator.settings import OperatorConfig
from mlbench_operator.sweep import plan

log = logs.get_logger()


def _now() -> datetime:
    return datetime.now(UTC)


PLURAL = "benchmarksweeps"


RUNS = "benchmarkruns"


#: After a refused create or a name conflict: look again this often (events also wake the sweep).
STALLED_RETRY_SECONDS = 30.0


#: A pass whose second plan (after a 409 showed a run of ours in its real phase) holds runs it did not create:
#: the next pass, which creates them, comes this soon (the status counts them as created meanwhile).
REPLAN_SECONDS = 1.0


def _wakeups(memo: Any) -> Wakeups:
    wakeups = getattr(memo, "sweep_wakeups", None)
    if not isinstance(wakeups, Wakeups):  # a handler called without the startup (unit tests)
        wakeups = Wakeups()
        memo.sweep_wakeups = wakeups
    return wakeups


async def configure_sweeps(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """After :func:`.configure` (registered before this module is imported): the selector for sweeps."""
    selector = config_of(memo).run_selector
    if selector:
        settings.watching.label_selectors[GROUP, PLURAL] = selector
    memo.sweep_wakeups = Wakeups()


async def sweep_run_event(namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    _wakeups(memo).wake((namespace or "", labels[LABEL_SWEEP]))


async def sweep_event(
    *, type: str, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **_: Any
) -> None:
    status = body.get("status") or {}
    generation = body.get("metadata", {}).get("generation")
    if status.get("observedGeneration") == generation:
        return  # e.g. our own status write echoed back: nothing new for the daemon
    _wakeups(memo).wake((namespace or "", name))
    if type != "DELETED" and status.get("completionTime"):
        # a finished sweep's spec edited (its daemon has stopped): observedGeneration still catches up
        kube: Kube = memo.kube
        await kube.run(kube.patch_sweep_status, namespace or "", name, {"observedGeneration": generation})


class SweepReconciler:
    """The state of one sweep's daemon: only caches; the truth is the sweep and its runs."""

    def __init__(self, body: kopf.Body, kube: Kube, config: OperatorConfig) -> None:
        self.body = body
        self.kube = kube
        self.config = config
        self.name: str = body["metadata"]["name"]
        self.namespace: str = body["metadata"]["namespace"]
        # The only writer of the status (one replica, one daemon per sweep): our last write is
        # authoritative even before the watch echoes it back.
        self.status: dict[str, Any] = dict(body.get("status") or {})
        #: The resourceVersion our status was last written or read at (the fence: :func:`.runtime.fence_version`).
        self.version: str = str(body["metadata"].get("resourceVersion") or "")
        #: The sweep's status as read after a refused (409) write: what :meth:`recover` trusts.
        self.reread: Mapping[str, Any] | None = None
        self.log = log.bind(sweep=self.name, namespace=self.namespace)

    def view(self) -> dict[str, Any]:
        """The sweep as the planner should see it: live metadata/spec, our own status."""
        return {"metadata": dict(self.body["metadata"]), "spec": dict(self.body["spec"]), "status": self.status}

    def event(self, type_: str, reason: str, message: str) -> None:
        kopf.event(self.body, type=type_, reason=reason, message=message[:1024])

    def recover(self) -> None:
        """After a failed pass: trust the cluster's status again (a write may have half-failed), keeping the run
        outcomes we wrote that its copy does not show yet (:func:`.plan.recovered_status`)."""
        live, self.reread = (self.reread, None) if self.reread is not None else (self.body.get("status") or {}, None)
        self.status = plan.recovered_status(self.status, live)

    async def step(self) -> float | None:
        """One pass. Returns seconds until the next unprompted pass, or None when the sweep has finished."""
        m.RECONCILES.labels(m.SWEEP_KIND).inc()
        if self.body["metadata"].get("deletionTimestamp"):
            return self.config.resync_seconds  # kopf stops us; garbage collection deletes the runs
        now = _now()
        view = self.view()
        uid = view["metadata"]["uid"]
        items = await self.kube.run(self.kube.list_runs, self.namespace, f"{LABEL_SWEEP}={self.name}")
        observed = plan.observe(items, uid)
        decision = plan.decide(view, observed, now)
        events = []
        unattempted = False  # the status plans runs this pass did not create: the next pass comes at once
        if decision.create:
            attempted = {run.name for run in decision.create}
            problems, created, fresh = await self.create(view, decision)
            events = [decision.created_events[name] for name in fresh]
            # the status again, for what could be done and for runs that existed already (ours, found by the
            # 409's read because the list missed them: their label was removed), with their real phase
            if problems or set(created) - set(fresh):
                decision = plan.decide(view, {**observed, **created}, now, problems)
                unattempted = any(run.name not in attempted for run in decision.create)
        await self.patch(decision.status)
        for type_, reason, message in [*events, *decision.events]:
            self.event(type_, reason, message)
            self.log.info("sweep_transition", reason=reason, message=message)
        if decision.finished:
            self.log.info("sweep_finished", message=decision.status.get("message"))
            return None
        if unattempted:
            return REPLAN_SECONDS
        return STALLED_RETRY_SECONDS if decision.stalled else self.config.resync_seconds

    async def create(
        self, view: dict[str, Any], decision: plan.Decision
    ) -> tuple[dict[str, plan.Problem], dict[str, plan.Observed], list[str]]:
        """Create the decided runs in parallel; (runs that could not be, runs that now exist, runs created now).
        A 409 is fine when the existing run is this sweep's; another error than 403/422 raises (retried with
        back-off)."""
        objs = [plan.run_object(view, run) for run in decision.create]
        outcomes = await asyncio.gather(
            *(self.kube.run(self.kube.create_run, obj) for obj in objs), return_exceptions=True
        )
        problems: dict[str, plan.Problem] = {}
        created: dict[str, plan.Observed] = {}
        errors: list[BaseException] = []
        fresh: list[str] = []
        for obj, outcome in zip(objs, outcomes, strict=True):
            name = obj["metadata"]["name"]
            if outcome is True:
                created[name] = plan.Observed(name)
                fresh.append(name)
                self.log.info("sweep_run_created", run=name)
            elif outcome is False:  # 409: ours from an interrupted pass, or someone else's
                existing = await self.kube.run(self.kube.get_run, self.namespace, name)
                if existing is not None and controller_uid(existing) == view["metadata"]["uid"]:
                    created.update(plan.observe([existing], view["metadata"]["uid"]))
                else:
                    why = "a BenchmarkRun of that name exists and is not this sweep's (delete or rename it)"
                    problems[name] = plan.Problem(plan.SweepReason.NAME_CONFLICT, why)
            elif isinstance(outcome, ApiError) and outcome.status in (403, 422):
                why = f"HTTP {outcome.status}: {outcome.detail}"
                problems[name] = plan.Problem(plan.SweepReason.CREATE_FAILED, why)
            elif isinstance(outcome, BaseException):
                errors.append(outcome)
        if errors:
            raise kopf.TemporaryError(f"{len(errors)} of {len(objs)} run creations failed: {errors[0]}", delay=5)
        return problems, created, fresh

    async def patch(self, new: dict[str, Any]) -> None:
        """Write the status' changes, fenced (:func:`.runtime.write_fenced`: a 409 reads the sweep again)."""
        changes = runtime.status_patch(self.status, new)
        read = functools.partial(self.kube.get, "BenchmarkSweep")
        await runtime.write_fenced(self, self.kube.patch_sweep_status, read, changes)
        self.status = {**self.status, **changes}


def _unfinished(status: kopf.Status, **_: Any) -> bool:
    return not status.get("completionTime")


async def reconcile_sweep(
    *, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """The sweep's loop; event-driven (woken by its runs' and its own events), resumed after operator restarts."""
    config = config_of(memo)
    rec = SweepReconciler(body, memo.kube, config)
    await runtime.daemon(
        _wakeups(memo),
        (namespace or "", name),
        stopped,
        kind=m.SWEEP_KIND,
        step=rec.step,
        recover=rec.recover,
        log=rec.log,
        debounce=config.debounce_seconds,
        done_when_idle=True,
    )


def register(registry: kopf.OperatorRegistry) -> None:
    """The sweep's handlers on ``registry``, after the run's (its startup reads the configured memo)."""
    kopf.on.startup(registry=registry)(configure_sweeps)
    kopf.on.event(GROUP, VERSION, RUNS, labels={LABEL_SWEEP: kopf.PRESENT}, registry=registry)(sweep_run_event)
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(sweep_event)
    kopf.daemon(
        GROUP, VERSION, PLURAL, when=_unfinished, cancellation_backoff=5, cancellation_timeout=5, registry=registry
    )(reconcile_sweep)
