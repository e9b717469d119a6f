"""A run's ``spec.runPolicy`` (restarts, deadlines, cleanup, TTL) and ``spec.checkpoint``: what happens to a run
over time.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from mlbench_api.common import (
    MAX_INT32,
    ApiModel,
    Name,
)


class CheckpointPolicy(ApiModel):
    """Epoch-end checkpoints, so that a gang restart continues the run instead of training from epoch 0."""

    claim_name: Name
    """The PersistentVolumeClaim (run's namespace) for the checkpoints, mounted on every worker at /checkpoints;
    rank 0 writes <namespace>/<run>-<uid>/checkpoint.mlbc there after each epoch. Writable by UID/fsGroup 1000;
    ReadWriteMany when workers may land on several nodes."""


class CleanPodPolicy(StrEnum):
    """What to delete when a run finishes (Kubeflow's meanings)."""

    RUNNING = "Running"  #: delete unfinished pods (launcher included); keep finished ones for their logs
    ALL = "All"  #: delete every pod
    NONE = "None"  #: keep every pod


#: The longest wait between two attempts after a startup deadline (runPolicy.startupBackoffSeconds doubles up to it).
STARTUP_BACKOFF_MAX_SECONDS = 3600


class RunPolicy(ApiModel):
    """Restarts, deadline and cleanup; the one part of the spec that may change after creation."""

    active_deadline_seconds: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = Field(
        default=None,
        description="Seconds from status.startTime (admission; a dataset fetch counts) until the run fails with "
        "DeadlineExceeded (1 to 2^31-1, as for a Pod). Unset: no deadline. On a run, once set it may be lowered, "
        "not raised or removed (every pod carries it).",
    )
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3
    """Gang restarts allowed, 0 to 100 (default 3): any failed pod restarts every pod; the next failure after this
    many fails the run."""
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    """Pods deleted when the run ends: Running (default: unfinished pods; finished ones kept for logs), All, or None."""
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, le=MAX_INT32)] | None = Field(
        default=None,
        description="Seconds after status.completionTime until the run and everything it owns is deleted "
        "(0 to 2^31-1, as for a Job). Unset: kept until deleted.",
    )
    progress_deadline_seconds: Annotated[int, Field(ge=10, le=MAX_INT32)] | None = None
    """Seconds the training step counter (status.progress.step) may stand still while Running before the run is
    marked Stalled=True with reason NoProgress and a Warning Event (default 600). The run is not stopped: use
    activeDeadlineSeconds for that. Only once a step was seen (rank 0's metrics reachable)."""
    startup_deadline_seconds: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    """Seconds from an attempt's first pod until every worker is Ready and the launcher runs (default 600).
    Past it the pods are deleted, the pods' reasons (Unschedulable, ImagePullBackOff, ...) recorded, and the run
    retried after startupBackoffSeconds (not counted against maxRestarts) or failed (StartupDeadlineExceeded)."""
    startup_retries: Annotated[int, Field(ge=0, le=100)] = 3
    """New attempts after a startup deadline passed, 0 to 100 (default 3); the next one past it fails the run."""
    startup_backoff_seconds: Annotated[int, Field(ge=0, le=STARTUP_BACKOFF_MAX_SECONDS)] = 60
    """Wait before the first new attempt after a startup deadline (default 60 s, 0 to 3600); it doubles with each
    further one, up to 3600 s (Kueue's requeuing backoff)."""
