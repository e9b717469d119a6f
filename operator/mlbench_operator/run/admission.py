"""Admission: a run resolved against its task once, the task snapshotted, the policy checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from mlbench_api import contract
from mlbench_api.common import ObjectMeta
from mlbench_api.config import AlgorithmNotAllowed, OverrideNotAllowed, effective_config
from mlbench_api.run import BenchmarkRun, BenchmarkRunSpec
from mlbench_api.runstatus import Phase, WorkerCounts
from mlbench_api.task import BenchmarkTaskSpec
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import Reason
from mlbench_operator.policy import AdmissionPolicy, check_placement, check_pod, check_priority, violations
from mlbench_operator.run.status import _short, _spec_workers, _Status
from mlbench_operator.runcontext import RunContext

DEFAULT_POLICY = AdmissionPolicy()


@dataclass(frozen=True)
class Rejection:
    """Why a run cannot start; it ends Failed with this reason, having created nothing."""

    reason: str  #: a :class:`Reason`
    message: str


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
    run_as_user: int | None = contract.RUNNER_UID,
    dataset_claim: str = n.DATASET_VOLUME,
) -> RunContext:
    """Rebuild the run's context from its spec and task snapshot; raises ValueError if invalid."""
    run = validate_run(body)
    meta = body.get("metadata") or {}
    task = BenchmarkTaskSpec.model_validate(snapshot)
    task_name = run.spec.task_ref.name
    namespace, uid = run.metadata.namespace or "default", meta.get("uid", "")
    config = effective_config(
        run,
        task_name,
        task,
        output_dir=contract.OUTPUT_DIR,
        metrics_port=contract.METRICS_PORT,
        run_uid=uid,
        checkpoint_dir=contract.checkpoint_dir(namespace, run.metadata.name, uid) if run.spec.checkpoint else None,
    )
    return RunContext(
        name=run.metadata.name,
        namespace=namespace,
        uid=uid,
        task_name=task_name,
        spec=run.spec,
        config=config,
        run_as_user=run_as_user,
        dataset_claim=dataset_claim,
    )


def admit(
    body: Mapping[str, Any],
    task: Mapping[str, Any] | None,
    run_as_user: int | None = contract.RUNNER_UID,
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
    snapshot = with_runner_image(snapshot, policy.runner_image)
    ctx = _admitted_context(body, snapshot, run_as_user, dataset_claim)
    if isinstance(ctx, Rejection):
        return ctx
    spec = body.get("spec") or {}
    image_field = "spec.image" if ctx.spec.image else f"BenchmarkTask {task_name!r} runner.image"
    if not ctx.spec.image and not ((task or {}).get("spec") or {}).get("runner", {}).get("image"):
        image_field = "the operator's MLBENCH_RUNNER_IMAGE"
    dataset = ctx.task.dataset_spec  # None for a collectives task
    volume = dataset.volume if dataset else None
    broken = violations(
        ctx.image, image_field, spec.get("scheduling"), volume, policy, network=spec.get("network"), pod=spec.get("pod")
    ) + check_pod(snapshot.get("pod"), policy, task_pod_field(task_name))
    if broken:
        return Rejection(Reason.POLICY_VIOLATION, "; ".join(broken))
    return ctx, snapshot


def task_pod_field(task_name: str) -> str:
    """How a refusal names a task's pod settings (a run's are ``spec.pod``)."""
    return f"BenchmarkTask {task_name!r} spec.pod"


def scheduling_rejection(body: Mapping[str, Any], policy: AdmissionPolicy = DEFAULT_POLICY) -> Rejection | None:
    """spec.scheduling checked again when a suspended run resumes: it may have changed while suspended."""
    scheduling = (body.get("spec") or {}).get("scheduling")
    broken = [
        *check_priority((scheduling or {}).get("priorityClassName"), policy),
        *check_placement(scheduling, policy),
    ]
    return Rejection(Reason.POLICY_VIOLATION, "; ".join(broken)) if broken else None


def _snapshot(task: Mapping[str, Any] | None, task_name: str) -> dict[str, Any] | Rejection:
    """The task's validated spec, as the run keeps it for good; a Rejection when missing or invalid."""
    if task is None:
        return Rejection(Reason.TASK_NOT_FOUND, f"BenchmarkTask {task_name!r} does not exist")
    try:
        return BenchmarkTaskSpec.model_validate(task.get("spec") or {}).to_api()
    except ValueError as err:
        return Rejection(Reason.INVALID_TASK, f"BenchmarkTask {task_name!r} is invalid: {_short(err)}")


def with_runner_image(snapshot: dict[str, Any], image: str) -> dict[str, Any]:
    """The snapshot with ``runner.image`` set to the operator's ``image`` when the task names none: the run keeps
    the image it was admitted with, whatever the operator's setting becomes."""
    runner = snapshot.get("runner") or {}
    if runner.get("image"):
        return snapshot
    return {**snapshot, "runner": {**runner, "image": image}}


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


def rejected_status(body: Mapping[str, Any], rejection: Rejection, now: datetime) -> dict[str, Any]:
    """Status for a run that cannot start (nothing was created)."""
    st = _Status.of(body, now)
    st.new.workers = WorkerCounts(ready=0, total=_spec_workers(body, 1))
    st.new.restarts = 0
    st.fail(rejection.reason, rejection.message)
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
