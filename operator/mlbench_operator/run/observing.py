"""What a pass reads besides the run and its pods: the nodes of a failed world, the volume Events of
waiting workers, the run's Kueue Workload."""

from __future__ import annotations

from datetime import datetime

from mlbench_api.runstatus import TERMINAL
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator import runcontext, runpods
from mlbench_operator.kube import ApiError
from mlbench_operator.podview import PodView
from mlbench_operator.run import (
    daemon,
    kueue,
    mounts,
    nodes,
    queueing,
)
from mlbench_operator.run.daemon import RunDaemon
from mlbench_operator.run.nodes import NodeState

#: While a run waits for Kueue: look at its Workload again this often (no watch on Workloads).
QUEUE_POLL_SECONDS = 3.0


class Observing(RunDaemon):
    """The reads of a pass (its mixin of :class:`.executor.RunReconciler`)."""

    async def node_states(self, ctx: runcontext.RunContext, pods: list[PodView], now: datetime) -> dict[str, NodeState]:
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
        self, ctx: runcontext.RunContext, pods: list[PodView], now: datetime
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

    async def kueue_admission(self, ctx: runcontext.RunContext, queue: str) -> kueue.Admission:
        """The run's Workload, created when missing, as Kueue has admitted it or not."""
        name = kueue.workload_name(self.name, ctx.uid)
        found = await self.kube.run(queueing.get_workload, self.kube, self.namespace, name)
        if found is None:
            worker, launcher = runpods.worker_pod(ctx, 0, 0), runpods.launcher_pod(ctx, 0)
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
        self.workload = found
        queued = kueue.admission(found, name, queue)
        self.awaiting_pods_ready = queued.admitted and not queued.pods_ready
        return queued

    def kueue_recheck(self, delay: float | None) -> float | None:
        """The next pass at most :data:`QUEUE_POLL_SECONDS` away while Kueue's ``waitForPodsReady`` may evict the
        run's Workload (admitted, not started): a Workload's change wakes nobody."""
        if not self.awaiting_pods_ready:
            return delay
        return QUEUE_POLL_SECONDS if delay is None else min(delay, QUEUE_POLL_SECONDS)

    async def tell_kueue(self, queued: kueue.Admission, *, started: bool, pods_gone: bool) -> None:
        """What Kueue's job integrations write on a Workload: ``PodsReady`` True once the attempt ``started``
        (``waitForPodsReady``); an evicted Workload's quota given back once its pods are gone (Kueue requeues it)."""
        if self.workload is None:
            return
        name, now = self.workload["metadata"]["name"], daemon.clock()
        if queued.admitted and started and not queued.pods_ready:
            patch = kueue.pods_ready_patch(now)
            await self.kube.run(queueing.apply_workload_status, self.kube, self.namespace, name, patch)
            self.log.info("workload_pods_ready", workload=name)
        elif queued.evicted and queued.reserved and pods_gone:
            patch = kueue.release_patch(self.workload, now)
            await self.kube.run(queueing.release_workload, self.kube, self.namespace, name, patch)
            self.log.info("workload_released", workload=name, evicted=queued.evicted)

    async def release_queue(self) -> None:
        """A finished run's Workload is marked Finished once (Kueue releases its quota)."""
        queue, phase = kueue.queue_name(self.body), self.status.get("phase")
        if queue is None or self.queue_released or phase not in TERMINAL:
            return
        name = kueue.workload_name(self.name, self.body["metadata"].get("uid", ""))
        await self.kube.run(
            queueing.apply_workload_status, self.kube, self.namespace, name, kueue.finished_patch(phase, daemon.clock())
        )
        self.queue_released = True
