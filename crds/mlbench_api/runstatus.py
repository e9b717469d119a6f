"""A run's status: written only by the operator (the status subresource); its phase, conditions, counts, live
progress, final result, where its full results are kept, and the task snapshot it started from.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from mlbench_api import contract
from mlbench_api.common import (
    MAX_SAFE_INT,
    ApiModel,
    Condition,
    Finite,
    SafeInt,
)
from mlbench_api.goal import GoalMetric
from mlbench_api.task import BenchmarkTaskSpec

#: Most files a run's kept results may name (status.results.files and .truncated); the results bundle
#: (mlbench_api.bundle) refuses more, so a launcher's line can never produce a status the API server refuses.
MAX_RESULT_FILES = 8


class Phase(StrEnum):
    SUSPENDED = contract.SUSPENDED  #: spec.suspend, or queued (Kueue): no pods
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


#: The phases a run never leaves (members equal their strings: ``status.get("phase") in TERMINAL`` reads the wire).
TERMINAL: tuple[Phase, ...] = (Phase.SUCCEEDED, Phase.FAILED)


class WorkerCounts(ApiModel):
    """How many worker pods exist and are Ready."""

    ready: Annotated[int, Field(ge=0)] = 0
    """Worker pods of the current attempt that are Ready (sshd answering)."""
    total: Annotated[int, Field(ge=0)] = 0
    """Worker pods the run wants (spec.workers)."""


class Progress(ApiModel):
    """Live view scraped from rank 0; best effort."""

    epoch: Annotated[Finite, Field(ge=0)] | None = None
    """Epochs done so far, fractional (2.5 = half way through the third)."""
    epoch_rounded: Annotated[str, Field(max_length=16)] | None = None
    """epoch cut to tenths (``2.3``, ``8``), the column ``kubectl get br`` shows."""
    step: Annotated[int, Field(ge=0, le=MAX_SAFE_INT)] | None = None
    """Optimizer steps done so far."""
    last_accuracy: Annotated[Finite, Field(ge=0, le=1)] | None = None
    """Accuracy (fraction) of the latest evaluation."""
    accuracy: Annotated[str, Field(max_length=16)] | None = None
    """lastAccuracy as a percentage with one decimal (``81.2%``)."""
    last_score: Annotated[Finite, Field(ge=0)] | None = None
    """The task's goal metric (goal.metric) at the latest evaluation: an accuracy as a fraction, BLEU (0 to 100),
    a perplexity or a loss. For an accuracy goal the same as lastAccuracy."""
    score: Annotated[str, Field(max_length=24)] | None = None
    """lastScore as the column ``kubectl get br`` shows it, in the metric's own form: ``81.2%``, ``24.3 BLEU``,
    ``ppl 71.2``, ``loss 0.412``."""
    samples_per_second: Annotated[Finite, Field(ge=0)] | None = None
    """Global training throughput so far: samples of all ranks per second of step time."""
    updated_at: datetime | None = None
    """When the operator last read these figures (RFC 3339)."""
    step_changed_at: datetime | None = None
    """When the step counter was last seen to move (RFC 3339); what runPolicy.progressDeadlineSeconds measures."""


class RunResult(ApiModel):
    """The final figures, copied from the launcher's termination message."""

    goal_reached: bool
    """Whether the selected target (spec.goal) was reached."""
    time_to_goal_seconds: Finite | None = None
    """Seconds from the run's start (before data loading) to the end of the evaluation that first met the target."""
    time_to_goal: Annotated[str, Field(max_length=32)] | None = None
    """timeToGoalSeconds as a duration (``6.5s``, ``4m07s``, ``1h02m09s``), the column ``kubectl get br`` shows."""
    best_accuracy: Finite | None = None
    """Best accuracy (fraction) of any evaluation."""
    final_accuracy: Finite | None = None
    """Accuracy (fraction) of the last evaluation."""
    goal_metric: GoalMetric | None = None
    """The metric the goal compares (the task's goal.metric); bestScore and finalScore are values of it."""
    best_score: Finite | None = None
    """The goal metric's best value of any evaluation (the lowest for perplexity and loss)."""
    final_score: Finite | None = None
    """The goal metric's value at the last evaluation."""
    bleu_signature: Annotated[str, Field(max_length=256)] | None = None
    """A BLEU goal: sacrebleu's signature, saying how BLEU was computed (tokenizer, smoothing, version)."""
    epochs: Finite | None = None
    """Epochs trained, fractional (steps / steps per epoch)."""
    wall_clock_seconds: Finite | None = None
    """Seconds from the run's start to its stop, evaluation and set-up included (one-time data decoding excluded)."""
    compute_seconds: Finite | None = None
    """Seconds of forward + backward + optimizer on rank 0 (with ddp, backward includes its overlapped all-reduce)."""
    communication_seconds: Finite | None = None
    """Seconds rank 0 spent in the gradient all-reduce, waiting for the slowest rank included (0 with ddp)."""
    samples_per_second: Finite | None = None
    """Global training throughput: samples of all ranks / summed step time."""
    world_size: SafeInt | None = None
    """Processes that trained (workers x slotsPerWorker)."""
    resumes: SafeInt | None = None
    """Times the run continued from its epoch-end checkpoint after a gang restart (spec.checkpoint; 0: never)."""
    bytes_per_step: SafeInt | None = None
    """Payload bytes each rank sent per step (the algorithm's declaration; status.results has the full record)."""
    compression_ratio: Finite | None = None
    """Uncompressed (allreduce-sgd) bytes per step / bytesPerStep: above 1, the algorithm sends less."""
    compression: Annotated[str, Field(max_length=16)] | None = None
    """compressionRatio with one decimal (``71.9x``), the column ``kubectl get br -o wide`` shows."""
    peak_bus_bandwidth: Annotated[dict[str, Finite], Field(max_length=8)] | None = None
    """Collectives tasks: the highest bus bandwidth in bytes per second of each operation (all-reduce, all-gather,
    broadcast) over the sizes swept, as nccl-tests defines busbw; status.results has every size."""
    image: Annotated[str, Field(max_length=512)] | None = None
    """The runner image the run asked for (spec.image or the task's runner.image)."""
    image_ids: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=8)] | None = None
    """The image digests the ranks' containers actually ran (the kubelet's imageID of every worker, deduplicated):
    what a tag pointed to at run time. More than one means the tag moved during the run."""


