"""The operator's decisions, as pure functions of (run, its pods, now).

:func:`admit` resolves a run against its task once and snapshots the task; :func:`plan`
then maps the run's status and the observed pods to the next status and the actions that
move the world towards it. The kopf glue in :mod:`.handlers` only executes the plan, so a
restarted operator that sees the same cluster makes the same decisions (state lives in the
resource and the pods, never in memory).

:func:`plan` sorts the pods once into a :class:`PlanInput` (the run's own pods of the current
attempt, of earlier attempts, and foreign pods that merely hold names) and asks the policies of
:data:`POLICIES` in order; the first that returns a :class:`Plan` decides the pass:

1. :func:`launcher_succeeded`: the launcher exited 0; its result makes the run Succeeded (or
   InvalidResult when unusable).
2. :func:`launcher_aborted`: the launcher failed with an "aborted" summary; Failed, no restart.
3. :func:`deadline_exceeded`: ``activeDeadlineSeconds`` has passed; Failed.
4. :func:`root_cause_hold`: the launcher failed while the workers still run; wait briefly for a
   worker to report the real cause.
5. :func:`gang_failure`: a failed or lost rank; restart the whole gang, or give up (a permanent
   failure, ``maxRestarts`` spent).
6. :func:`stale_attempt`: pods of an earlier attempt remain; delete them, wait.
7. :func:`make_progress`: always decides; create workers, then the launcher, and report
   WorkersReady, Running, the phase and Stalled (NoProgress).

The order is the precedence: a result beats the deadline (the run did finish), the deadline
beats a failure (no restart past it), and a worker's cause beats the launcher's echo of it.
Whatever decides, every pass also force-deletes pods stuck Terminating on a lost node and wakes
up by the earliest wait (:func:`_upkeep`).

Every status is built as the API's typed ``BenchmarkRunStatus`` (``Phase``, ``WorkerCounts``, typed
conditions with :class:`~.conditions.Reason` members) from the stored one, parsed tolerantly
(:class:`StoredStatus`), and serialized once, as each public function returns it (:meth:`_Status.dump`):
the kopf glue and :func:`status_patch` see the wire's dicts. An Event is planned only for a condition
(or the phase) that changed, never for a pass that merely restates it.
"""

from __future__ import annotations

import copy
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from mlbench_api.common import MAX_INT32, ObjectMeta
from mlbench_api.common import Condition as ConditionModel
from mlbench_api.config import AlgorithmNotAllowed, OverrideNotAllowed, effective_config
from mlbench_api.errors import format_errors
from mlbench_api.results import RunSummary
from mlbench_api.run import (
    BenchmarkRun,
    BenchmarkRunSpec,
    BenchmarkRunStatus,
    CleanPodPolicy,
    Phase,
    Progress,
    RunPolicy,
    RunResult,
    WorkerCounts,
)
from mlbench_api.task import BenchmarkTaskSpec, RunnerSpec
from mlbench_operator import conditions as c
from mlbench_operator import logs
from mlbench_operator import naming as n
from mlbench_operator.builders import RunContext
from mlbench_operator.conditions import Reason
from mlbench_operator.datasets import FetchAction, FetchState
from mlbench_operator.podview import PodPhase, PodView
from mlbench_operator.podview import controller_uid as controller_uid  # noqa: PLC0414 (re-export for handlers)
from mlbench_operator.policy import AdmissionPolicy, violations

DEFAULT_POLICY = AdmissionPolicy()
log = logs.get_logger("mlbench_operator.reconcile")

#: The phases a run never leaves (the one place they are stated; handlers reads them from here).
TERMINAL: tuple[Phase, ...] = (Phase.SUCCEEDED, Phase.FAILED)
#: A pod still Terminating this long after its deletionTimestamp (the end of its grace period) is on
#: a lost node: the kubelet will never confirm, so it is force-deleted (its name is needed again).
FORCE_DELETE_AFTER_SECONDS = 60.0
#: Appended to WorkersReady's message once the end-of-run cleanup is done (a real status change).
CLEANED_UP = "pods cleaned up per cleanPodPolicy"


@dataclass(frozen=True)
class Rejection:
    """Why a run cannot start; it ends Failed with this reason, having created nothing."""

    reason: str  #: a :class:`Reason`
    message: str


@dataclass
class Plan:
    """The next status and what to do to the world to get there."""

    status: dict[str, Any]  #: as the API server gets it (:meth:`_Status.dump`); :func:`finalize` completes it
    create_workers: list[int] = field(default_factory=list)
    create_launcher: bool = False
    #: pods of earlier attempts to delete (gang restart): name -> UID. Only this run's own pods, and each
    #: delete is conditional on the UID, so neither a foreign pod with our labels nor the next attempt's
    #: pod of the same name is ever touched (a label-selector deletecollection would do both).
    delete_stale: dict[str, str] = field(default_factory=dict)
    cleanup: list[str] = field(default_factory=list)  #: pods to delete as the run finishes
    force_delete: list[str] = field(default_factory=list)  #: pods stuck Terminating (lost node): grace 0
    events: list[tuple[str, str, str]] = field(default_factory=list)  #: (type, reason, message)
    #: a failed launcher about to be deleted by a gang restart: its log's tail goes into an Event first,
    #: so each attempt's mpirun output outlives the pod (the launcher's name repeats across attempts)
    keep_log_of: str | None = None
    requeue_after: float | None = None  #: wake up by then even without pod events (deadline)

    @property
    def terminal(self) -> bool:
        return self.status.get("phase") in TERMINAL


def _short(err: Exception, limit: int = 2048) -> str:
    text = "; ".join(format_errors(err)) if isinstance(err, ValidationError) else str(err)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_run(body: Mapping[str, Any]) -> BenchmarkRun:
    """The run's spec through the API models (the CRD schema already checked most of it)."""
    meta = body.get("metadata") or {}
    return BenchmarkRun(
        metadata=ObjectMeta(name=meta.get("name", ""), namespace=meta.get("namespace")),
        spec=BenchmarkRunSpec.model_validate(body.get("spec") or {}),
    )


def context(
    body: Mapping[str, Any],
    snapshot: Mapping[str, Any],
    run_as_user: int | None = n.RUNNER_UID,
    dataset_claim: str = n.DATASET_VOLUME,
) -> RunContext:
    """Rebuild the run's context from its spec and task snapshot; raises ValueError if invalid."""
    run = validate_run(body)
    meta = body.get("metadata") or {}
    task = BenchmarkTaskSpec.model_validate(snapshot)
    task_name = run.spec.task_ref.name
    config = effective_config(run, task_name, task, output_dir=n.OUTPUT_DIR, metrics_port=n.METRICS_PORT)
    return RunContext(
        name=run.metadata.name,
        namespace=run.metadata.namespace or "default",
        uid=meta.get("uid", ""),
        task_name=task_name,
        spec=run.spec,
        config=config,
        run_as_user=run_as_user,
        dataset_claim=dataset_claim,
    )


def admit(
    body: Mapping[str, Any],
    task: Mapping[str, Any] | None,
    run_as_user: int | None = n.RUNNER_UID,
    dataset_claim: str = n.DATASET_VOLUME,
    policy: AdmissionPolicy = DEFAULT_POLICY,
) -> tuple[RunContext, dict[str, Any]] | Rejection:
    """Resolve the run against its task (``None``: not found) and the admin's :mod:`.policy`; the snapshot
    is the task's validated spec."""
    task_name = ((body.get("spec") or {}).get("taskRef") or {}).get("name", "")
    try:
        validate_run(body)
    except ValueError as err:
        return Rejection(Reason.INVALID_SPEC, f"spec is invalid: {_short(err)}")
    snapshot = _snapshot(task, task_name)
    if isinstance(snapshot, Rejection):
        return snapshot
    ctx = _admitted_context(body, snapshot, run_as_user, dataset_claim)
    if isinstance(ctx, Rejection):
        return ctx
    spec = body.get("spec") or {}
    image_field = "spec.image" if ctx.spec.image else f"BenchmarkTask {task_name!r} runner.image"
    dataset = ctx.task.dataset_spec  # None for a collectives task
    volume = dataset.volume if dataset else None
    broken = violations(ctx.image, image_field, spec.get("scheduling"), volume, policy, network=spec.get("network"))
    if broken:
        return Rejection(Reason.POLICY_VIOLATION, "; ".join(broken))
    return ctx, snapshot


