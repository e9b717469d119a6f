"""Whether the nodes of a failed world still answer: a lost node is a disruption, not the run's failure.

A node that loses power or its network takes its worker with it, and mpirun on the launcher fails soon after
("lost communication"), while the API server still lists the worker Running: the node lifecycle controller marks
the node NotReady only after its grace period (40 to 60 s) and evicts its pods later still. A launcher failure
decided before then would spend ``maxRestarts`` on a disruption. The kubelet says sooner: it renews its node's
Lease (``kube-node-lease``) every 10 s, a quarter of the Lease's 40 s. Twice that unrenewed and the node has
stopped answering; a few seconds unrenewed and it may have (the decision waits, :func:`wait`).

Pure: the executor reads the Nodes and Leases (:func:`to_check` says which), this module judges them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mlbench_operator import conditions as c
from mlbench_operator.podview import PodPhase, PodView

#: The kubelet's Lease renewal interval (a quarter of its default 40 s ``leaseDurationSeconds``).
RENEW_SECONDS = 10.0
#: A Lease unrenewed this long: the node stopped answering (two renewals missed).
SILENT_AFTER_SECONDS = 2 * RENEW_SECONDS
#: A Lease unrenewed this long may be late or lost: a launcher failure waits to see which.
SUSPECT_AFTER_SECONDS = RENEW_SECONDS + 2.0


@dataclass(frozen=True)
class NodeState:
    """What a worker's node says now: ``silent`` is why it stopped answering (None: it answers); ``wait`` is the
    seconds until a late Lease would count as silent (0 unless the Lease is suspect)."""

    silent: str | None = None
    wait: float = 0.0


ANSWERING = NodeState()


def _ready(node: Mapping[str, Any]) -> Mapping[str, Any]:
    conditions = (node.get("status") or {}).get("conditions") or []
    return next((cond for cond in conditions if cond.get("type") == "Ready"), {})


def judge(node: Mapping[str, Any] | None, lease: Mapping[str, Any] | None, now: datetime) -> NodeState:
    """The state of one node from its Node object and its kubelet's Lease (None: not found)."""
    if node is None:
        return NodeState(silent="its Node object is gone")
    ready = _ready(node)
    if ready and ready.get("status") != "True":
        why = f"{ready.get('reason') or 'NotReady'}: {ready.get('message') or 'no message'}"
        return NodeState(silent=f"Ready={ready.get('status')}, {why}")
    renewed = c.parse_time(((lease or {}).get("spec") or {}).get("renewTime"))
    if renewed is None:
        return ANSWERING  # no Lease to judge by (an old kubelet, a fake node): the Ready condition decides
    age = (now - renewed).total_seconds()
    if age > SILENT_AFTER_SECONDS:
        return NodeState(silent=f"its kubelet last renewed its Lease {age:.0f} s ago")
    if age > SUSPECT_AFTER_SECONDS:
        return NodeState(wait=SILENT_AFTER_SECONDS - age)
    return ANSWERING


def to_check(workers: Iterable[PodView], launcher: PodView | None) -> list[str]:
    """The nodes worth reading: those of the running workers, once the launcher failed (mpirun fails when a node
    is lost); none otherwise, so a healthy run costs the API server nothing."""
    if launcher is None or launcher.phase != PodPhase.FAILED:
        return []
    return sorted({w.node for w in workers if w.node and w.phase == PodPhase.RUNNING})


def lost_worker(workers: Mapping[int, PodView], nodes: Mapping[str, NodeState]) -> str | None:
    """The first worker whose node stopped answering, said as a disruption; None when every node answers."""
    for rank in sorted(workers):
        pod = workers[rank]
        state = nodes.get(pod.node or "", ANSWERING)
        if state.silent is not None:
            return f"worker {rank} (pod {pod.name}) is on node {pod.node}, which stopped answering ({state.silent})"
    return None


def wait(nodes: Mapping[str, NodeState]) -> float | None:
    """Seconds until every suspect Lease is either renewed or counts as silent; None: nothing to wait for."""
    left = max((state.wait for state in nodes.values()), default=0.0)
    return left if left > 0 else None