#: A SHA-256 digest in hex (``status.results.sha256``'s values).
_SHA256_HEX = r"^[0-9a-f]{64}$"


#: Interrupted results collections (``status.results.attempts``) after which the operator gives up.
MAX_COLLECT_ATTEMPTS = 3


class ResultsRef(ApiModel):
    """Where the run's full results (summary with history, event log, config) are kept, or why not.

    ``mlbench results <namespace>/<run>`` downloads them; the ConfigMap is owned by the run.
    """

    config_map: Annotated[str, Field(max_length=253)] | None = Field(
        default=None, description="ConfigMap holding the gzip files (binaryData)."
    )
    files: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=MAX_RESULT_FILES)] | None = None
    """Keys of the ConfigMap's binaryData, e.g. summary.json.gz, events.jsonl.gz, config.json.gz."""
    compressed_bytes: Annotated[int, Field(ge=0)] | None = None
    """Total size of the kept files, gzip-compressed, in bytes."""
    truncated: Annotated[list[Annotated[str, Field(max_length=253)]], Field(max_length=MAX_RESULT_FILES)] | None = (
        Field(default=None, description="Files cut to fit the 1 MiB ConfigMap limit (the event log only).")
    )
    collected_at: datetime | None = None
    """When the operator wrote the ConfigMap (RFC 3339)."""
    message: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="Why no results were kept (e.g. the launcher never ran mpirun)."
    )
    failing_since: datetime | None = None
    """When reading the launcher's log (or keeping its files) first failed (RFC 3339); the operator retries
    for MLBENCH_RESULTS_WAIT_SECONDS (60 s) from then before it records why nothing was kept."""
    sha256: (
        Annotated[
            dict[str, Annotated[str, Field(pattern=_SHA256_HEX, max_length=64)]], Field(max_length=MAX_RESULT_FILES)
        ]
        | None
    ) = None
    """The SHA-256 of each kept file as the launcher printed it (uncompressed), by file name: what ``mlbench
    results`` checks the ConfigMap's files against (an object a namespace editor can edit; this status is not)."""
    attempts: Annotated[int, Field(ge=0, le=MAX_COLLECT_ATTEMPTS)] | None = None
    """Collections started and not yet ended, recorded before the launcher's log is read: one that an operator
    restart interrupted counts, and after MAX_COLLECT_ATTEMPTS of them the operator gives up instead of
    reading the same log again after every restart."""