def _snapshot(task: Mapping[str, Any] | None, task_name: str) -> dict[str, Any] | Rejection:
    """The task's validated spec, as the run keeps it for good; a Rejection when missing or invalid."""
    if task is None:
        return Rejection(Reason.TASK_NOT_FOUND, f"BenchmarkTask {task_name!r} does not exist")
    try:
        return BenchmarkTaskSpec.model_validate(task.get("spec") or {}).to_api()
    except ValueError as err:
        return Rejection(Reason.INVALID_TASK, f"BenchmarkTask {task_name!r} is invalid: {_short(err)}")


def _admitted_context(
    body: Mapping[str, Any], snapshot: Mapping[str, Any], run_as_user: int | None, dataset_claim: str
) -> RunContext | Rejection:
    """:func:`context` at admission: a refused override or an invalid effective configuration rejects the run."""
    try:
        return context(body, snapshot, run_as_user, dataset_claim)
    except OverrideNotAllowed as err:
        return Rejection(Reason.OVERRIDE_NOT_ALLOWED, str(err))
    except AlgorithmNotAllowed as err:
        return Rejection(Reason.ALGORITHM_NOT_ALLOWED, str(err))
    except ValueError as err:
        return Rejection(Reason.INVALID_CONFIG, f"the effective configuration is invalid: {_short(err)}")


class ReportedOnce:
    """The stored values that do not validate and were already logged, per run (bounded, oldest forgotten).

    A bad stored field stays until a pass rewrites it, and every pass parses the status: without
    this its warning would repeat on every pass, burying everything else in the log.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def first(self, run: str, part: str, value: Any) -> bool:
        """True the first time ``run``'s ``part`` is seen holding ``value``."""
        key = (run, part, json.dumps(value, sort_keys=True, default=str))
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > self.size:
            self._seen.popitem(last=False)
        return True


#: The operator's one record of what it has logged as unparsed.
REPORTED = ReportedOnce()


@dataclass(frozen=True)
class StoredStatus:
    """A run's stored status, parsed into the typed model as far as it validates.

    A status written by an older operator, or one holding a value the models now refuse (an
    out-of-range number, a field since removed), must not stop reconciliation. The fallback: the
    whole status is tried first, then field by field; a top-level field that does not validate (or that
    the model does not know) is left out of :attr:`model` and kept as it was in :attr:`unparsed`, and so
    is a single condition that does not (:attr:`unparsed_conditions`). Kept parts are written back
    unchanged (nothing is lost, nothing re-written) until a pass sets that field, or a condition of that
    type, itself, which replaces them. Each one is logged with the reason when the status is parsed.
    """

    raw: Mapping[str, Any]  #: the status as stored (or as last written by this operator)
    valid: Mapping[str, Any]  #: the part of ``raw`` that validates (``model``'s input)
    model: BenchmarkRunStatus  #: everything that validates
    unparsed: Mapping[str, Any] = field(default_factory=dict)  #: wire key -> stored value
    unparsed_conditions: tuple[Any, ...] = ()  #: stored conditions that do not validate

    def fresh(self) -> BenchmarkRunStatus:
        """A new copy of :attr:`model` to build the next status in (validating anew is the cheap deep copy)."""
        return BenchmarkRunStatus.model_validate(self.valid)

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None, *, report: bool = True, run: str | None = None) -> StoredStatus:
        """``report``: log what does not validate (off where the same status was just parsed and logged);
        with ``run`` (the run's uid), each bad value only the first time it is seen in that run."""
        raw = dict(raw or {})
        try:
            return cls(raw, raw, BenchmarkRunStatus.model_validate(raw))
        except ValidationError:
            pass  # find out which parts do not validate, keep the rest typed
        good: dict[str, Any] = {}
        unparsed: dict[str, Any] = {}
        bad_conditions: list[Any] = []
        for key, value in raw.items():
            if key == "conditions" and isinstance(value, list):
                value, bad_conditions = _split_conditions(value, report, run)
            problem = _field_problem(key, value)
            if problem is None:
                good[key] = value
                continue
            unparsed[key] = raw[key]
            bad_conditions = [] if key == "conditions" else bad_conditions  # the whole list is kept
            if report and (run is None or REPORTED.first(run, key, raw[key])):
                log.warning("status_field_unparsed", field=key, error=problem, kept="as stored")
        return cls(raw, good, BenchmarkRunStatus.model_validate(good), unparsed, tuple(bad_conditions))


def _uid(body: Mapping[str, Any]) -> str | None:
    """The run's uid (None for a body without one: then every pass reports)."""
    uid = (body.get("metadata") or {}).get("uid")
    return str(uid) if uid else None


def _field_problem(key: str, value: Any) -> str | None:
    """Why ``status.<key>: value`` does not validate on its own; None when it does."""
    try:
        BenchmarkRunStatus.model_validate({key: value})
    except ValidationError as err:
        return _short(err, 512)
    return None


def _split_conditions(items: list[Any], report: bool, run: str | None) -> tuple[list[Any], list[Any]]:
    """(the stored conditions that validate, those that do not)."""
    good: list[Any] = []
    bad: list[Any] = []
    for item in items:
        try:
            ConditionModel.model_validate(item)
        except ValidationError as err:
            bad.append(item)
            if report and (run is None or REPORTED.first(run, "conditions", item)):
                kind = item.get("type") if isinstance(item, Mapping) else None
                log.warning("status_condition_unparsed", type=kind, error=_short(err, 512), kept="as stored")
        else:
            good.append(item)
    return good, bad


def _condition_type(item: Any) -> str:
    kind = item.get("type") if isinstance(item, Mapping) else None
    return kind if isinstance(kind, str) else ""


#: ``BenchmarkRunStatus``'s fields: wire key -> attribute name.
_STATUS_FIELDS = {info.alias or name: name for name, info in BenchmarkRunStatus.model_fields.items()}


