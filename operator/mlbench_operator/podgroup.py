"""Gang scheduling (``spec.scheduling.gang``) through the scheduler-plugins coscheduling plugin's published API.

One PodGroup (``scheduling.x-k8s.io/v1alpha1``) per run, named like the run and owned by it, reused by every
attempt (as mpi-operator does: ``minMember`` is ``spec.workers``, which never changes, and a gang restart deletes
the old attempt's pods before the new ones exist). Its members are the workers only: the launcher is created
after every worker is Ready (:mod:`.run.progressing`), so counting it would hold the gang for a pod that cannot
exist yet. Each worker names the group (label :data:`POD_GROUP_LABEL`) and the scheduler that runs the plugin.

Written against the published CRD only; no coscheduling scheduler runs on the test cluster (docs/operator.md,
"Gang scheduling").
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

from mlbench_api.scheduling import Gang

Obj = dict[str, Any]

GROUP = "scheduling.x-k8s.io"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "PodGroup"
#: The label by which the coscheduling plugin finds a pod's group.
POD_GROUP_LABEL = f"{GROUP}/pod-group"
#: The CRD a gang run needs; named in the run's condition when the API server does not know it.
CRD_NAME = f"podgroups.{GROUP}"
MISSING_CRD = (
    f"the PodGroup CRD ({CRD_NAME}) is not installed: spec.scheduling.gang needs the scheduler-plugins "
    "coscheduling plugin and its CRD on the cluster"
)


def total(requests: Mapping[str, str], count: int) -> dict[str, str]:
    """``count`` times each quantity of ``requests`` (a PodGroup's minResources), as plain decimal quantities."""
    out: dict[str, str] = {}
    for name, quantity in sorted(requests.items()):
        value: Decimal = parse_quantity(quantity) * count
        out[name] = format(value.normalize(), "f")
    return out


def pod_group(name: str, meta: Obj, gang: Gang, workers: int, requests: Mapping[str, str]) -> Obj:
    """The run's PodGroup: ``meta`` is its metadata (namespace, labels, owner), ``requests`` one worker's."""
    spec: Obj = {"minMember": workers}
    if requests:
        spec["minResources"] = total(requests, workers)
    if gang.schedule_timeout_seconds is not None:
        spec["scheduleTimeoutSeconds"] = gang.schedule_timeout_seconds
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {**meta, "name": name}, "spec": spec}


def scheduler_name(gang: Gang, default: str) -> str:
    """The run's own scheduler name, else the operator's (``MLBENCH_GANG_SCHEDULER_NAME``)."""
    return gang.scheduler_name or default


def is_missing_crd(kind: str, status: int) -> bool:
    """A 404 on creating a PodGroup: the API server serves no such resource (the CRD is not installed)."""
    return kind == KIND and status == 404
