"""One run's daemon: its cached state, the status it writes, and the stops a pass may make.

The pass itself is :class:`.executor.RunReconciler`; what it reads besides the run and its pods is in
:mod:`.observing`, what it creates in :mod:`.creating`, how it keeps the results in :mod:`.keeping`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from mlbench_api.runstatus import TERMINAL
from mlbench_operator import conditions as c
from mlbench_operator import logs, runcontext
from mlbench_operator import pacing as pc
from mlbench_operator.kube import ApiError, Kube
from mlbench_operator.podview import PodIndex, PodView
from mlbench_operator.run import (
    lifecycle,
    ownership,
    results,
)
from mlbench_operator.run.status import (
    Plan,
    finalize,
    kept_after_failure,
    unstorable_status,
)
from mlbench_operator.runtime import DEFAULT_CONFIG, status_patch, write_fenced
from mlbench_operator.settings import OperatorConfig

log = logs.get_logger()


def clock() -> datetime:
    """Now, in UTC (tests set the operator's clock here)."""
    return datetime.now(UTC)


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
    """A name the run needs is held by an object the operator did not create for the run; ``final``: the run fails
    (a launcher that answered the operator's create with 409: :func:`.ownership.held_launcher`), else it waits."""

    def __init__(self, kind: str, name: str, why: str, final: bool = False) -> None:
        super().__init__(kind, name, why)
        self.kind, self.name, self.why, self.final = kind, name, why, final


class StatusRefused(kopf.TemporaryError):
    """The API server refused a status write (422); what was written instead is in the message."""

    def __init__(self, message: str) -> None:
        super().__init__(message, delay=0.1)


class RunDaemon(ABC):
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
        #: The run's resourceVersion our status was last written at, or read at (the fence of the next write).
        self.version: str = str(body["metadata"].get("resourceVersion") or "")
        #: The run as read after a refused (409) write: what :meth:`recover` trusts, newer than the watch's.
        self.reread: Mapping[str, Any] | None = None
        self.log = log.bind(run=self.name, namespace=self.namespace)
        self.kopf_logger = logger
        self.ensured = False  #: the ConfigMap, Secret and NetworkPolicy exist
        #: admitted before this daemon started (an operator restart): its objects are read before any is created
        self.resumed = ownership.objects_may_exist(self.status)
        #: a gang run's PodGroup exists (spec.scheduling.gang may be set while suspended, after the others exist)
        self.pod_group_ensured = False
        self.service_ensured = False  #: the headless Service exists (created with the launcher: see ensure_service)
        #: this daemon's launcher creates of the attempt that got no answer (the pod's UID unknown, so unrecorded):
        #: a pod made while one was under way answers a later create's 409 as the run's (ownership.held_launcher)
        self.unanswered: tuple[ownership.UnansweredCreate, ...] = ()
        self.pacing = pc.Pacing(resync_seconds=self.config.resync_seconds)  # fed time.monotonic()
        self.datasets = self.config.datasets
        self.linger = self.config.metrics_linger_seconds
        self.results_wait = results.wait_for(self.config.results_wait_seconds, body["spec"].get("network"))
        self.pvc_ensured = False
        self.queue_released = False  #: a finished run's Kueue Workload is marked Finished
        self.workload: dict[str, Any] | None = None  #: the run's Kueue Workload as last read
        #: admitted by Kueue, its Workload's PodsReady not yet True: waitForPodsReady may evict it (looked at often)
        self.awaiting_pods_ready = False
        #: The operator's pod index (memo.pods), told at once of the pods a cleanup deleted (see finished).
        self.index: PodIndex | None = None

    def view(self) -> dict[str, Any]:
        """The run as the planner should see it: live metadata/spec, our own status."""
        return {"metadata": dict(self.body["metadata"]), "spec": dict(self.body["spec"]), "status": self.status}

    def recover(self, live_status: Mapping[str, Any]) -> None:
        """After a failed pass: trust the cluster's status again, unless ours is provably newer
        (:func:`.status.kept_after_failure`). After a refused write the run as read then is newer than the
        watch's copy, and is trusted instead."""
        if self.reread is not None:
            live_status, self.reread = self.reread, None
        self.status = dict(kept_after_failure(self.status, live_status or {}))

    async def _write(self, changes: dict[str, Any]) -> None:
        """One status write, fenced (:func:`write_fenced`: a 409 reads the run again, raises StatusConflict)."""
        await write_fenced(self, self.kube.patch_run_status, self.kube.get_run, changes)

    def event(self, type_: str, reason: str, message: str) -> None:
        kopf.event(self.body, type=type_, reason=reason, message=c.clean(message)[:1024])

    def emit(self, plan: Plan) -> None:
        for type_, reason, message in plan.events:
            self.event(type_, reason, message)
            self.log.info("run_transition", reason=reason, message=message)

    async def patch(self, new: dict[str, Any]) -> None:
        """Write the status (as :func:`finalize` completes it). A 422 (a value the API server
        cannot store) ends an unfinished run as Failed/InvalidResult with a minimal status instead of
        retrying the same refused write forever; a finished run keeps its phase and outcome, the refused
        part dropped or recorded (:func:`results.refused_write`). Either way :class:`StatusRefused`
        stops the pass, and the next one goes on (cleans up)."""
        now = clock()
        changes = status_patch(self.status, finalize(new, now))
        if not changes:
            return
        try:
            await self._write(changes)
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
            await self._write(fallback)
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

    def _current(self, ctx: runcontext.RunContext, pods: list[PodView]) -> list[PodView]:
        attempt = int(self.status.get("restarts") or 0)
        return [p for p in pods if p.attempt == attempt and p.owner_uid == ctx.uid]

    def _configured(self, ctx: runcontext.RunContext) -> runcontext.RunContext:
        """The operator's settings that shape the pods but are no part of the run's snapshot."""
        return dataclasses.replace(
            ctx,
            metrics_linger_seconds=self.linger,
            node_loss_seconds=self.config.node_loss_seconds,
            gang_scheduler_name=self.config.gang_scheduler_name,
            scratch=self.config.scratch,
        )

    def until_deadline(self, delay: float | None, now: datetime) -> _Stop:
        """A held run's next pass: after ``delay``, or when its deadline passes if that comes first."""
        return _Stop(lifecycle.by_deadline(delay, lifecycle.deadline_left(self.view(), now)))

    @abstractmethod
    async def finished(self, now: datetime, pods: list[PodView]) -> float | None:
        """Terminal: keep the results, then clean up (:class:`.executor.RunReconciler`)."""

    async def held_past_deadline(self, now: datetime, pods: list[PodView], doing: str) -> _Stop | None:
        """The run ends ``Failed``/``DeadlineExceeded`` if its deadline has passed while it was held before its
        pods (:func:`lifecycle.deadline_while`); None: not yet."""
        plan = lifecycle.deadline_while(self.view(), now, doing)
        if plan is None:
            return None
        await self.patch(plan.status)
        self.emit(plan)
        return _Stop(await self.finished(now, pods))
