"""One NetworkPolicy per run: its pods talk to each other, and to nobody else but the scrapers.

A rank's TCPStore (torch rendezvous), gloo's sockets and the workers' sshd all accept whoever
connects, and whoever reaches a TCPStore can make the ranks run code. So every pod of a run
accepts traffic only from pods of the same run (any port: ssh, rendezvous and gloo/NCCL use
ports chosen at run time), and the metrics ports also from the namespaces that scrape them (the
monitoring stack, and the operator's own namespace for ``status.progress``), plus the address
blocks the admin names for scrapers outside any namespace (a Prometheus on a host or in another
cluster: ``MLBENCH_METRICS_CIDRS``). Egress stays open:
DNS and the peers are all a rank needs, and a deny-all egress would break clusters whose DNS is
not where a policy expects it.

A dataset's fetch Job gets a policy of its own (:func:`fetch_network_policy`): nothing may connect to it, and where
the admin lists the blocks it may reach (``MLBENCH_FETCH_EGRESS_CIDRS``: the mirror, the object store, a proxy) it
reaches those and DNS only, so a tenant's dataset URL cannot be used to probe the cluster's inside.

Enforcement is the CNI's or a policy agent's (Calico, Cilium, kube-router, ...): on a cluster without
one the object is inert, which is why it is safe to always create it. The test cluster enforces it
with kube-router on every real node (tests/cluster/README.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlbench_api import contract
from mlbench_operator import fetchjob, runcontext
from mlbench_operator import naming as n

#: The label every namespace carries with its own name (Kubernetes 1.22+).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def metrics_ports(ctx: runcontext.RunContext) -> list[dict[str, Any]]:
    """Every rank's metrics port: ``9400 .. 9400 + slotsPerWorker - 1`` (a range needs Kubernetes 1.25+)."""
    slots = min(ctx.spec.slots_per_worker, ctx.config.world_size)
    port: dict[str, Any] = {"protocol": "TCP", "port": contract.METRICS_PORT}
    if slots > 1:
        port["endPort"] = contract.METRICS_PORT + slots - 1
    return [port]


def scraper_peers(namespaces: Sequence[str], cidrs: Sequence[str]) -> list[dict[str, Any]]:
    """Who may scrape: pods of ``namespaces``, and addresses in ``cidrs`` (ipBlock)."""
    peers: list[dict[str, Any]] = []
    if namespaces:
        expr = {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": list(namespaces)}
        peers.append({"namespaceSelector": {"matchExpressions": [expr]}})
    return peers + [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]


def network_policy(
    ctx: runcontext.RunContext, scrapers: Sequence[str], scraper_cidrs: Sequence[str] = ()
) -> dict[str, Any]:
    """The run's NetworkPolicy (owned by the run, named like it)."""
    own = {n.LABEL_RUN: ctx.name, n.LABEL_MANAGED_BY: n.MANAGER}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": own}}]}]
    peers = scraper_peers(scrapers, scraper_cidrs)
    if peers:
        ingress.append({"from": peers, "ports": metrics_ports(ctx)})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": ctx.name,
            "namespace": ctx.namespace,
            "labels": runcontext.labels(ctx),
            "ownerReferences": [runcontext.owner_reference(ctx)],
        },
        "spec": {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


#: What a fetch Job may always reach: DNS, on its standard port, wherever the cluster runs it.
DNS_PORTS: tuple[dict[str, Any], ...] = ({"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53})


def fetch_network_policy(job_name: str, namespace: str, dataset: str, egress: Sequence[str] | None) -> dict[str, Any]:
    """The policy of the fetch Job ``job_name`` (named like it, selecting its pods by the Job controller's label).

    No ingress at all; egress to the blocks ``egress`` and to DNS when ``egress`` is given, else open. Created
    before the Job so that its first pod already runs under it; like the dataset volume it outlives the Job (the
    next fetch of the same data has the same name) and goes with the namespace.
    """
    types = ["Ingress"]
    spec: dict[str, Any] = {"podSelector": {"matchLabels": {n.LABEL_JOB_NAME: job_name}}, "ingress": []}
    if egress is not None:
        types.append("Egress")
        spec["egress"] = [{"to": [{"ipBlock": {"cidr": cidr}} for cidr in egress]}, {"ports": list(DNS_PORTS)}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": job_name, "namespace": namespace, "labels": fetchjob.dataset_labels(dataset)},
        "spec": {**spec, "policyTypes": types},
    }
