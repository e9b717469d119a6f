"""What a run's policies decide from: :class:`PlanInput`, the run, its status and its pods sorted once per pass
(the current attempt's, earlier attempts', foreign pods that merely hold names), and the :data:`Policy` type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from mlbench_api.runpolicy import RunPolicy
from mlbench_api.runstatus import BenchmarkRunStatus, WorkerCounts
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import Reason
from mlbench_operator.podview import PodView
from mlbench_operator.run import startup
from mlbench_operator.run.lifecycle import _own, _seconds
from mlbench_operator.run.nodes import NodeState
from mlbench_operator.run.ownership import launcher_record, launcher_refused
from mlbench_operator.run.status import Plan, StoredStatus, _Status, _uid
from mlbench_operator.runcontext import RunContext


@dataclass(frozen=True)
class PlanInput:
    """Everything a policy decides from, sorted once per pass; no policy changes it.

    Only the run's own pods (controller UID = the run's) are ever acted on; ``foreign`` pods merely
    block the names they hold.
    """

    body: Mapping[str, Any]  #: the run as last written (its status is the previous decision)
    stored: StoredStatus  #: its status, parsed
    ctx: RunContext
    now: datetime
    run_policy: RunPolicy
    restarts: int  #: ``status.restarts``: the current attempt
    own: tuple[PodView, ...]  #: the run's own pods, of every attempt
    current: tuple[PodView, ...]  #: own pods of the current attempt
    stale: tuple[PodView, ...]  #: own pods of earlier attempts: deleted before the next attempt starts
    foreign: tuple[PodView, ...]  #: the run's labels but another or no controller (never adopted)
    workers: Mapping[int, PodView]  #: the current attempt's workers by rank (ranks beyond spec.workers ignored)
    launcher: PodView | None  #: the current attempt's launcher
    #: ``(reason, message)`` of the volume Events of workers that wait to start, by pod name (:mod:`.mounts`)
    mounts: Mapping[str, tuple[Reason, str]] = field(default_factory=lambda: MappingProxyType({}))
    #: what the current workers' nodes say, by node name, read once the launcher failed (:mod:`.nodes`)
    nodes: Mapping[str, NodeState] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(
        cls,
        body: Mapping[str, Any],
        ctx: RunContext,
        pods: Iterable[PodView],
        now: datetime,
        *,
        mounts: Mapping[str, tuple[Reason, str]] | None = None,
        nodes: Mapping[str, NodeState] | None = None,
    ) -> PlanInput:
        own, foreign = _own(pods, ctx.uid)
        stored = StoredStatus.parse(body.get("status"), run=_uid(body))
        restarts = stored.model.restarts or 0
        # a launcher-named pod the operator did not create for this attempt holds the name, nothing more
        impostors = [
            p
            for p in own
            if p.role == n.ROLE_LAUNCHER and p.attempt == restarts and launcher_refused(p, stored.model, restarts)
        ]
        own = [p for p in own if p not in impostors]
        foreign = [*foreign, *impostors]
        current = tuple(p for p in own if p.attempt == restarts)
        total = ctx.spec.workers
        workers = {p.rank: p for p in current if p.role == n.ROLE_WORKER and p.rank is not None and p.rank < total}
        return cls(
            body=body,
            stored=stored,
            ctx=ctx,
            now=now,
            run_policy=ctx.spec.run_policy or RunPolicy(),
            restarts=restarts,
            own=tuple(own),
            current=current,
            stale=tuple(p for p in own if p.attempt != restarts),
            foreign=tuple(foreign),
            workers=MappingProxyType(workers),
            launcher=next((p for p in current if p.role == n.ROLE_LAUNCHER), None),
            mounts=MappingProxyType(dict(mounts or {})),
            nodes=MappingProxyType(dict(nodes or {})),
        )

    @property
    def old(self) -> BenchmarkRunStatus:
        """The previous status (what of it validates: see :class:`StoredStatus`)."""
        return self.stored.model

    @property
    def total(self) -> int:
        return self.ctx.spec.workers

    @property
    def ready(self) -> int:
        """Workers of the current attempt that are Ready (a Terminating one no longer counts)."""
        return sum(1 for p in self.workers.values() if p.ready and not p.terminating)

    @property
    def deadline_left(self) -> float | None:
        """Seconds until ``runPolicy.activeDeadlineSeconds`` (<= 0: exceeded); None: no deadline."""
        start = self.old.start_time
        deadline = self.run_policy.active_deadline_seconds
        if deadline is None or start is None:
            return None
        return (start + _seconds(deadline) - self.now).total_seconds()

    @property
    def startup_left(self) -> float | None:
        """Seconds until the attempt's startup deadline (<= 0: passed); None once it has started (its launcher
        left Pending, or it has been Running) or before its first pod (:func:`.startup.left`)."""
        if c.holds(self.old.conditions, c.RUNNING):
            return None
        return startup.left(self.run_policy, self.current, self.launcher, self.now)

    def status(self) -> _Status:
        """A fresh builder for the next status, with the counts every decision reports."""
        st = _Status.following(self.stored, self.now, (self.body.get("metadata") or {}).get("generation"))
        st.new.restarts = self.restarts
        st.new.workers = WorkerCounts(ready=self.ready, total=self.total)
        st.new.launcher = launcher_record(self.old.launcher, self.launcher)  # with its image's digest once known
        return st


Policy = Callable[[PlanInput], Plan | None]