class LauncherRecord(ApiModel):
    """The launcher pod the operator created for an attempt: the UID the API server answered its create with.
    Only that pod is the run's launcher (its exit and termination message are the run's result); another pod
    of the launcher's name, even one carrying the run's ownerReference and labels, is not."""

    uid: Annotated[str, Field(min_length=1, max_length=64)]
    """The UID the API server answered the operator's launcher create with."""
    attempt: Annotated[int, Field(ge=0)]
    """The attempt (status.restarts when it was created) the launcher belongs to."""
    image_id: Annotated[str, Field(max_length=512)] | None = None
    """The digest the launcher's container ran (the kubelet's imageID), once it started: what printed the result."""


class BenchmarkRunStatus(ApiModel):
    """What the operator observed; written only by the operator (the status subresource)."""

    phase: Phase | None = None
    """Pending (admitted; dataset, workers being created or scheduled), Starting (waiting for Ready and the
    launcher), Running (launcher running), then Succeeded or Failed. A gang restart goes back to Pending."""
    conditions: Annotated[list[Condition], Field(max_length=16)] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """DatasetReady, WorkersReady, Running, GoalReached, Succeeded, Failed and Restarted, one of each type; the
    reason of Failed is the cause (e.g. OOMKilled, TaskNotFound)."""
    observed_generation: int | None = None
    """The metadata.generation of the spec this status reflects."""
    start_time: datetime | None = None
    """When the operator admitted the run (RFC 3339); runPolicy.activeDeadlineSeconds counts from here."""
    completion_time: datetime | None = None
    """When the run succeeded or failed (RFC 3339); runPolicy.ttlSecondsAfterFinished counts from here."""
    workers: WorkerCounts | None = None
    """Worker pods ready and wanted."""
    restarts: Annotated[int, Field(ge=0)] | None = None
    """Gang restarts so far (the current attempt's number); at most runPolicy.maxRestarts plus disruptionRestarts
    plus startupTimeouts."""
    disruption_restarts: Annotated[int, Field(ge=0)] | None = None
    """Of those, the restarts a disruption caused (a drain, an eviction, a preemption, a lost node: a pod with the
    DisruptionTarget condition); they do not count against runPolicy.maxRestarts."""
    startup_timeouts: Annotated[int, Field(ge=0)] | None = None
    """Of those, the restarts after runPolicy.startupDeadlineSeconds passed (the attempt's pods released); they do
    not count against runPolicy.maxRestarts but against runPolicy.startupRetries."""
    startup_retry_at: datetime | None = None
    """When the attempt after the last startup timeout may create its pods (RFC 3339): the backoff's end."""
    progress: Progress | None = None
    """Live figures from rank 0's metrics, refreshed about every 30 s while Running; best effort."""
    result: RunResult | None = None
    """The final figures, from the launcher's termination message; set when the launcher has finished."""
    results: ResultsRef | None = None
    """Where the full results are kept (ConfigMap <run>-results), or why they are not."""
    launcher: LauncherRecord | None = None
    """The launcher the operator created for the current (or last) attempt."""
    message: Annotated[str, Field(max_length=32768)] | None = None
    """One line for humans: what the run is doing or why it failed."""
    task_snapshot: BenchmarkTaskSpec | None = None
    """The task's spec as copied at admission; the run (gang restarts included) uses it, not later task edits."""
