"""The hardware a result was measured on: the node labels that name it, how they join each rank's record,
and the one text ``mlbench results`` groups configurations by, so two clusters' results never mix.

Node labels reach the result through the operator, not the pods: the downward API cannot expose a node's
labels, and letting the runner read Node objects would give every run's service account a cluster-scoped
permission. The operator reads the nodes its run's ranks ran on (``environment.nodes``, from each pod's
``spec.nodeName``) when it keeps the results and joins their labels here (:func:`with_node_labels`), by
node name. Outside a cluster the label fields stay null; what the runner sees itself (the driver, CUDA)
is there either way.
"""

from __future__ import annotations

from collections.abc import Mapping

from mlbench_api.results import RankHardware, RunSummary

#: Node label -> RankHardware field (well-known Kubernetes labels; NVIDIA GPU feature discovery's).
NODE_LABELS = {
    "node.kubernetes.io/instance-type": "instance_type",
    "topology.kubernetes.io/zone": "zone",
    "nvidia.com/gpu.product": "gpu_product",
    "nvidia.com/gpu.count": "gpu_count",
}


#: At most this many nodes are read per run when its results are kept (one GET each).
MAX_NODES_READ = 256


def from_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The RankHardware fields a node's labels give (only those it has)."""
    return {field: labels[label] for label, field in NODE_LABELS.items() if labels.get(label)}


def with_node_labels(summary: RunSummary, labels_by_node: Mapping[str, Mapping[str, str]]) -> RunSummary:
    """``summary`` with each rank's hardware completed from its node's labels (a node not in
    ``labels_by_node``, e.g. gone already, keeps null fields). Ranks without a hardware record get one from
    ``environment.nodes`` (a runner that recorded only node names)."""
    env = summary.environment
    ranks = env.hardware or [RankHardware(node=node) for node in env.nodes or []]
    if not ranks:
        return summary
    joined = [r.model_copy(update=from_labels(labels_by_node.get(r.node or "", {}))) for r in ranks]
    return summary.model_copy(update={"environment": env.model_copy(update={"hardware": joined})})


def hardware_nodes(summary: RunSummary) -> list[str]:
    """The distinct nodes the ranks ran on, in first-rank order (what the operator reads labels of)."""
    env = summary.environment
    names = [r.node for r in env.hardware or []] or list(env.nodes or [])
    return list(dict.fromkeys(n for n in names if n))


def hardware_label(summary: RunSummary) -> str:
    """What separates results by machine: every distinct (instance type, zone, GPU product and count, driver,
    CUDA) of the ranks, sorted; node names are left out (the same hardware, another node: the same result)."""
    kinds = {
        "/".join(
            str(v) if v is not None else "-"
            for v in (r.instance_type, r.zone, r.gpu_product, r.gpu_count, r.driver, r.cuda)
        )
        for r in summary.environment.hardware or []
    }
    return "; ".join(sorted(kinds)) or "unknown"
