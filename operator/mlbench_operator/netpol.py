"""One NetworkPolicy per run: its pods talk to each other and to DNS, and only the scrapers get in besides.

A rank's TCPStore (torch rendezvous), gloo's sockets and the workers' sshd all accept whoever
connects, and whoever reaches a TCPStore can make the ranks run code. So every pod of a run
accepts traffic only from pods of the same run (any port: ssh, rendezvous and gloo/NCCL use
ports chosen at run time), and the metrics ports also from the namespaces that scrape them (the
monitoring stack, and the operator's own namespace for ``status.progress``), plus the address
blocks the admin names for scrapers outside any namespace (a Prometheus on a host or in another
cluster: ``MLBENCH_METRICS_CIDRS``). Egress: the run's own pods (any port) and DNS (port 53, anywhere: the
cluster's DNS may be a Service, a node-local cache on a link-local address or a resolver outside the cluster) and
nothing else, so a rank cannot reach another tenant's pods, the API server or the cloud's metadata service
(169.254.169.254, fd00:ec2::254: :mod:`.egress`). Replies to the scrapers' connections are not new connections
and pass.

A dataset's fetch Job gets a policy of its own (:func:`fetch_network_policy`): nothing may connect to it, and it
reaches DNS and the blocks the admin lists (``MLBENCH_FETCH_EGRESS_CIDRS``: the mirror, the object store, a proxy),
unset every address, never the metadata blocks; so a tenant's dataset URL cannot fetch the node's credentials, and
with the setting it cannot probe the cluster's inside either.

Enforcement is the CNI's or a policy agent's (Calico, Cilium, kube-router, ...): on a cluster without
one the object is inert, which is why it is safe to always create it. The test cluster enforces it
with kube-router on every real node (tests/cluster/README.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlbench_api import contract
from mlbench_operator import egress, fetchjob, runcontext
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
        "spec": {
            "podSelector": {"matchLabels": own},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": [{"to": [{"podSelector": {"matchLabels": own}}]}, dns_rule()],
        },
    }


#: What every pod of the operator's may always reach: DNS, on its standard port, wherever the cluster runs it.
DNS_PORTS: tuple[dict[str, Any], ...] = ({"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53})


def dns_rule() -> dict[str, Any]:
    """Port 53 anywhere (a rule with ports and no peers): the cluster's DNS wherever it runs."""
    return {"ports": list(DNS_PORTS)}


def fetch_network_policy(job_name: str, namespace: str, dataset: str, blocks: Sequence[str] | None) -> dict[str, Any]:
    """The policy of the fetch Job ``job_name`` (named like it, selecting its pods by the Job controller's label).

    No ingress at all; egress to DNS and to ``blocks`` (None: every address), the metadata blocks excepted. Created
    before the Job so that its first pod already runs under it; like the dataset volume it outlives the Job (the
    next fetch of the same data has the same name) and goes with the namespace.
    """
    to = [egress.ip_block(cidr) for cidr in (egress.ANYWHERE if blocks is None else blocks)]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": job_name, "namespace": namespace, "labels": fetchjob.dataset_labels(dataset)},
        "spec": {
            "podSelector": {"matchLabels": {n.LABEL_JOB_NAME: job_name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [{"to": to}, dns_rule()],
        },
    }