class _Status:
    """Builds the next status, typed, from the stored one; :meth:`dump` is its one serialization."""

    def __init__(self, prev: StoredStatus, now: datetime, generation: int | None) -> None:
        self.prev = prev
        self.old = prev.model  #: the stored status (read only)
        self.new = prev.fresh()
        self.now = now
        self.generation = generation  #: the observedGeneration of every condition set
        #: fields written as given, not typed (stored ones that do not validate): wire key -> value
        self.kept: dict[str, Any] = dict(prev.unparsed)
        #: stored conditions that do not validate, kept until a condition of their type is set
        self.kept_conditions = list(prev.unparsed_conditions)

    @classmethod
    def of(cls, body: Mapping[str, Any], now: datetime) -> _Status:
        """The next status of the run ``body``: it reflects the run's current generation."""
        generation = (body.get("metadata") or {}).get("generation")
        return cls.following(StoredStatus.parse(body.get("status"), run=_uid(body)), now, generation)

    @classmethod
    def following(cls, prev: StoredStatus, now: datetime, generation: int | None) -> _Status:
        st = cls(prev, now, generation)
        st.new.observed_generation = generation
        if st.new.conditions is None:
            st.new.conditions = []
        return st

    def cond(self, type_: str, status: c.ConditionStatus, reason: str, message: str = "") -> None:
        """Set a condition (see :func:`conditions.put`)."""
        if self.new.conditions is None:
            self.new.conditions = []
        # Edited in place, not assigned: the CRD's maxItems is the API server's to enforce, as for any
        # status it refuses (a 422 fails the run InvalidResult), rather than an exception in the planner.
        conds = self.new.conditions
        conds[:] = c.put(conds, type_, status, reason, message, now=self.now, generation=self.generation)
        self.kept_conditions = [k for k in self.kept_conditions if _condition_type(k) != type_]

    def changed(self, type_: str, *, message: bool = False) -> bool:
        """Whether condition ``type_`` of the next status differs from the stored one in status or reason
        (or, with ``message``, its message): what an Event is planned for, never a mere re-statement."""
        before, after = c.find(self.old.conditions, type_), c.find(self.new.conditions, type_)

        def seen(cond: ConditionModel | None) -> tuple[str, str, str] | None:
            return None if cond is None else (cond.status, cond.reason, cond.message if message else "")

        return seen(before) != seen(after)

    def message_of(self, type_: str) -> str:
        """The message of a condition of the next status, as stored."""
        cond = c.find(self.new.conditions, type_)
        return cond.message if cond is not None else ""

    def keep(self, key: str, value: Any, why: str) -> None:
        """Write ``status.<key>`` as given, untyped, because it does not validate (``why``); logged."""
        log.warning("status_field_unparsed", field=key, error=why, kept="as given")
        setattr(self.new, _STATUS_FIELDS[key], None)
        self.kept[key] = value

    def say(self, message: str) -> None:
        """``status.message``, as stored (cleaned of control characters, at most the CRD's maxLength)."""
        self.new.message = c.stored_text(message)

    def in_progress(self) -> None:
        self.cond(c.GOAL_REACHED, "Unknown", Reason.NO_RESULT_YET, "the run has not finished")
        self.cond(c.SUCCEEDED, "False", Reason.IN_PROGRESS, "")
        self.cond(c.FAILED, "False", Reason.IN_PROGRESS, "")

    def fail(self, reason: str, message: str) -> None:
        self.new.phase = Phase.FAILED
        self.say(message)
        if self.new.completion_time is None:
            self.new.completion_time = c.instant(self.now)
        self.cond(c.WORKERS_READY, "False", Reason.RUN_FAILED, "the run failed")
        self.cond(c.RUNNING, "False", Reason.RUN_FAILED, "the run failed")
        self.cond(c.GOAL_REACHED, "False", Reason.RUN_FAILED, "the run failed before it reported a result")
        self.cond(c.SUCCEEDED, "False", reason, message)
        self.cond(c.FAILED, "True", reason, message)

    def dump(self) -> dict[str, Any]:
        """The next status as the API server gets it (``model_dump``: camelCase, RFC 3339 times, no nulls).

        A field this pass left as it was is written exactly as stored, and one that does not validate as
        it was stored or given (:attr:`kept`, see :class:`StoredStatus`), so that no pass rewrites what
        it did not decide and :func:`status_patch` sends only real changes. A field the pass cleared is
        written as null, which deletes it in the status' merge patch (``observedGeneration`` of a run
        without ``metadata.generation``).
        """
        typed = self.new.model_dump(mode="json", by_alias=True, exclude_none=True)
        raw = self.prev.raw
        out: dict[str, Any] = {}
        for key, name in _STATUS_FIELDS.items():
            value = getattr(self.new, name)
            if value is None and key in self.kept:
                out[key] = copy.deepcopy(self.kept[key])
            elif key in raw and value == getattr(self.old, name):
                out[key] = copy.deepcopy(raw[key])
            elif value is None:
                if key in raw:
                    out[key] = None
            elif name == "conditions" and self.kept_conditions:
                kept = copy.deepcopy(self.kept_conditions)
                out[key] = sorted([*typed[key], *kept], key=lambda x: c.order(_condition_type(x)))
            else:
                out[key] = typed[key]
        out.update({k: copy.deepcopy(v) for k, v in self.kept.items() if k not in _STATUS_FIELDS})
        return out


