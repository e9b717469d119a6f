"""A run's context for the pure builders, and what every object of the run carries: its owner reference,
labels and metadata.

The builders (:mod:`.runobjects`, :mod:`.runpods`, :mod:`.podscheduling`, :mod:`.fetchjob`) take a run's context in
and give Kubernetes objects (plain dicts) out. No API calls and no clock there, so every object the operator
creates can be checked in a unit test: names, owner references, labels, resources, the exact hostfile.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from mlbench_api import contract
from mlbench_api.common import API_VERSION
from mlbench_api.config import RunConfig
from mlbench_api.pod import PodSettings, merge
from mlbench_api.run import BenchmarkRunSpec
from mlbench_api.scheduling import Scheduling
from mlbench_api.task import BenchmarkTaskSpec
from mlbench_operator import naming as n
from mlbench_operator.settings import GANG_SCHEDULER_NAME, NODE_LOSS_SECONDS, SCRATCH_LIMITS, ScratchLimits

Obj = dict[str, Any]


@dataclass(frozen=True)
class RunContext:
    """Everything the builders need to know about one run (already validated)."""

    name: str
    namespace: str
    uid: str
    task_name: str
    spec: BenchmarkRunSpec
    config: RunConfig
    #: UID for every container (non-root; the image must have this user for ssh). None: the image's user.
    run_as_user: int | None = contract.RUNNER_UID
    #: The namespace's dataset volume (PVC) that sourced datasets live in.
    dataset_claim: str = n.DATASET_VOLUME
    #: Ranks keep serving metrics this long after training, so Prometheus scrapes the final values.
    metrics_linger_seconds: int = contract.METRICS_LINGER_SECONDS
    #: How long the run's pods stay bound to a node that stopped answering (None: Kubernetes' 300 s default).
    node_loss_seconds: int | None = NODE_LOSS_SECONDS
    #: The operator's scheduler for gang-scheduled workers whose run names none (``MLBENCH_GANG_SCHEDULER_NAME``).
    gang_scheduler_name: str = GANG_SCHEDULER_NAME
    #: Size limits of ``/dev/shm`` and the output emptyDir (``MLBENCH_SHM_SIZE_LIMIT``, ``MLBENCH_OUTPUT_SIZE_LIMIT``).
    scratch: ScratchLimits = SCRATCH_LIMITS
    #: The launcher's scheduling when it is not ``spec.scheduling``: the flavors Kueue assigned the launcher's pod
    #: set (run.kueue.placed); None: ``spec.scheduling``, as every other pod of the run.
    launcher_scheduling: Scheduling | None = None

    @property
    def task(self) -> BenchmarkTaskSpec:
        """The task as this run sees it: the snapshot with the run's overrides applied."""
        return self.config.task

    @cached_property
    def pod(self) -> PodSettings | None:
        """The pod settings of the run's pods: the task's ``pod`` under the run's ``spec.pod``
        (:func:`mlbench_api.pod.merge`)."""
        return merge(self.task.pod, self.spec.pod)

    @property
    def image(self) -> str:
        image = self.spec.image or self.task.runner.image
        if image is None:  # admission fills the snapshot's runner.image (run.admission.with_runner_image)
            raise ValueError("runner.image: the task snapshot names no image")
        return image


def owner_reference(ctx: RunContext) -> Obj:
    """Controller owner reference: deleting the run garbage-collects everything it owns."""
    return run_owner_reference(ctx.name, ctx.uid)


def run_owner_reference(run: str, uid: str) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": "BenchmarkRun",
        "name": run,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(
    ctx: RunContext, role: str | None = None, rank: int | None = None, attempt: int | None = None
) -> dict[str, str]:
    out = {
        n.LABEL_RUN: ctx.name,
        n.LABEL_TASK: ctx.task_name,
        n.LABEL_MANAGED_BY: n.MANAGER,
    }
    if role is not None:
        out[n.LABEL_ROLE] = role
    if rank is not None:
        out[n.LABEL_RANK] = str(rank)
    if attempt is not None:
        out[n.LABEL_ATTEMPT] = str(attempt)
    return out


def object_metadata(ctx: RunContext, name: str, **label_args: Any) -> Obj:
    return {
        "name": name,
        "namespace": ctx.namespace,
        "labels": labels(ctx, **label_args),
        "ownerReferences": [owner_reference(ctx)],
    }
