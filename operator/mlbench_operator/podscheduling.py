"""Pure: where a run's pods may go. Tolerations (the run's and the bound on a lost node), nodeSelector and
priority for every pod of the run; the workers' placement, affinity, topology spread and host namespaces; the
gang's scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlbench_api.scheduling import Gang, Placement
from mlbench_operator import naming as n
from mlbench_operator import podgroup as pg
from mlbench_operator.runcontext import Obj, RunContext

#: The taints the node lifecycle controller puts on a node that stopped answering (NoExecute: pods without a
#: toleration are evicted, with one they stay ``tolerationSeconds``; the DefaultTolerationSeconds admission plugin
#: gives every pod 300 s of both)
NODE_LOSS_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


def node_loss_tolerations(seconds: int | None, given: Sequence[Obj]) -> list[Obj]:
    """Tolerations that bound how long a pod waits on a lost node: a rank there is gone, and a gang that waits
    the default 300 s for its eviction holds every other worker idle. A taint the run tolerates itself is left
    to the run's own toleration."""
    if seconds is None:
        return []
    own = {t.get("key") for t in given}
    return [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
        for key in NODE_LOSS_TAINTS
        if key not in own
    ]


def pod_scheduling(ctx: RunContext, launcher: bool = False) -> Obj:
    """Tolerations, nodeSelector and priority of the run's pods: ``spec.scheduling`` (the workers', with their
    Kueue flavors' placement), or the launcher's own where Kueue gave its pod set other flavors."""
    sched = ctx.launcher_scheduling if launcher and ctx.launcher_scheduling is not None else ctx.spec.scheduling
    out: Obj = {}
    given = [t.to_api() for t in sched.tolerations] if sched is not None and sched.tolerations else []
    tolerations = given + node_loss_tolerations(ctx.node_loss_seconds, given)
    if tolerations:
        out["tolerations"] = tolerations
    if sched is None:
        return out
    if sched.node_selector:
        out["nodeSelector"] = dict(sched.node_selector)
    if sched.priority_class_name:
        out["priorityClassName"] = sched.priority_class_name
    return out


#: the node label that tells nodes apart (every kubelet sets it)
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def world_selector(ctx: RunContext, attempt: int) -> Obj:
    """The label selector of one world's workers (attempt ``attempt`` of the run): never the launcher, never
    another attempt's pods."""
    return {"matchLabels": {n.LABEL_RUN: ctx.name, n.LABEL_ROLE: n.ROLE_WORKER, n.LABEL_ATTEMPT: str(attempt)}}


def worker_placement(ctx: RunContext, attempt: int) -> Obj:
    """The worker pods' fields for ``spec.scheduling.placement``, over the workers of one world (attempt):
    a required anti-affinity for OneWorkerPerNode, a best-effort topology spread for Spread, nothing for Any."""
    placement = ctx.spec.scheduling.placement if ctx.spec.scheduling else None
    world = world_selector(ctx, attempt)
    if placement == Placement.ONE_WORKER_PER_NODE:
        term = {"labelSelector": world, "topologyKey": HOSTNAME_TOPOLOGY}
        return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}
    if placement == Placement.SPREAD:
        spread = {"maxSkew": 1, "topologyKey": HOSTNAME_TOPOLOGY, "whenUnsatisfiable": "ScheduleAnyway"}
        return {"topologySpreadConstraints": [{**spread, "labelSelector": world}]}
    return {}


def merged_affinity(placement: Obj, given: Obj | None) -> Obj:
    """``spec.pod.affinity`` with the placement's own pod anti-affinity added: the required terms of both hold
    (a term list is ANDed), neither is dropped."""
    out = {**(given or {})}
    own = placement.get("podAntiAffinity")
    if own is None:
        return out
    anti = dict(out.get("podAntiAffinity") or {})
    for key, terms in own.items():
        anti[key] = [*(anti.get(key) or []), *terms]
    out["podAntiAffinity"] = anti
    return out


def worker_pod_settings(ctx: RunContext, attempt: int) -> Obj:
    """The worker pod's placement (:func:`worker_placement`) merged with ``spec.pod``'s affinity and topology
    spread (a constraint without a labelSelector spreads this world's workers: without one it would count no pod),
    and its host namespaces: with ``hostNetwork``, ``dnsPolicy: ClusterFirstWithHostNet`` so that the
    workers still resolve each other's Service names."""
    placement = worker_placement(ctx, attempt)
    pod = ctx.pod
    if pod is None:
        return placement
    out: Obj = {}
    affinity = merged_affinity(placement.get("affinity") or {}, pod.affinity)
    if affinity:
        out["affinity"] = affinity
    world = world_selector(ctx, attempt)
    given = [
        c if "labelSelector" in c else {**c, "labelSelector": world} for c in pod.topology_spread_constraints or []
    ]
    spread = [*placement.get("topologySpreadConstraints", []), *given]
    if spread:
        out["topologySpreadConstraints"] = spread
    if pod.host_network:
        out |= {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}
    if pod.host_ipc:
        out["hostIPC"] = True
    return out


def gang(ctx: RunContext) -> Gang | None:
    """``spec.scheduling.gang``, when set."""
    return ctx.spec.scheduling.gang if ctx.spec.scheduling is not None else None


def gang_scheduler(ctx: RunContext) -> Obj:
    """A gang-scheduled worker's ``schedulerName`` (the run's, else the operator's); nothing without ``gang``."""
    g = gang(ctx)
    return {} if g is None else {"schedulerName": pg.scheduler_name(g, ctx.gang_scheduler_name)}
