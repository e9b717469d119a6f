"""The namespaced install's gate: kopf watches only the namespaces :mod:`.nsready` finds readable.

Glue: it reads each namespace's pod watch (and, every :data:`.nsready.PROBE_SECONDS`, asks the API server
whether a served namespace can still be read), keeps ``mlbench_operator_namespace_ready``, says each turn in
an Event and the log, and hands kopf the namespaces to watch (its ``Insights.namespaces``, which kopf's
orchestrator follows: watchers are started and stopped per namespace).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from mlbench_operator import logs
from mlbench_operator import metrics as m
from mlbench_operator import nsready as r
from mlbench_operator.kube import ApiError, Kube
from mlbench_operator.naming import MANAGER

log = logs.get_logger()

#: How often the gate looks at the pod watches (no API call: their state is in memory).
TICK_SECONDS = 1.0


class NamespaceGate:
    """The verdicts on the watched namespaces (:func:`.nsready.health`) and what follows from them."""

    def __init__(
        self,
        kube: Kube,
        watches: Sequence[Any],
        insights: Any,
        about: r.Reporter | None,
        bound: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.watches = {w.namespace: w for w in watches}
        self.insights = insights  # kopf's Insights (None: not run by main.py; kopf then watches what it was told)
        self.about = about
        self.bound = bound
        self.clock = clock
        self.verdicts: dict[str, r.Health | None] = dict.fromkeys(self.watches)
        self.since = dict.fromkeys(self.watches, clock())  # since when each has been trying without success
        self.probe_errors: dict[str, int] = {}
        self.last_probe = clock()

    def settled(self) -> bool:
        """Every namespace has a verdict (the start waits for this, at most ``bound`` seconds)."""
        return all(v is not None for v in self.verdicts.values())

    def judge(self) -> list[r.Health]:
        """Judge every namespace again; the verdicts that are news (:func:`.nsready.changed`)."""
        now, news = self.clock(), []
        for ns, watch in self.watches.items():
            error, before = self.probe_errors.get(ns, watch.error), self.verdicts[ns]
            served = before is not None and before.ready
            verdict = r.health(ns, watch.synced.is_set(), error, now - self.since[ns], self.bound, served=served)
            if verdict is not None and verdict.ready:
                self.since[ns] = now
            if verdict is None:
                continue
            if r.changed(before, verdict):
                news.append(verdict)
            m.NAMESPACE_READY.labels(ns).set(1 if verdict.ready else 0)
            self.verdicts[ns] = verdict
        return news

    async def step(self) -> None:
        """One look: probe when due, judge, report the news, hand kopf the served namespaces."""
        if self.clock() - self.last_probe >= r.PROBE_SECONDS:
            self.last_probe = self.clock()
            await self.probe()
        for verdict in self.judge():
            await self.report(verdict)
        await self.serve()

    async def probe(self) -> None:
        """Ask each listed namespace whether its runs can still be listed (a RoleBinding deleted meanwhile)."""
        for ns, watch in self.watches.items():
            if not watch.synced.is_set():
                continue
            try:
                await self.kube.run(self.kube.probe_runs, ns)
                self.probe_errors.pop(ns, None)
            except ApiError as err:
                self.probe_errors[ns] = err.status
            except Exception:  # no answer: the pod watch's state decides
                self.probe_errors.pop(ns, None)

    async def report(self, verdict: r.Health) -> None:
        say = log.info if verdict.ready else log.warning
        what = "namespace_available" if verdict.ready else "namespace_unavailable"
        say(what, namespace=verdict.namespace, message=verdict.message)
        if self.about is None:
            return
        body = r.event(self.about, verdict, datetime.now(UTC), MANAGER)
        try:
            await self.kube.run(self.kube.post_event, body)
        except Exception as err:  # an Event is a courtesy: the metric and the log said it
            log.warning("namespace_event_failed", namespace=verdict.namespace, error=str(err)[:300])

    async def serve(self) -> None:
        """kopf watches exactly the ready namespaces (one without a verdict keeps its place)."""
        if self.insights is None:
            return
        current = frozenset(self.insights.namespaces)
        wanted = r.served(current, self.verdicts)
        if wanted == current:
            return
        async with self.insights.revised:
            self.insights.namespaces.clear()
            self.insights.namespaces.update(wanted)
            self.insights.revised.notify_all()
        log.info("namespaces_served", namespaces=sorted(wanted))

    async def settle(self) -> None:
        """Until every namespace has a verdict (at most ``bound`` seconds and a tick)."""
        await self.step()
        while not self.settled():
            await asyncio.sleep(TICK_SECONDS)
            await self.step()

    async def run(self) -> None:
        """Forever (cancelled at shutdown)."""
        while True:
            await asyncio.sleep(TICK_SECONDS)
            await self.step()
