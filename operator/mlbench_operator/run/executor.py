"""The run's executor: a pass from the run's context to the plan carried out (:meth:`RunReconciler.step`)."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime

from mlbench_api.runstatus import TERMINAL, Phase
from mlbench_operator import conditions as c
from mlbench_operator import metrics as m
from mlbench_operator import naming as n
from mlbench_operator import podscheduling, runcontext
from mlbench_operator.podview import PodChange, PodView
from mlbench_operator.run import (
    admission,
    daemon,
    kueue,
    lifecycle,
    policies,
    queueing,
    suspension,
)
from mlbench_operator.run.creating import Creating
from mlbench_operator.run.daemon import StatusRefused, _Conflict, _Refused, _Stop
from mlbench_operator.run.keeping import Keeping
from mlbench_operator.run.observing import QUEUE_POLL_SECONDS, Observing
from mlbench_operator.run.status import (
    Plan,
    failed_status,
    first_ready,
    restarted,
)

__all__ = ["RunReconciler", "StatusRefused"]


class RunReconciler(Observing, Creating, Keeping):
    """One run's daemon: :meth:`step` is a pass (its reads, creates and kept results come from the mixins)."""

    async def step(self, pods: list[PodView]) -> float | None:
        """One pass. Returns seconds until the next unprompted pass, or None when nothing is left to do (the
        daemon then waits to be woken: see :func:`reconcile_run`).

        The pass is a pipeline that may stop early at each stage: the run's context (admission, or
        rebuilt from the snapshot), the run's objects and dataset, then the plan and its execution.
        """
        m.RECONCILES.labels(m.RUN_KIND).inc()
        now = daemon.clock()
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
            return self.kueue_recheck(ready.delay)
        volumes = await self.mount_failures(ctx, pods, now)
        states = await self.node_states(ctx, pods, now)
        plan = policies.plan(self.view(), ctx, pods, now, mounts=volumes, nodes=states)
        return self.kueue_recheck(await self.execute(plan, ctx, now, pods))

    async def run_context(self, now: datetime, pods: list[PodView]) -> runcontext.RunContext | _Stop:
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

    async def gate(
        self, ctx: runcontext.RunContext, now: datetime, pods: list[PodView]
    ) -> runcontext.RunContext | _Stop:
        """spec.suspend and a queue's admission (:mod:`.suspension`, :mod:`.kueue`): a held run releases its pods
        and stops here; an admitted one gets its flavors' placement."""
        queue = kueue.queue_name(self.body)
        queued = await self.kueue_admission(ctx, queue) if queue else None
        self.awaiting_pods_ready = self.awaiting_pods_ready and queued is not None
        ended = suspension.deactivated_plan(self.view(), ctx.uid, pods, queued, now) if queued is not None else None
        if ended is not None:
            return _Stop(await self.end_deactivated(ended, now, pods))
        held = suspension.gate(self.body["spec"], queued)
        if held is not None:
            plan = suspension.held_plan(self.view(), ctx.uid, pods, held, now)
            await self.patch(plan.status)
            self.emit(plan)
            if plan.delete_stale:
                await self.kube.delete_pods_named(self.namespace, plan.delete_stale, uids=plan.delete_stale)
            if queued is not None:
                await self.tell_kueue(queued, started=False, pods_gone=suspension.pods_gone(pods, ctx.uid))
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
        if queued is not None:
            started = suspension.attempt_started(pods, ctx.uid, self.status)
            await self.tell_kueue(queued, started=started, pods_gone=False)
        if queued is None or not queued.flavors:
            return ctx
        flavors = {f: await self.kube.run(queueing.get_flavor, self.kube, f) for f in queued.flavors}
        return kueue.placed(ctx, queued.assignments, flavors)

    async def end_deactivated(self, plan: Plan, now: datetime, pods: list[PodView]) -> float | None:
        """A run whose Workload Kueue deactivated: Failed, its unfinished pods deleted, then as any finished run."""
        self.awaiting_pods_ready = False
        await self.patch(plan.status)
        self.emit(plan)
        self.log.warning("workload_deactivated", message=plan.status.get("message"))
        if plan.delete_stale:
            await self.kube.delete_pods_named(self.namespace, plan.delete_stale, uids=plan.delete_stale)
        after = [dataclasses.replace(p, terminating=True) if p.name in plan.delete_stale else p for p in pods]
        return await self.finished(now, after)

    async def prepare(self, ctx: runcontext.RunContext, now: datetime, pods: list[PodView]) -> _Stop | None:
        """The run's ConfigMap, Secret and NetworkPolicy, then its dataset; None when the pods may come."""
        if not self.ensured or (podscheduling.gang(ctx) is not None and not self.pod_group_ensured):
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

    async def execute(self, plan: Plan, ctx: runcontext.RunContext, now: datetime, pods: list[PodView]) -> float | None:
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
            return await self.name_conflict(held, now, pods)
        if refused:
            return await self.creation_refused(refused, now, pods)
        if ready_now:
            created = c.parse_time(self.body["metadata"].get("creationTimestamp"))
            if created is not None:
                m.WORKERS_READY_SECONDS.observe(max((now - created).total_seconds(), 0.0))
        return pacing.wake_in(plan.requeue_after)

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