def _spec_workers(body: Mapping[str, Any], default: int) -> int:
    """``spec.workers`` from the raw spec (a rejected run's spec may not validate); ``default`` when
    unset, 0 when unusable (not a number, negative)."""
    value = (body.get("spec") or {}).get("workers")
    if value is None:
        return default
    try:
        return max(int(value), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def rejected_status(body: Mapping[str, Any], rejection: Rejection, now: datetime) -> dict[str, Any]:
    """Status for a run that cannot start (nothing was created)."""
    st = _Status.of(body, now)
    st.new.workers = WorkerCounts(ready=0, total=_spec_workers(body, 1))
    st.new.restarts = 0
    st.fail(rejection.reason, rejection.message)
    return st.dump()


def failed_status(body: Mapping[str, Any], reason: str, message: str, now: datetime) -> dict[str, Any]:
    """Status for an admitted run that fails outside :func:`plan` (restarts and workers are kept)."""
    st = _Status.of(body, now)
    st.fail(reason, message)
    return st.dump()


def admitted_status(
    body: Mapping[str, Any], ctx: RunContext, snapshot: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """Status right after admission: the task snapshot is fixed from here on."""
    st = _Status.of(body, now)
    st.new.phase = Phase.PENDING
    try:
        st.new.task_snapshot = BenchmarkTaskSpec.model_validate(snapshot)
    except ValidationError as err:  # not from admit(): written as given; the next pass fails it InvalidConfig
        st.keep("taskSnapshot", snapshot, _short(err, 512))
    st.new.start_time = c.instant(now)
    st.new.restarts = 0
    st.new.workers = WorkerCounts(ready=0, total=ctx.spec.workers)
    st.say(f"creating {ctx.spec.workers} workers")
    st.cond(c.WORKERS_READY, "False", Reason.CREATING, f"0/{ctx.spec.workers} workers ready")
    st.cond(c.RUNNING, "False", Reason.WAITING_FOR_WORKERS, "the launcher starts once every worker is Ready")
    st.in_progress()
    return st.dump()


def _summary_result(summary: RunSummary, image: str | None = None, workers: Iterable[PodView] = ()) -> RunResult:
    """``status.result``: the summary's figures, and exactly what ran (the image asked for and the digests
    the workers' containers resolved it to, so a result stays attributable after a tag moves)."""
    ids = sorted({p.image_id for p in workers if p.image_id})
    return RunResult(
        image=image,
        image_ids=ids[:8] or None,
        goal_reached=summary.goal_reached,
        time_to_goal_seconds=summary.time_to_goal_seconds,
        best_accuracy=summary.best_accuracy,
        final_accuracy=summary.final_accuracy,
        epochs=summary.epochs,
        wall_clock_seconds=summary.wall_clock_seconds,
        compute_seconds=summary.compute_seconds,
        communication_seconds=summary.communication_seconds,
        samples_per_second=summary.samples_per_second,
        world_size=summary.environment.world_size,
        bytes_per_step=summary.communication.bytes_per_step if summary.communication else None,
        compression_ratio=summary.communication.compression_ratio if summary.communication else None,
        peak_bus_bandwidth=summary.peak_bus_bandwidth,
    )


def serves_metrics(status: Mapping[str, Any]) -> bool | None:
    """Whether the admitted run's ranks serve metrics (``RunnerSpec.serves_metrics`` of its task snapshot);
    None before admission (no snapshot yet) or for a snapshot that does not read."""
    runner = (status.get("taskSnapshot") or {}).get("runner")
    if not isinstance(runner, Mapping):
        return None
    try:
        return RunnerSpec.model_validate(runner).serves_metrics
    except ValidationError:
        return None


def final_progress(old: Progress | None, summary: RunSummary, now: datetime) -> Progress:
    """``status.progress`` of a finished run: the summary's final figures, not the last scrape.

    Rank 0 is scraped every MLBENCH_PROGRESS_SECONDS, so the last scrape usually predates the
    final evaluation; ``kubectl get br`` must show the epoch and accuracy the run ended with.
    Raises ValueError (a ValidationError) for figures the status cannot hold (e.g. an accuracy above 1).
    """
    data = old.model_dump(by_alias=True, exclude_none=True) if old is not None else {}
    data.update(epoch=float(summary.epochs), samplesPerSecond=summary.samples_per_second, updatedAt=c.instant(now))
    if summary.final_accuracy is not None:
        data["lastAccuracy"] = summary.final_accuracy
    return Progress.model_validate(data)  # an error names the wire's field


def clean_pod_policy(spec: Mapping[str, Any] | None) -> CleanPodPolicy:
    """``spec.runPolicy.cleanPodPolicy`` from the raw spec (usable even when the spec no longer validates)."""
    raw = ((spec or {}).get("runPolicy") or {}).get("cleanPodPolicy")
    try:
        return CleanPodPolicy(raw) if raw else RunPolicy().clean_pod_policy
    except ValueError:
        return RunPolicy().clean_pod_policy


def _cleanup(policy: CleanPodPolicy, pods: Iterable[PodView]) -> list[str]:
    """Pods to delete at the end. Running (as Kubeflow's): every pod that has not finished, the launcher
    included (a Pending launcher would otherwise wait forever); finished pods stay for their logs."""
    if policy is CleanPodPolicy.NONE:
        return []
    out = []
    for pod in pods:
        if pod.terminating:
            continue
        if policy is CleanPodPolicy.ALL or not pod.finished:
            out.append(pod.name)
    return sorted(out)


def _own(pods: Iterable[PodView], uid: str) -> tuple[list[PodView], list[PodView]]:
    """(pods of this run, pods with our labels but another or no controller: e.g. a deleted run of the same
    name whose garbage collection has not finished)."""
    mine: list[PodView] = []
    foreign: list[PodView] = []
    for pod in pods:
        # no controller at all (e.g. orphaned with --cascade=orphan) is not ours either
        (foreign if uid and pod.owner_uid != uid else mine).append(pod)
    return mine, foreign


def rank0(pods: Iterable[PodView], uid: str, attempt: int) -> PodView | None:
    """The worker whose metrics feed ``status.progress``: rank 0 of the current attempt, this run's own (the
    planner's rule, :func:`_own`), with an IP. Not a foreign pod with the run's labels (a deleted run of the
    same name), nor the previous attempt's rank 0 still terminating after a gang restart."""
    mine, _ = _own(pods, uid)
    return next(
        (
            p
            for p in mine
            if p.role == n.ROLE_WORKER and p.rank == 0 and p.attempt == attempt and p.ip and not p.terminating
        ),
        None,
    )


def cleanup_pending(body: Mapping[str, Any], pods: Iterable[PodView]) -> list[str]:
    """A finished run's pods that its cleanPodPolicy still wants deleted (empty: cleanup done).

    Derived from the cluster alone (terminal phase + pods present), so a cleanup interrupted by an
    operator restart or a failed delete is re-driven until done.
    """
    uid = (body.get("metadata") or {}).get("uid", "")
    mine, _ = _own(pods, uid)
    return _cleanup(clean_pod_policy(body.get("spec")), mine)


def cleanup_unrecorded(body: Mapping[str, Any], pods: Iterable[PodView]) -> bool:
    """A finished run whose cleanup deleted its pods but whose status does not say so (the operator stopped
    between the deletes and the status write): its ``workers.ready`` would keep the count from before, and no
    daemon would come back for it (nothing is left to delete). The policy cleans, WorkersReady does not say
    :data:`CLEANED_UP`, and a pod of the run is going or ``workers.ready`` counts more workers than are ready
    (under ``Running`` the finished launcher stays: its pods are not all gone)."""
    status = body.get("status") or {}
    policy = clean_pod_policy(body.get("spec"))
    if status.get("phase") not in TERMINAL or policy is CleanPodPolicy.NONE:
        return False
    wr = c.get(status.get("conditions"), c.WORKERS_READY) or {}
    if CLEANED_UP in (wr.get("message") or ""):
        return False
    mine, _ = _own(pods, (body.get("metadata") or {}).get("uid", ""))
    if _cleanup(policy, mine):  # still to delete: cleanup_pending's case
        return False
    ready = int((status.get("workers") or {}).get("ready") or 0)
    return any(p.terminating for p in mine) or ready > _ready_workers(mine, int(status.get("restarts") or 0))


def _ready_workers(mine: Iterable[PodView], restarts: int) -> int:
    """The run's Ready workers of its current attempt (Terminating ones not counted)."""
    return sum(1 for p in mine if p.role == n.ROLE_WORKER and p.attempt == restarts and p.ready and not p.terminating)


def cleaned_up_status(body: Mapping[str, Any], pods: Iterable[PodView], now: datetime) -> dict[str, Any]:
    """A finished run's status once its cleanup is done: ``workers.ready`` recounted, WorkersReady says so.

    A real change after a cleanup (the message gains :data:`CLEANED_UP`, or names a policy edited since the
    last cleanup), so the run gets a watch event after the daemon stopped and kopf can release the finalizer.
    """
    st = _Status.of(body, now)
    uid = (body.get("metadata") or {}).get("uid", "")
    mine, _ = _own(pods, uid)
    ready = _ready_workers(mine, st.old.restarts or 0)
    total = (st.old.workers.total if st.old.workers is not None else 0) or _spec_workers(body, 0)
    st.new.workers = WorkerCounts(ready=ready, total=total)
    wr = c.find(st.new.conditions, c.WORKERS_READY)
    msg = (wr.message if wr is not None else "") or "the run finished"
    # the policy in force now: one edited after a first cleanup (Running, then All) cleans again, and says so
    msg = f"{msg.split(f'; {CLEANED_UP}', 1)[0]}; {CLEANED_UP} {clean_pod_policy(body.get('spec')).value}"
    st.cond(c.WORKERS_READY, "False", wr.reason if wr is not None else Reason.RUN_FINISHED, msg)
    return st.dump()


def _reject_non_finite(value: str) -> Any:
    raise ValueError(f"the result contains {value}, which is not a number Kubernetes can store")


def _check_finite(data: Any, path: str = "") -> None:
    if isinstance(data, float) and not math.isfinite(data):
        raise ValueError(f"the result's {path or 'value'} is {data}, which is not a number Kubernetes can store")
    if isinstance(data, dict):
        for k, v in data.items():
            _check_finite(v, f"{path}.{k}" if path else str(k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            _check_finite(v, f"{path}[{i}]")


def parse_summary(text: str) -> RunSummary:
    """The launcher's RunSummary; ValueError when malformed or when it holds NaN/Infinity (or overflows
    to it, e.g. ``1e999``): the API server rejects non-finite numbers, which would wedge the status."""
    try:
        data = json.loads(text, parse_constant=_reject_non_finite)
    except json.JSONDecodeError as exc:
        raise ValueError(f"termination message is not JSON: {exc}") from exc
    _check_finite(data)
    return RunSummary.model_validate(data)


def _find_failure(
    run: str, workers: Mapping[int, PodView], launcher: PodView | None, total: int, was_running: bool
) -> tuple[Reason, str] | None:
    """The first real failure of the current world, as (reason, message).

    A failed worker is the root cause and wins over the launcher, whose mpirun fails only as
    its echo (a rank OOM-killed or a worker container killed takes the launcher down too).
    """
    for rank in sorted(workers):
        if workers[rank].phase == PodPhase.FAILED:
            return workers[rank].failure()
    # A worker gone with its node (deleted, evicted by the node controller) takes mpirun down with
    # "ORTE has lost communication": the lost worker is the cause, not the launcher's echo of it.
    lost = [r for r in range(total) if r not in workers or workers[r].terminating]
    if launcher is not None and lost and launcher.phase != PodPhase.SUCCEEDED:
        pod_name = n.worker_name(run, lost[0])
        return Reason.WORKER_LOST, f"worker {lost[0]} (pod {pod_name}) disappeared while the launcher was running"
    if launcher is not None and launcher.phase == PodPhase.FAILED:
        return launcher.failure()
    if was_running and (launcher is None or launcher.terminating):
        return Reason.LAUNCHER_LOST, f"launcher (pod {n.launcher_name(run)}) disappeared while it was running"
    for rank in sorted(workers):
        pod = workers[rank]
        if pod.phase == PodPhase.SUCCEEDED and (launcher is None or not launcher.finished):
            return Reason.WORKER_EXITED, f"worker {rank} (pod {pod.name}) exited before the launcher finished"
    return None


def world_disruption(workers: Mapping[int, PodView], launcher: PodView | None) -> str | None:
    """Why the current world is being taken apart from outside (a pod of it carries DisruptionTarget: a drain,
    an eviction, the taint manager of a lost node, a preemption), or None. Such a restart is not the run's
    failure: it does not count against ``maxRestarts`` (JobSet's RestartJobSetAndIgnoreMaxRestarts)."""
    pods = [workers[rank] for rank in sorted(workers)] + ([launcher] if launcher is not None else [])
    for pod in pods:
        if pod.disrupted:
            what = "launcher" if pod.role == n.ROLE_LAUNCHER else f"worker {pod.rank}"
            return f"{what} (pod {pod.name}) was disrupted ({pod.disrupted})"
    return None


#: Failures a gang restart would only repeat: the run fails at once instead of burning maxRestarts.
PERMANENT_FAILURES = frozenset({Reason.INVALID_INPUT})


#: How long a failed launcher's workers get to report their own cause before the launcher is blamed.
ROOT_CAUSE_GRACE_SECONDS = 10.0


def _root_cause_wait(
    launcher: PodView | None, workers: Mapping[int, PodView], total: int, now: datetime
) -> float | None:
    """Seconds to hold a launcher failure while a still-running worker may report the real cause.

    The launcher and a worker whose rank died fail within a second or two of each other, in
    either order; without this the reported reason would depend on which status arrived first.
    None: decide now (no launcher failure, a worker already failed or is lost, none is running,
    or the grace is over).
    """
    if launcher is None or launcher.phase != PodPhase.FAILED or launcher.finished_at is None:
        return None
    if any(w.phase == PodPhase.FAILED or w.terminating for w in workers.values()) or len(workers) < total:
        return None  # a worker already tells the cause (failed, or lost)
    if not any(w.phase == PodPhase.RUNNING for w in workers.values()):
        return None
    finished = c.parse_time(launcher.finished_at)
    if finished is None:
        return None
    left = ROOT_CAUSE_GRACE_SECONDS - (now - finished).total_seconds()
    return left if left > 0 else None


#: ``runPolicy.progressDeadlineSeconds`` when unset: ten minutes without a step is no slow epoch.
PROGRESS_DEADLINE_SECONDS = 600


def _no_progress(progress: Progress | None, policy: RunPolicy, now: datetime) -> tuple[bool, str, float | None]:
    """(stalled, why, seconds until it would be): the step counter rank 0 reports has not moved for
    the progress deadline. Only once a step was seen (an image that serves no metrics is never Stalled)."""
    since = progress.step_changed_at if progress is not None else None
    if since is None:
        return False, "", None
    deadline = policy.progress_deadline_seconds or PROGRESS_DEADLINE_SECONDS
    idle = (now - since).total_seconds()
    if idle < deadline:
        return False, "", deadline - idle
    step = progress.step if progress is not None else None
    why = f"the step counter has stayed at {step} for {idle:.0f} s (runPolicy.progressDeadlineSeconds={deadline})"
    return True, why, None


def _deletable(pods: Iterable[PodView]) -> dict[str, str]:
    """name -> UID of the pods not yet terminating (a pod without a UID, in tests only, maps to "")."""
    return {p.name: p.uid or "" for p in sorted(pods, key=lambda p: p.name) if not p.terminating}


def _stuck_terminating(pod: PodView, now: datetime) -> bool:
    """Terminating for longer than its grace period plus a margin: the node is gone."""
    end = c.parse_time(pod.deletion_timestamp) if pod.terminating else None
    return end is not None and (now - end).total_seconds() > FORCE_DELETE_AFTER_SECONDS


def _until_stuck(pod: PodView, now: datetime) -> float | None:
    end = c.parse_time(pod.deletion_timestamp)
    return None if end is None else max((end - now).total_seconds() + FORCE_DELETE_AFTER_SECONDS + 1, 1.0)


# -- plan: an ordered list of policies ------------------------------------------------------------------------
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

    @classmethod
    def of(cls, body: Mapping[str, Any], ctx: RunContext, pods: Iterable[PodView], now: datetime) -> PlanInput:
        own, foreign = _own(pods, ctx.uid)
        stored = StoredStatus.parse(body.get("status"), run=_uid(body))
        restarts = stored.model.restarts or 0
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

    def status(self) -> _Status:
        """A fresh builder for the next status, with the counts every decision reports."""
        st = _Status.following(self.stored, self.now, (self.body.get("metadata") or {}).get("generation"))
        st.new.restarts = self.restarts
        st.new.workers = WorkerCounts(ready=self.ready, total=self.total)
        return st


#: A policy: a :class:`Plan` when it decides the pass, None to leave it to the next one.
Policy = Callable[[PlanInput], Plan | None]
#: A condition as ``(status, reason, message)``.
_Cond = tuple[c.ConditionStatus, str, str]


def _finished(inp: PlanInput, st: _Status) -> Plan:
    """A terminal plan: the final status, the deletions its cleanPodPolicy wants, an Event with the outcome."""
    phase = st.new.phase or Phase.FAILED
    kind = "Normal" if phase == Phase.SUCCEEDED else "Warning"
    return Plan(
        status=st.dump(),
        cleanup=_cleanup(inp.run_policy.clean_pod_policy, inp.own),
        events=[(kind, phase, st.new.message or "")],
    )


def launcher_succeeded(inp: PlanInput) -> Plan | None:
    """The launcher exited 0: its termination message is the result (``Succeeded``, whether or not the
    goal was reached), or ``Failed``/``InvalidResult`` when that message is unusable."""
    launcher = inp.launcher
    if launcher is None or launcher.phase != PodPhase.SUCCEEDED:
        return None
    st = inp.status()
    text = (launcher.term_message or "").strip()
    try:
        if not text:
            raise ValueError("the launcher exited 0 but wrote no termination message")
        summary = parse_summary(text)
        result = _summary_result(summary, inp.ctx.image, inp.workers.values())  # a RunResult holds finite numbers
        progress = final_progress(inp.old.progress, summary, inp.now)
    except ValueError as err:
        st.fail(Reason.INVALID_RESULT, f"launcher {launcher.name} succeeded but its result is unusable: {_short(err)}")
        return _finished(inp, st)
    st.new.phase = Phase.SUCCEEDED
    st.new.result = result
    st.new.progress = progress
    if st.new.completion_time is None:
        st.new.completion_time = c.instant(inp.now)
    if summary.goal_reached:
        ttg = summary.time_to_goal_seconds
        msg = f"goal reached{f' in {ttg:.1f} s' if ttg is not None else ''}"
        reason = Reason.GOAL_REACHED
    else:
        msg = f"finished without reaching the goal ({summary.stop_reason or summary.status})"
        reason = Reason.ABORTED if summary.status == "aborted" else Reason.GOAL_NOT_REACHED
    if summary.best_accuracy is not None:
        msg += f"; best accuracy {summary.best_accuracy:.4f}"
    st.say(msg)
    st.cond(c.WORKERS_READY, "False", Reason.RUN_FINISHED, "the run finished")
    st.cond(c.RUNNING, "False", Reason.COMPLETED, f"launcher {launcher.name} completed")
    st.cond(c.GOAL_REACHED, "True" if summary.goal_reached else "False", reason, msg)
    st.cond(c.SUCCEEDED, "True", reason, msg)
    st.cond(c.FAILED, "False", Phase.SUCCEEDED, "")
    return _finished(inp, st)


def launcher_aborted(inp: PlanInput) -> Plan | None:
    """The launcher failed but rank 0 reported a summary whose status is ``aborted`` (e.g. diverged):
    ``Failed``/``Aborted`` with its figures kept, no restart (it would abort again). Any other summary
    from a failed launcher is a crash, left to :func:`gang_failure`; so is one stopped by a signal
    (stop reason ``interrupted``: a drained node, an eviction, a deleted launcher pod), which is not
    the run's own decision and restarts like any lost pod."""
    launcher = inp.launcher
    if launcher is None or launcher.phase != PodPhase.FAILED or not launcher.term_message:
        return None
    try:
        summary = parse_summary(launcher.term_message)
        result = _summary_result(summary, inp.ctx.image, inp.workers.values())
    except ValueError:
        return None
    if summary.status != "aborted" or summary.stop_reason == "interrupted":
        return None
    st = inp.status()
    st.new.result = result
    st.fail(
        Reason.ABORTED,
        f"the run aborted ({summary.stop_reason or summary.status}); "
        f"launcher {launcher.name} exit code {launcher.exit_code}",
    )
    st.cond(c.GOAL_REACHED, "False", Reason.ABORTED, "the run aborted before reaching the goal")
    return _finished(inp, st)


def deadline_exceeded(inp: PlanInput) -> Plan | None:
    """``runPolicy.activeDeadlineSeconds`` has passed since ``startTime``: ``Failed``/``DeadlineExceeded``.
    (Until then the deadline only wakes the run up: see :func:`plan`.)"""
    left = inp.deadline_left
    if left is None or left > 0:
        return None
    st = inp.status()
    st.fail(
        Reason.DEADLINE_EXCEEDED,
        f"the run exceeded runPolicy.activeDeadlineSeconds={inp.run_policy.active_deadline_seconds}",
    )
    return _finished(inp, st)


def _launcher_stop_wait(
    launcher: PodView | None, workers: Mapping[int, PodView], total: int, now: datetime
) -> float | None:
    """Seconds to keep the world of a running launcher that is being deleted (a drain, an eviction,
    ``kubectl delete pod``): its PID 1 passes the stop on to the ranks through mpirun and prints rank 0's
    summary (stop reason ``interrupted``) on its way out, over the workers' ssh sessions. Deleting the
    workers at once (the gang restart for a lost launcher) could cut that off. Until the launcher has
    stopped (its pod fails or goes) or its deletion is due (``deletionTimestamp``, the kubelet's own
    deadline). None: decide now (not that case, or a worker already failed or is lost)."""
    if launcher is None or not launcher.terminating or launcher.phase != PodPhase.RUNNING:
        return None
    if any(w.phase == PodPhase.FAILED or w.terminating for w in workers.values()) or len(workers) < total:
        return None
    due = c.parse_time(launcher.deletion_timestamp)
    left = (due - now).total_seconds() if due is not None else 0.0
    return left if left > 0 else None


def launcher_stopping_hold(inp: PlanInput) -> Plan | None:
    """A running launcher is being deleted: decide nothing while it stops its ranks (see
    :func:`_launcher_stop_wait`); then :func:`gang_failure` restarts the gang as for any lost launcher."""
    if not c.holds(inp.old.conditions, c.RUNNING):
        return None
    hold = _launcher_stop_wait(inp.launcher, inp.workers, inp.total, inp.now)
    if hold is None:
        return None
    return Plan(status=inp.status().dump(), requeue_after=hold)


def root_cause_hold(inp: PlanInput) -> Plan | None:
    """The launcher failed while every worker still runs: decide nothing for up to
    :data:`ROOT_CAUSE_GRACE_SECONDS`, so that a worker can report the real cause first."""
    hold = _root_cause_wait(inp.launcher, inp.workers, inp.total, inp.now)
    if hold is None:
        return None
    return Plan(status=inp.status().dump(), requeue_after=hold)


def gang_failure(inp: PlanInput) -> Plan | None:
    """A failed (or lost) rank fails the whole world: restart the gang, or give up (``Failed`` with the
    cause) when the failure is permanent or ``maxRestarts`` is spent. Not while pods of the previous
    attempt remain: they are history (:func:`stale_attempt` clears them)."""
    if inp.stale:
        return None
    was_running = c.holds(inp.old.conditions, c.RUNNING)
    failure = _find_failure(inp.ctx.name, inp.workers, inp.launcher, inp.total, was_running)
    if failure is None:
        return None
    reason, message = failure
    st = inp.status()
    limit = inp.run_policy.max_restarts
    if reason in PERMANENT_FAILURES:
        st.fail(reason, f"{message} (not restarted: the runner refused its input, a restart would repeat it)")
        return _finished(inp, st)
    disrupted = world_disruption(inp.workers, inp.launcher)
    spared = inp.old.disruption_restarts or 0
    counted = inp.restarts - spared
    if disrupted is None and counted >= limit:
        st.fail(reason, f"{message} (gave up after {counted} of maxRestarts={limit} restarts)")
        return _finished(inp, st)
    restarts = inp.restarts + 1
    if disrupted is None:
        text = f"restart {counted + 1}/{limit}: {message}"
    else:
        reason = Reason.DISRUPTED
        text = f"restart after a disruption, not counted against maxRestarts={limit}: {disrupted}; {message}"
        st.new.disruption_restarts = spared + 1
    st.new.restarts = restarts
    st.new.phase = Phase.PENDING
    st.say(text)
    st.new.workers = WorkerCounts(ready=0, total=inp.total)
    # status.progress was the failed attempt's rank 0: its stepChangedAt would flag the next attempt Stalled
    # (NoProgress) as soon as it runs, before its first scrape. Cleared (null in the merge patch).
    st.new.progress = None
    st.cond(c.WORKERS_READY, "False", Reason.RESTARTING, text)
    st.cond(c.RUNNING, "False", Reason.RESTARTING, text)
    st.cond(c.RESTARTED, "True", reason, text)
    launcher = inp.launcher
    return Plan(
        status=st.dump(),
        # the restart is recorded (status first), then every pod of the failed attempt goes
        delete_stale=_deletable(inp.own),
        events=[("Warning", Reason.RESTARTING, text)],
        keep_log_of=launcher.name if launcher is not None and launcher.phase == PodPhase.FAILED else None,
    )


def stale_attempt(inp: PlanInput) -> Plan | None:
    """Pods of an earlier attempt remain (a gang restart is under way): delete them and wait until they
    are gone, since the next attempt reuses their names."""
    if not inp.stale:
        return None
    st = inp.status()
    st.new.phase = Phase.PENDING
    msg = f"waiting for {len(inp.stale)} pods of the previous attempt to terminate"
    st.cond(c.WORKERS_READY, "False", Reason.RESTARTING, msg)
    st.cond(c.RUNNING, "False", Reason.RESTARTING, msg)
    st.in_progress()
    st.say(msg)
    return Plan(status=st.dump(), delete_stale=_deletable(inp.stale))


def _workers_to_create(inp: PlanInput, held: Mapping[str, PodView]) -> tuple[list[int], list[PodView]]:
    """(ranks to create now, foreign pods holding the names of others): missing workers are created only
    before the launcher exists (afterwards a missing worker is a failure, not a gap to fill)."""
    wanted = [] if inp.launcher is not None else [r for r in range(inp.total) if r not in inp.workers]
    names = {n.worker_name(inp.ctx.name, r): r for r in wanted}
    blocked = [held[name] for name in sorted(held) if name in names]
    return [r for name, r in names.items() if name not in held], blocked


def _workers_ready(inp: PlanInput, blocked: list[PodView], creating: bool) -> _Cond:
    """WorkersReady: all Ready, or the most useful reason why not (a refused create, a name held by
    another owner, the scheduler, a stuck container), in that order."""
    ready, total = inp.ready, inp.total
    prev = c.find(inp.old.conditions, c.WORKERS_READY)
    workers = sorted(inp.workers.values(), key=lambda p: p.rank or 0)
    unsched = [p for p in workers if p.unschedulable]
    stuck = [p for p in workers if p.waiting]
    if ready == total:
        return "True", Reason.ALL_WORKERS_READY, f"{ready}/{total} workers ready"
    if prev is not None and prev.reason == Reason.CREATE_FAILED and creating:
        # the API server refused a create (quota, policy): keep saying so while we retry
        return "False", Reason.CREATE_FAILED, prev.message
    if blocked:
        pod = blocked[0]
        text = (
            f"pod {pod.name} belongs to another owner (uid {pod.owner_uid}, e.g. a deleted run of the same name); "
            "waiting for it to be deleted"
        )
        return "False", Reason.NAME_CONFLICT, text
    if unsched:
        text = f"{len(unsched)}/{total} workers cannot be scheduled: {unsched[0].unschedulable}"
        return "False", Reason.UNSCHEDULABLE, text
    if stuck:
        return "False", Reason.CONTAINER_WAITING, f"worker {stuck[0].rank}: {stuck[0].waiting}"
    return "False", Reason.WAITING_FOR_WORKERS, f"{ready}/{total} workers ready"


def _launcher_state(inp: PlanInput, held: Mapping[str, PodView]) -> tuple[Phase, _Cond, bool]:
    """(phase, Running condition, create the launcher now?): the launcher is created only once every
    worker is Ready, and only under a name no other owner's pod holds."""
    launcher = inp.launcher
    if launcher is not None and launcher.phase == PodPhase.RUNNING:
        return Phase.RUNNING, ("True", Reason.LAUNCHER_RUNNING, f"launcher {launcher.name} is running mpirun"), False
    if launcher is not None:
        why = launcher.waiting or launcher.unschedulable
        text = f"launcher {launcher.name} is {launcher.phase}{f': {why}' if why else ''}"
        return Phase.STARTING, ("False", Reason.LAUNCHER_STARTING, text), False
    if inp.ready < inp.total:
        scheduled = len(inp.workers) == inp.total and all(p.scheduled for p in inp.workers.values())
        waiting: _Cond = ("False", Reason.WAITING_FOR_WORKERS, "the launcher starts once every worker is Ready")
        return (Phase.STARTING if scheduled else Phase.PENDING), waiting, False
    blocker = held.get(n.launcher_name(inp.ctx.name))
    if blocker is not None:
        text = f"pod {blocker.name} belongs to another owner (uid {blocker.owner_uid}); waiting for it to be deleted"
        return Phase.STARTING, ("False", Reason.NAME_CONFLICT, text), False
    prev = c.find(inp.old.conditions, c.RUNNING)
    if prev is not None and prev.reason == Reason.CREATE_FAILED:
        return Phase.STARTING, ("False", Reason.CREATE_FAILED, prev.message), True
    return Phase.STARTING, ("False", Reason.CREATING_LAUNCHER, "every worker is Ready; creating the launcher"), True


def _stalled(inp: PlanInput) -> tuple[_Cond, float | None]:
    """(Stalled condition, seconds until it would be) for a Running run."""
    stalled, why, wait = _no_progress(inp.old.progress, inp.run_policy, inp.now)
    if stalled:
        return ("True", Reason.NO_PROGRESS, why), wait
    return ("False", Phase.RUNNING, why), wait


def make_progress(inp: PlanInput) -> Plan:
    """Always decides: create what is missing (workers, then the launcher once all are Ready) and say
    where the run stands (WorkersReady, Running, the phase; Stalled while Running)."""
    st = inp.status()
    out = Plan(status={})
    held = {p.name: p for p in inp.foreign}
    out.create_workers, blocked = _workers_to_create(inp, held)
    workers_ready = _workers_ready(inp, blocked, bool(out.create_workers))
    phase, running, out.create_launcher = _launcher_state(inp, held)
    st.cond(c.WORKERS_READY, *workers_ready)
    st.new.phase = phase
    st.cond(c.RUNNING, *running)
    st.in_progress()
    # the conditions' messages as stored (cleaned of control characters), not the raw text from pods
    workers_text, running_text = st.message_of(c.WORKERS_READY), st.message_of(c.RUNNING)
    st.say(f"{workers_text}; {running_text}")
    if phase == Phase.RUNNING:
        stalled, out.requeue_after = _stalled(inp)
        st.cond(c.STALLED, *stalled)
        if stalled[:2] == ("True", Reason.NO_PROGRESS) and st.changed(c.STALLED):
            out.events.append(("Warning", Reason.NO_PROGRESS, st.message_of(c.STALLED)))
    if phase != inp.old.phase:
        out.events.append(("Normal", phase, st.new.message or ""))
    if workers_ready[1] == Reason.UNSCHEDULABLE and st.changed(c.WORKERS_READY):
        out.events.append(("Warning", Reason.UNSCHEDULABLE, workers_text))
    out.status = st.dump()
    return out


#: The policies :func:`plan` asks, in this order; the first that returns a plan decides the pass.
POLICIES: tuple[Policy, ...] = (
    launcher_succeeded,
    launcher_aborted,
    deadline_exceeded,
    root_cause_hold,
    launcher_stopping_hold,
    gang_failure,
    stale_attempt,
    make_progress,
)


def _upkeep(inp: PlanInput, out: Plan) -> Plan:
    """What every pass contributes whatever decided it: pods stuck Terminating on a lost node are
    force-deleted, and the run wakes up by the earliest of its own wait, the moment a Terminating pod
    would count as stuck (a lost node sends no more events) and the active deadline."""
    out.force_delete = sorted(p.name for p in inp.own if _stuck_terminating(p, inp.now))
    waits = [_until_stuck(p, inp.now) for p in inp.own if p.terminating and p.name not in out.force_delete]
    left = inp.deadline_left
    waits += [out.requeue_after, left if left is not None and left > 0 else None]
    out.requeue_after = min((w for w in waits if w is not None), default=None)
    return out


def plan(body: Mapping[str, Any], ctx: RunContext, pods: Iterable[PodView], now: datetime) -> Plan:
    """Next status and actions for an admitted, unfinished run: the first of :data:`POLICIES` that decides."""
    inp = PlanInput.of(body, ctx, pods, now)
    for policy in POLICIES:
        out = policy(inp)
        if out is not None:
            return _upkeep(inp, out)
    raise AssertionError("unreachable: make_progress, the last policy, always decides")


def _deadline_left(body: Mapping[str, Any], start: datetime | None, now: datetime) -> float | None:
    """Seconds until ``runPolicy.activeDeadlineSeconds`` from ``start`` (negative: past it); None: no deadline."""
    deadline = ((body.get("spec") or {}).get("runPolicy") or {}).get("activeDeadlineSeconds")
    return (start + _seconds(deadline) - now).total_seconds() if deadline and start else None


def deadline_left(body: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds until the run's ``activeDeadlineSeconds`` from its ``startTime`` (negative: past); None: none."""
    return _deadline_left(body, c.parse_time((body.get("status") or {}).get("startTime")), now)


def by_deadline(delay: float | None, left: float | None) -> float | None:
    """A pass's wait, no longer than what is left of the deadline (a held run is woken when it passes)."""
    if delay is None or left is None:
        return delay
    return min(delay, max(left, 0.0))


def deadline_while(body: Mapping[str, Any], now: datetime, doing: str) -> Plan | None:
    """``Failed``/``DeadlineExceeded`` once ``activeDeadlineSeconds`` has passed while the run is held before its
    pods (``doing``: its dataset being fetched, its objects' names held by another owner, their creates refused),
    where :func:`plan`, whose :func:`deadline_exceeded` decides it otherwise, is never reached; None: not past it.
    """
    st = _Status.of(body, now)
    left = _deadline_left(body, st.old.start_time, now)
    if left is None or left > 0:
        return None
    deadline = body["spec"]["runPolicy"]["activeDeadlineSeconds"]
    message = f"the run exceeded runPolicy.activeDeadlineSeconds={deadline} while {doing}"
    st.fail(Reason.DEADLINE_EXCEEDED, message)
    return Plan(status=st.dump(), events=[("Warning", Phase.FAILED, message)])


def dataset_plan(body: Mapping[str, Any], state: FetchState, now: datetime) -> Plan:
    """Status while the run's dataset is fetched (no worker exists yet), once it is there, or when it failed.

    DatasetReady carries the state; an Event is planned only when that condition changes (not for every
    retry-count update of the message).
    """
    if state.action not in (FetchAction.READY, FetchAction.FAIL):
        ended = deadline_while(body, now, state.message)
        if ended is not None:
            return ended
    st = _Status.of(body, now)
    left = _deadline_left(body, st.old.start_time, now)
    if state.action is FetchAction.READY:
        st.cond(c.DATASET_READY, "True", state.reason, state.message)
    elif state.action is FetchAction.FAIL:
        st.cond(c.DATASET_READY, "False", state.reason, state.message)
        st.fail(state.reason, state.message)
    else:
        st.new.phase = Phase.PENDING
        st.cond(c.DATASET_READY, "False", state.reason, state.message)
        st.cond(c.WORKERS_READY, "False", Reason.WAITING_FOR_DATASET, "workers are created once the dataset is ready")
        st.cond(c.RUNNING, "False", Reason.WAITING_FOR_WORKERS, "the launcher starts once every worker is Ready")
        st.in_progress()
        st.say(state.message)
    out = Plan(status=st.dump(), requeue_after=left)
    if st.changed(c.DATASET_READY):
        kind = "Warning" if state.action is FetchAction.FAIL else "Normal"
        out.events.append((kind, state.reason.value, state.message))
    return out


def finalize(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The status as it is written: text from pods cleaned, and the kstatus conditions derived.

    ``Ready``, ``Reconciling`` and ``Stalled`` are a projection of the phase and the ``Failed``
    condition, computed here at write time, so that no policy can forget them and generic tools
    (Flux, Argo CD, ``kubectl wait --for=condition=Ready``) read every run the same way. The one
    input of its own is a ``Stalled``/``NoProgress`` set by :func:`plan` while Running.
    """
    raw = dict(status)
    if isinstance(raw.get("message"), str):
        raw["message"] = c.stored_text(raw["message"])
    st = _Status(StoredStatus.parse(raw, report=False), now, None)  # a part that does not validate was logged
    _kstatus(st)
    return st.dump()


def _kstatus(st: _Status) -> None:
    """Ready, Reconciling and Stalled of the next status (see :func:`finalize`); nothing without a phase.
    Their observedGeneration is the status' own."""
    new = st.new
    st.generation = new.observed_generation
    phase = new.phase
    if phase is None:
        return
    message = new.message or ""
    failed = c.find(new.conditions, c.FAILED)
    stalled = c.find(new.conditions, c.STALLED)
    no_progress = stalled is not None and (stalled.status, stalled.reason) == ("True", Reason.NO_PROGRESS)
    ready: _Cond
    stuck: _Cond
    if phase == Phase.SUCCEEDED:
        ready = ("True", Phase.SUCCEEDED, message)
    elif phase == Phase.FAILED:
        ready = ("False", failed.reason if failed else Phase.FAILED, (failed.message if failed else "") or message)
    else:
        ready = ("False", phase, message)
    reconciling: _Cond = ("False", phase, "the run finished") if phase in TERMINAL else ("True", phase, message)
    if phase == Phase.FAILED:
        stuck = ("True", ready[1], ready[2])
    elif phase == Phase.RUNNING and stalled is not None and no_progress:
        stuck = ("True", Reason.NO_PROGRESS, stalled.message)
    else:
        stuck = ("False", phase, "")
    for type_, (value, reason, text) in ((c.READY, ready), (c.RECONCILING, reconciling), (c.STALLED, stuck)):
        st.cond(type_, value, reason, text)


#: A status the API server refused (422) is replaced by this much, which it always accepts.
UNSTORABLE_MESSAGE_LIMIT = 1024


def unstorable_status(old: Mapping[str, Any], detail: str, now: datetime) -> dict[str, Any]:
    """The run fails with InvalidResult when the API server refused (422) a status write.

    Built from scratch rather than from the refused status: only fixed reasons, a short cleaned
    message and the stored fields, so this write cannot be refused for the same cause and the
    run cannot be retried forever while its workers hold their GPUs.
    """
    message = c.clean(f"the operator could not store the run's status (HTTP 422): {detail}")
    message = message[: UNSTORABLE_MESSAGE_LIMIT - 3] + "..." if len(message) > UNSTORABLE_MESSAGE_LIMIT else message
    gen = old.get("observedGeneration")
    gen = gen if isinstance(gen, int) and 0 <= gen <= 2**53 else None
    st = _Status(StoredStatus.parse({}), now, gen)
    st.new.phase = Phase.FAILED
    st.say(message)
    st.new.conditions = []
    st.cond(c.SUCCEEDED, "False", Reason.INVALID_RESULT, message)
    st.cond(c.FAILED, "True", Reason.INVALID_RESULT, message)
    done = StoredStatus.parse({"completionTime": old.get("completionTime")}, report=False).model.completion_time
    st.new.completion_time = done or c.instant(now)
    _kstatus(st)
    return st.dump()


def generation_patch(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"observedGeneration": g}`` for a finished run whose spec (runPolicy: ttl, cleanup) was edited
    after its daemon stopped, so that kstatus readers do not wait forever; None when current or unfinished
    (an unfinished run's daemon writes it with its next status)."""
    status = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    if status.get("phase") not in TERMINAL or generation is None or status.get("observedGeneration") == generation:
        return None
    return {"observedGeneration": generation}


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level status keys that changed (a JSON merge patch for the status subresource)."""
    return {k: v for k, v in new.items() if old.get(k) != v}


def ttl_expired(status: Mapping[str, Any], ttl: int | None, now: datetime) -> float | None:
    """Seconds until a finished run should be deleted (<= 0: now); None: keep it."""
    done = c.parse_time(status.get("completionTime"))
    if ttl is None or done is None:
        return None
    return (done + _seconds(ttl) - now).total_seconds()


def _seconds(value: float) -> timedelta:
    """A duration from a spec field, bounded like the CRD (int32): a run stored before the bound
    existed (e.g. 1e14) must not raise OverflowError on every pass."""
    return timedelta(seconds=min(float(value), float(MAX_INT32)))


def creation_failed(body: Mapping[str, Any], failures: list[tuple[str, int, str]], now: datetime) -> Plan:
    """The API server refused creations: ``failures`` = (what, HTTP status, its message), what being
    ``pod <name>`` or ``<Kind> <name>`` (the run's Service, ConfigMap or Secret).

    What each refusal means is :func:`refusal_is_final`'s: a final one fails the run; anything else (403
    from a ResourceQuota or a webhook: may pass later) is shown as CreateFailed on WorkersReady (or
    Running, for the launcher) while the caller retries with backoff. A Warning Event is planned
    whenever the message changes, not on every retry.
    """
    st = _Status.of(body, now)
    name, code, detail = next((f for f in failures if refusal_is_final(f[1], f[2])), failures[0])
    text = f"creating {name} was refused (HTTP {code}): {detail}"
    if len(failures) > 1:
        text += f" (and {len(failures) - 1} more)"
    reason = refusal_is_final(code, detail)
    if reason is not None:
        st.fail(reason, text)
        return Plan(status=st.dump(), events=[("Warning", Phase.FAILED, text)])
    type_ = refusal_condition(name)
    st.cond(type_, "False", Reason.CREATE_FAILED, text)
    st.say(text)
    # the stored message against the one set now (both cleaned): the same refusal again plans no Event
    changed = st.changed(type_, message=True)
    return Plan(status=st.dump(), events=[("Warning", Reason.CREATE_FAILED, text)] if changed else [])


#: How Pod Security admission words its refusal (k8s.io/pod-security-admission: ``pods "x" is forbidden:
#: violates PodSecurity "restricted:latest": ...``).
POD_SECURITY_REFUSAL = "violates PodSecurity"


def refusal_is_final(code: int, detail: str) -> Reason | None:
    """The reason a refused create fails the run with, or None when a retry may pass.

    - 422: the object is invalid and never will be accepted (``CreateFailed``);
    - 403 from Pod Security admission: the namespace's ``pod-security.kubernetes.io/enforce`` level refuses
      what the task and the run ask for (an ``nfs`` or ``hostPath`` dataset volume, ``spec.network``'s
      NET_ADMIN init container, ``MLBENCH_RUNNER_UID=image``): every retry builds the same pod, so the
      run fails at once (``PolicyViolation``, the refusal's text naming the field) instead of retrying
      until its deadline;
    - any other 403 (a ResourceQuota, a webhook) may pass once something else changes: retried.
    """
    if code == 422:
        return Reason.CREATE_FAILED
    if code == 403 and POD_SECURITY_REFUSAL in detail:
        return Reason.POLICY_VIOLATION
    return None


def refusal_condition(what: str) -> str:
    """The condition a refused create (``"<Kind> <name>"`` or ``"pod <name>"``) is shown on: ``Running`` for
    what comes with the launcher (its pod, and the headless Service created right before it once every
    worker is Ready), where :func:`make_progress` keeps it while the launcher is still to be created;
    ``WorkersReady`` for the rest, which would say AllWorkersReady over a refused Service at the next pass."""
    kind, _, name = what.partition(" ")
    return c.RUNNING if kind == "Service" or name.endswith(f"-{n.ROLE_LAUNCHER}") else c.WORKERS_READY


def object_conflict(body: Mapping[str, Any], kind: str, name: str, owner: str | None, now: datetime) -> Plan:
    """A Service/ConfigMap/Secret with the run's name exists but is not the run's: say so, wait."""
    st = _Status.of(body, now)
    text = (
        f"{kind} {name} already exists and is not owned by this run (owner uid {owner or 'none'}); "
        "waiting for it to be deleted"
    )
    st.cond(c.WORKERS_READY, "False", Reason.NAME_CONFLICT, text)
    st.say(text)
    changed = st.changed(c.WORKERS_READY, message=True)
    return Plan(status=st.dump(), events=[("Warning", Reason.NAME_CONFLICT, text)] if changed else [])
