"""What outlives the pods: the launcher's results line kept in ``<run>-results`` with the ranks' hardware, a
failed attempt's launcher log kept in an Event."""

from __future__ import annotations

import asyncio
import weakref
from datetime import datetime
from typing import Any

import kopf

from mlbench_api import bundle, hardware
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator import runobjects
from mlbench_operator.kube import ApiError, transient
from mlbench_operator.podview import PodView
from mlbench_operator.run import (
    ownership,
    results,
)
from mlbench_operator.run.daemon import RunDaemon

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


class Keeping(RunDaemon):
    """The results of a finished run (its mixin of :class:`.executor.RunReconciler`)."""

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

    async def keep_results(self, now: datetime, pods: list[PodView]) -> results.Decision:
        """Copy the launcher's results line into the ``<run>-results`` ConfigMap (once; see .results).

        Never raises for a problem with the log or the ConfigMap: those retry within the policy's
        window and then give up, so the cleanup is never blocked by the results. A status write the
        API server refuses is not such a problem and is not reported as one: it raises
        :class:`StatusRefused` (see :meth:`patch`).
        """
        uid = self.body["metadata"].get("uid", "")
        pod = results.launcher(pods, uid, self.status)
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
        found, why = await asyncio.to_thread(results.from_log, text, self.config.results_max_bytes)
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
        obj = runobjects.results_config_map(self.name, self.namespace, uid, task, found)
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
            why = ownership.not_ours(existing, self.name, uid) or ownership.results_differ(existing, obj)
            if why is not None:
                text = f"{c.Reason.NAME_CONFLICT}: {ownership.conflict_text('ConfigMap', name, why)}"
                return results.Decision(results.Action.GIVE_UP, text.removesuffix("; waiting for it to be deleted"))
        return None
