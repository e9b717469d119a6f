"""Pure builders of a run's objects other than its pods: the headless Service, the ConfigMap with the hostfile
and the RunConfig, the ssh Secret, the kept results' ConfigMap and the gang's PodGroup.
"""

from __future__ import annotations

import base64

from mlbench_api import bundle, contract
from mlbench_operator import naming as n
from mlbench_operator import podgroup as pg
from mlbench_operator.podscheduling import gang
from mlbench_operator.runcontext import Obj, RunContext, object_metadata, run_owner_reference
from mlbench_operator.runpods import worker_resources
from mlbench_operator.sshkeys import RunKeys


def hostfile(ctx: RunContext) -> str:
    """The OpenMPI hostfile: one line per worker, by stable DNS name, in rank order."""
    slots = ctx.spec.slots_per_worker
    return "".join(f"{n.worker_fqdn(ctx.name, ctx.namespace, i)} slots={slots}\n" for i in range(ctx.spec.workers))


def service(ctx: RunContext) -> Obj:
    """Headless Service that gives every worker a DNS name, also before it is Ready (sshd probes)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(ctx, n.service_name(ctx.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {n.LABEL_RUN: ctx.name, n.LABEL_ROLE: n.ROLE_WORKER},
            "ports": [{"name": "ssh", "port": contract.SSH_PORT, "targetPort": "ssh", "protocol": "TCP"}],
        },
    }


def config_map(ctx: RunContext) -> Obj:
    """The hostfile and the effective RunConfig every rank reads; immutable: a run's world never changes."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_metadata(ctx, n.config_map_name(ctx.name)),
        "immutable": True,
        "data": {contract.HOSTFILE: hostfile(ctx), contract.CONFIG_FILE: ctx.config.dump()},
    }


def results_config_map(run: str, namespace: str, uid: str, task: str, results: bundle.Bundle) -> Obj:
    """The run's kept results: gzip files in ``binaryData`` (1 MiB at most: see mlbench_api.bundle).

    Built from the run's identity alone (not a :class:`RunContext`): results are collected after the
    run finished, also when its configuration can no longer be rebuilt. Created once, never updated:
    immutable.
    """
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "immutable": True,
        "metadata": {
            "name": n.results_config_map_name(run),
            "namespace": namespace,
            "labels": {n.LABEL_RUN: run, n.LABEL_TASK: task, n.LABEL_MANAGED_BY: n.MANAGER},
            "annotations": {n.ANNOTATION_RESULTS_SCHEMA: bundle.SCHEMA},
            "ownerReferences": [run_owner_reference(run, uid)],
        },
        "binaryData": {k: base64.b64encode(v).decode() for k, v in sorted(results.compressed().items())},
    }


def authorized_keys(keys: RunKeys) -> str:
    """The run's client key, ``restrict``-ed: a shell command only (no forwarding, no pty, no ~/.ssh/rc)."""
    return f"restrict {keys.client_public.strip()}\n"


def known_hosts(ctx: RunContext, keys: RunKeys) -> str:
    """The run's host key under its alias (plain name: with HostKeyAlias ssh does not add ``:2222``)."""
    return f"{n.ssh_host_key_alias(ctx.name, ctx.namespace)} {keys.host_public.strip()}\n"


def ssh_secret(ctx: RunContext, keys: RunKeys) -> Obj:
    """The run's own keys: workers authorise exactly its client key and present its host key; the
    client accepts exactly that host key. Immutable (kubelet stops watching it; nobody swaps a key)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/ssh-auth",
        "immutable": True,
        "metadata": object_metadata(ctx, n.ssh_secret_name(ctx.name)),
        "stringData": {
            contract.SSH_PRIVATE_KEY: keys.client_private,
            contract.SSH_AUTHORIZED_KEYS: authorized_keys(keys),
            contract.SSH_HOST_KEY: keys.host_private,
            contract.SSH_KNOWN_HOSTS: known_hosts(ctx, keys),
        },
    }


def pod_group(ctx: RunContext) -> Obj | None:
    """The run's PodGroup (:mod:`.podgroup`), named and owned like the run; None without ``gang``."""
    g = gang(ctx)
    if g is None:
        return None
    requests = worker_resources(ctx).get("requests", {})
    return pg.pod_group(ctx.name, object_metadata(ctx, ctx.name), g, ctx.spec.workers, requests)
