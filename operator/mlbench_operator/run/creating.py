"""What a pass creates: the run's pods, its objects (ConfigMap, Secret, NetworkPolicy, Service), its dataset's
volume and fetch Job; names held by another owner and refused creates, reported."""

from __future__ import annotations

import asyncio
import functools
import time
from datetime import datetime, timedelta
from typing import Any

import kopf

from mlbench_operator import conditions as c
from mlbench_operator import datasets, fetchjob, netpol, runcontext, runobjects, runpods, sshkeys
from mlbench_operator import naming as n
from mlbench_operator import podgroup as pg
from mlbench_operator.kube import ApiError, may_have_applied, transient
from mlbench_operator.podview import PodView
from mlbench_operator.run import (
    daemon,
    lifecycle,
    ownership,
)
from mlbench_operator.run.daemon import RunDaemon, _Conflict, _Refused, _Stop
from mlbench_operator.run.status import Plan, StoredStatus

#: While a dataset is fetched: look again this often even without a Job event.
DATASET_POLL_SECONDS = 10.0


class Creating(RunDaemon):
    """The creates of a pass (its mixin of :class:`.executor.RunReconciler`)."""

    async def create_pods(self, plan: Plan, ctx: runcontext.RunContext, now: datetime) -> list[tuple[str, int, str]]:
        """The plan's workers and launcher, in parallel; returns the refused ones (403/422), raises on other errors."""
        pacing = self.pacing
        attempt = int(plan.status.get("restarts", 0))
        # the kubelet enforces what is left of runPolicy.activeDeadlineSeconds, also while we are down
        run_deadline = ctx.spec.run_policy.active_deadline_seconds if ctx.spec.run_policy else None
        deadline = runpods.pod_deadline(c.parse_time(self.status.get("startTime")), run_deadline, now)
        todo = [
            runpods.worker_pod(ctx, rank, attempt, deadline)
            for rank in plan.create_workers
            if pacing.may_create(n.worker_name(self.name, rank), time.monotonic())
        ]
        if plan.create_launcher and pacing.may_create(n.launcher_name(self.name), time.monotonic()):
            todo.append(runpods.launcher_pod(ctx, attempt, deadline))
        if not todo:
            return []
        sent, started = daemon.clock(), time.monotonic()
        todo, outcomes = await self.create_in_batches(todo)
        given_up = sent + timedelta(seconds=time.monotonic() - started)  # the span on the monotonic clock
        self.remember_unanswered(todo, outcomes, ownership.UnansweredCreate(attempt, sent, given_up))
        errors = [r for r in outcomes if isinstance(r, BaseException)]
        refused: list[tuple[str, int, str]] = []
        for obj, res in zip(todo, outcomes, strict=True):
            if isinstance(res, BaseException):
                pacing.create_failed(obj["metadata"]["name"])
                if isinstance(res, ApiError) and res.status in (403, 422):
                    refused.append((f"pod {obj['metadata']['name']}", res.status, res.detail))
        if refused:
            return refused
        await self.check_held([obj for obj, res in zip(todo, outcomes, strict=True) if res is False], ctx.uid, attempt)
        await self.record_launcher(todo, outcomes, attempt)
        if errors:
            delay = 5.0
            if any(transient(e) for e in errors):
                # an overloaded or failing API server: the 403 backoff, which a pod event does not cut short
                delay = pacing.creates_refused(time.monotonic())
            raise kopf.TemporaryError(f"{len(errors)} of {len(todo)} pod creations failed: {errors[0]}", delay=delay)
        pacing.creates_succeeded()
        return []

    async def create_in_batches(self, todo: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Any]]:
        """Create pods all at once, or in the slow start's batches (:func:`.pacing.next_batch`), stopping at the
        first batch with a failure; returns the pods asked for and their outcomes (the rest wait for a later
        pass: their create grace is lifted)."""
        done: list[Any] = []
        while len(done) < len(todo):
            batch = todo[len(done) : len(done) + (self.pacing.batch or len(todo))]
            outcomes = await self.kube.create_many(batch)
            self.answered(batch, outcomes)
            done.extend(outcomes)
            if not self.pacing.batch_done([_code(r) for r in outcomes]):
                break
        for obj in todo[len(done) :]:
            self.pacing.create_failed(obj["metadata"]["name"])
        return todo[: len(done)], done

    def answered(self, objs: list[dict[str, Any]], outcomes: list[Any]) -> None:
        """The create grace of each pod whose create went through (created, or 409) counts from now, when its
        batch was answered (:meth:`.pacing.Pacing.create_answered`), not from when the pass asked for it."""
        now = time.monotonic()
        for obj, res in zip(objs, outcomes, strict=True):
            if not isinstance(res, BaseException):
                self.pacing.create_answered(obj["metadata"]["name"], now)

    def remember_unanswered(
        self, todo: list[dict[str, Any]], outcomes: list[Any], create: ownership.UnansweredCreate
    ) -> None:
        """Remember the launcher's create as ``create`` when its outcome is unknown (:func:`may_have_applied`):
        the pod may exist without a UID to record, and answer the next create with 409
        (:func:`ownership.held_launcher`)."""
        launcher = n.launcher_name(self.name)
        for obj, res in zip(todo, outcomes, strict=True):
            if obj["metadata"]["name"] == launcher and isinstance(res, BaseException) and may_have_applied(res):
                self.unanswered = ownership.remember_unanswered(self.unanswered, create)
                self.log.warning("launcher_create_unanswered", attempt=create.attempt, error=str(res)[:200])

    async def record_launcher(self, todo: list[dict[str, Any]], outcomes: list[Any], attempt: int) -> None:
        """``status.launcher``: the UID the API server answered the launcher's create with (only that pod is
        accepted as the attempt's launcher: :func:`ownership.launcher_refused`)."""
        launcher = n.launcher_name(self.name)
        for obj, res in zip(todo, outcomes, strict=True):
            if obj["metadata"]["name"] == launcher and isinstance(res, str):
                await self.record_uid(res, attempt)

    async def record_uid(self, uid: str, attempt: int) -> None:
        """Write ``status.launcher`` for the operator's launcher of UID ``uid``."""
        # imageId null: the status is a merge patch, and an earlier attempt's digest is not this launcher's
        await self.patch({**self.status, "launcher": {"uid": uid, "attempt": attempt, "imageId": None}})

    async def check_held(self, objs: list[dict[str, Any]], uid: str, attempt: int) -> None:
        """Objects whose create was answered 409: raise :class:`_Conflict` for the first one the operator did not
        create for this run (an unlabelled pod under a worker's name is invisible to the planner: without this
        it would be created again every pass, in silence); one gone since is created again by the next pass.
        The launcher must also be the one the operator recorded creating, or one created while its create went
        unanswered, recorded now (:func:`ownership.held_launcher`): another with the run's marks fails the run
        (``final``)."""
        launcher = n.launcher_name(self.name)
        for obj in objs:
            kind, name = obj["kind"], obj["metadata"]["name"]
            read = self.kube.get_pod if kind == "Pod" else functools.partial(self.kube.get, kind)
            existing = await self.kube.run(read, self.namespace, name)
            if existing is None:
                continue
            why = ownership.not_ours(existing, self.name, uid)
            if why is not None:
                raise _Conflict(kind, name, why)
            if name == launcher:
                await self.check_held_launcher(existing, attempt)

    async def check_held_launcher(self, existing: dict[str, Any], attempt: int) -> None:
        """The launcher-named pod with the run's marks that answered the create with 409: the run's (recorded now
        if it was not: made by an unanswered create), or :class:`_Conflict` (``final``)."""
        status = StoredStatus.parse(self.status, report=False).model
        why = ownership.held_launcher(existing, status, attempt, self.unanswered)
        if why is not None:
            raise _Conflict("Pod", n.launcher_name(self.name), why, final=True)
        pod_uid = existing["metadata"]["uid"]
        if not ownership.recorded(status, attempt, pod_uid):
            self.log.info("launcher_create_answered_late", attempt=attempt, uid=pod_uid)
            await self.record_uid(pod_uid, attempt)

    async def name_conflict(self, held: _Conflict, now: datetime, pods: list[PodView] | None = None) -> float | None:
        """Report a held name (:func:`lifecycle.object_conflict`) and look again later; a ``final`` one fails the
        run (:func:`lifecycle.launcher_taken`)."""
        if held.final:
            failed = lifecycle.launcher_taken(self.view(), held.name, held.why, now)
            await self.patch(failed.status)
            self.emit(failed)
            self.log.warning("run_failed_name_conflict", object=held.name, why=held.why)
            return await self.finished(now, pods or [])
        launcher = held.kind == "Pod" and held.name == n.launcher_name(self.name)
        condition = c.RUNNING if launcher else c.WORKERS_READY
        plan = lifecycle.object_conflict(self.view(), held.kind, held.name, held.why, now, condition=condition)
        await self.patch(plan.status)
        self.emit(plan)
        self.log.warning("name_conflict", kind=held.kind, object=held.name, why=held.why)
        return min(30.0, self.config.resync_seconds)

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

    async def ensure_objects(self, ctx: runcontext.RunContext, now: datetime) -> bool:
        """ConfigMap, the SSH Secret, the NetworkPolicy and a gang run's PodGroup, before any pod (the Service
        comes with the launcher: :meth:`ensure_service`); False on a NameConflict (see :meth:`create_owned`).

        A run admitted before this daemon started (an operator restart) has them already: they are read, and
        only the missing ones are built and created (no new keys, no create answered 409 for each run)."""
        group = runobjects.pod_group(ctx)  # spec.scheduling.gang: before any worker names it
        wanted = [("ConfigMap", n.config_map_name(ctx.name)), ("Secret", n.ssh_secret_name(ctx.name))]
        wanted.append(("NetworkPolicy", ctx.name))
        if group is not None:
            wanted.append(("PodGroup", ctx.name))
        existing = await self.read_objects(wanted) if self.resumed else {}
        missing, held = ownership.to_create(wanted, existing, self.name, ctx.uid)
        if held is not None:
            await self.name_conflict(_Conflict(*held), now)
            return False
        objs = [await self.build_object(kind, ctx, group) for kind, _ in missing]
        self.ensured = await self.create_owned(objs, ctx, now) if objs else True
        self.pod_group_ensured = self.ensured and group is not None
        return self.ensured

    async def read_objects(self, wanted: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any] | None]:
        """The run's objects as they are (None: missing), read in parallel."""
        found = await asyncio.gather(
            *(self.kube.run(self.kube.get, kind, self.namespace, name) for kind, name in wanted)
        )
        return dict(zip(wanted, found, strict=True))

    async def build_object(self, kind: str, ctx: runcontext.RunContext, group: dict[str, Any] | None) -> dict[str, Any]:
        """One of the run's objects, built (the Secret with fresh keys: ssh-keygen, on the API pool)."""
        if kind == "Secret":
            keys = await self.kube.run(sshkeys.generate_keypair, f"mlbench-{ctx.namespace}-{ctx.name}")
            return runobjects.ssh_secret(ctx, keys)
        if kind == "ConfigMap":
            return runobjects.config_map(ctx)
        if kind == "PodGroup" and group is not None:
            return group
        return netpol.network_policy(ctx, self.config.scraper_namespaces, self.config.scraper_cidrs)

    async def ensure_service(self, ctx: runcontext.RunContext, now: datetime, pods: list[PodView]) -> _Stop | None:
        """The headless Service that gives the workers their DNS names, right before the launcher (the
        only one that resolves them): None when it exists, else where the pass stops (a NameConflict,
        a refusal; as for the other objects).

        Not with the others before the workers: a Service selecting N workers while they start has the
        endpoints controllers rewrite its Endpoints and EndpointSlices (up to N addresses each) hundreds
        of times, 400 Endpoints writes for 1000 workers, about a fifth more control-plane CPU than the
        pods themselves (docs/operator.md, "Scale"). Created once they are all Ready, it is computed once.
        """
        try:
            if not await self.create_owned([runobjects.service(ctx)], ctx, now):
                return _Stop(min(30.0, self.config.resync_seconds))  # a name conflict is shown; look again later
        except _Refused as err:
            return _Stop(await self.creation_refused(err.failures, now, pods))
        self.service_ensured = True
        return None

    async def create_owned(self, objs: list[dict[str, Any]], ctx: runcontext.RunContext, now: datetime) -> bool:
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
        ] + [  # no PodGroup CRD: shown on the run (CreateFailed naming it) and retried with backoff, no crash loop
            (f"{obj['kind']} {obj['metadata']['name']}", res.status, pg.MISSING_CRD)
            for obj, res in zip(objs, outcomes, strict=True)
            if isinstance(res, ApiError) and pg.is_missing_crd(obj["kind"], res.status)
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

    async def ensure_dataset_volume(self, pvc: dict[str, Any]) -> str | None:
        """Create the namespace's dataset volume when missing; the ``NameConflict`` text when a PVC the operator did
        not create holds its name (it would mount another's data, or none, into the run), None when it is there."""
        if await self.kube.run(self.kube.create, pvc):
            return None
        existing = await self.kube.run(self.kube.get, pvc["kind"], self.namespace, pvc["metadata"]["name"])
        return self.held_name(existing, pvc)

    def held_name(self, existing: dict[str, Any] | None, wanted: dict[str, Any]) -> str | None:
        """The ``NameConflict`` text for a shared object (:func:`ownership.shared_not_ours`), logged; None if ours."""
        why = None if existing is None else ownership.shared_not_ours(existing, wanted)
        if why is None:
            return None
        kind, name = wanted["kind"], wanted["metadata"]["name"]
        self.log.warning("name_conflict", kind=kind, object=name, why=why)
        return ownership.conflict_text(kind, name, why)

    async def ensure_dataset(self, ctx: runcontext.RunContext, now: datetime, pods: list[PodView]) -> float | None:
        """The dataset volume and the fetch Job, before any worker exists.

        Returns None when the data is ready (the pass goes on to the workers), seconds until the next
        look while it is fetched, or -1 when the fetch failed (the run's final status is written).
        """
        settings = self.datasets
        built = fetchjob.fetch_job(ctx, settings)
        name = built["metadata"]["name"]
        admitted = c.parse_time(self.status.get("startTime"))
        try:
            held = None
            if not self.pvc_ensured:  # a shared per-namespace cache: created when missing, never owned by a run
                held = await self.ensure_dataset_volume(fetchjob.dataset_pvc(self.namespace, settings))
                self.pvc_ensured = held is None
            job = await self.kube.run(self.kube.get, "Job", self.namespace, name)
            held = held or self.held_name(job, built)
            job_pods: list[dict[str, Any]] = []
            if job is not None and held is None:
                job_pods = await self.kube.run(self.kube.list_pods, self.namespace, f"{n.LABEL_JOB_NAME}={name}")
            state = datasets.fetch_state(name, job, job_pods, admitted, settings.volume_name)
            state = datasets.name_conflict(held) if held is not None else state
            if state.action is datasets.FetchAction.CREATE:  # 409: another run's, shared
                policy = netpol.fetch_network_policy(name, self.namespace, ctx.task.dataset.name, settings.egress_cidrs)
                await self.kube.run(self.kube.create, policy)
                await self.kube.run(self.kube.create, built)
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


def _code(outcome: Any) -> int:
    """A create's outcome as the slow start counts it: its HTTP status, 0 for no answer, 201 for a pod (or 409)."""
    if isinstance(outcome, ApiError):
        return outcome.status
    return 0 if isinstance(outcome, BaseException) else 201
