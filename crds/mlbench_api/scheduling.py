"""A run's ``spec.scheduling``: where its pods may go (nodeSelector, tolerations, priority), the workers'
placement relative to each other, and gang scheduling.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from mlbench_api.common import (
    MAX_INT32,
    MAX_LABEL_VALUE,
    ApiModel,
    Name,
    SafeInt,
)


class Toleration(ApiModel):
    """A core/v1 Toleration, copied to every pod of the run."""

    key: Annotated[str, Field(max_length=316)] | None = None
    """Taint key to tolerate; empty with operator Exists tolerates every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists (any value) or Equal (the value below); Kubernetes' default is Equal."""
    value: Annotated[str, Field(max_length=63)] | None = None
    """Taint value to match with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; unset tolerates all effects."""
    toleration_seconds: SafeInt | None = None
    """With effect NoExecute: seconds the pod stays bound after the taint appears; unset: forever."""


class Placement(StrEnum):
    """Where the workers go relative to each other (the scheduler decides the rest)."""

    ANY = "Any"
    """Wherever the scheduler puts them, several on one node included."""
    ONE_WORKER_PER_NODE = "OneWorkerPerNode"
    """Every worker of a world on a node of its own (required pod anti-affinity on kubernetes.io/hostname): the
    seeds' scaling environment, where every message between workers crosses the network. A run with more workers
    than fitting nodes waits Unschedulable."""
    SPREAD = "Spread"
    """Spread over nodes as evenly as they allow (topology spread, maxSkew 1, best effort)."""


class Gang(ApiModel):
    """All-or-nothing scheduling of the workers by the scheduler-plugins coscheduling plugin: a PodGroup
    (scheduling.x-k8s.io/v1alpha1) with minMember = spec.workers, and every worker naming it and its scheduler.
    The launcher is no member: it is created only once every worker is Ready."""

    schedule_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_INT32)] | None = None
    """The PodGroup's scheduleTimeoutSeconds: how long the scheduler holds a partial gang before releasing it
    (unset: the plugin's own default)."""
    scheduler_name: Name | None = None
    """The scheduler the workers use (its profile runs coscheduling); unset: the operator's
    MLBENCH_GANG_SCHEDULER_NAME (default scheduler-plugins-scheduler)."""


class Scheduling(ApiModel):
    """Where the run's pods may go: applied to the workers, the launcher and the dataset fetch Job's pods."""

    placement: Placement | None = None
    """Where the workers go relative to each other: Any (default), OneWorkerPerNode or Spread."""

    node_selector: (
        Annotated[dict[str, Annotated[str, Field(max_length=MAX_LABEL_VALUE)]], Field(max_length=32)] | None
    ) = None
    """Node labels every pod requires (the pods' nodeSelector)."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = None
    """Taints the pods tolerate."""
    priority_class_name: Annotated[str, Field(max_length=253)] | None = None
    """PriorityClass of the pods (it must exist)."""
    gang: Gang | None = None
    """Gang-schedule the workers with the coscheduling plugin (its PodGroup CRD must be installed); unset: the
    default scheduler, one pod at a time."""
