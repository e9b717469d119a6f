"""Pure builders: a run's context in, Kubernetes objects (plain dicts) out.

No API calls and no clock here, so every object the operator creates can be checked in a unit
test: names, owner references, labels, resources, the exact hostfile.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mlbench_api import bundle, contract
from mlbench_api.common import API_VERSION, MAX_INT32
from mlbench_api.config import RunConfig
from mlbench_api.datasets import PERMANENT_EXITS
from mlbench_api.run import BenchmarkRunSpec, Gang, Placement
from mlbench_api.task import BenchmarkTaskSpec, DatasetSource, DatasetSpec
from mlbench_operator import datastore
from mlbench_operator import naming as n
from mlbench_operator import podgroup as pg
from mlbench_operator.settings import GANG_SCHEDULER_NAME, NODE_LOSS_SECONDS, DatasetSettings
from mlbench_operator.sshkeys import RunKeys

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

    @property
    def task(self) -> BenchmarkTaskSpec:
        """The task as this run sees it: the snapshot with the run's overrides applied."""
        return self.config.task

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


def _metadata(ctx: RunContext, name: str, **label_args: Any) -> Obj:
    return {
        "name": name,
        "namespace": ctx.namespace,
        "labels": labels(ctx, **label_args),
        "ownerReferences": [owner_reference(ctx)],
    }


def hostfile(ctx: RunContext) -> str:
    """The OpenMPI hostfile: one line per worker, by stable DNS name, in rank order."""
    slots = ctx.spec.slots_per_worker
    return "".join(f"{n.worker_fqdn(ctx.name, ctx.namespace, i)} slots={slots}\n" for i in range(ctx.spec.workers))


def service(ctx: RunContext) -> Obj:
    """Headless Service that gives every worker a DNS name, also before it is Ready (sshd probes)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ctx, n.service_name(ctx.name)),
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
        "metadata": _metadata(ctx, n.config_map_name(ctx.name)),
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
        "metadata": _metadata(ctx, n.ssh_secret_name(ctx.name)),
        "stringData": {
            contract.SSH_PRIVATE_KEY: keys.client_private,
            contract.SSH_AUTHORIZED_KEYS: authorized_keys(keys),
            contract.SSH_HOST_KEY: keys.host_private,
            contract.SSH_KNOWN_HOSTS: known_hosts(ctx, keys),
        },
    }


def worker_resources(ctx: RunContext) -> Obj:
    """requests == limits (guaranteed QoS when cpu and memory are both given)."""
    res = ctx.spec.resources
    quantities: dict[str, str] = {}
    if res is not None:
        if res.cpu is not None:
            quantities["cpu"] = str(res.cpu)
        if res.memory is not None:
            quantities["memory"] = str(res.memory)
        if res.gpu:
            quantities["nvidia.com/gpu"] = str(res.gpu)
    extended = ctx.spec.pod.extended_resources if ctx.spec.pod is not None else None
    quantities.update({name: str(count) for name, count in sorted((extended or {}).items())})
    return {"requests": dict(quantities), "limits": dict(quantities)} if quantities else {}


#: sshd's timeouts on workers: an unauthenticated connection is dropped after LOGIN_GRACE; a session
#: whose client (the launcher) stops answering after CLIENT_ALIVE_INTERVAL * CLIENT_ALIVE_COUNT_MAX.
SSHD_LOGIN_GRACE_SECONDS = 30
SSHD_CLIENT_ALIVE_INTERVAL = 15
SSHD_CLIENT_ALIVE_COUNT_MAX = 4

#: The worker's entrypoint: a non-root sshd on :2222 that presents the run's host key (from the
#: Secret) and accepts exactly the run's client key (``restrict``-ed in authorized_keys). The runner
#: image provides /usr/sbin/sshd; ``mpirun`` (launcher) starts the ranks through it. sshd refuses a
#: host key that others may read when it owns the file, and the Secret's files are root's (0440 +
#: fsGroup for the operator's UID, 0444 under the image's own user, see _volumes): it gets a private
#: copy (0600, its user's) whoever that user is, root included; so does ssh of the client key, which
#: mpirun's tree spawn uses on the workers at the path the launcher uses (``mlbench_runner.pod.launch.
#: PRIVATE_SSH_DIR``, the same directory). ``mlbench-runner worker`` supervises
#: sshd so that a rank OOM-killed inside the container fails the pod as OOMKilled with the limit named
#: (see mlbench_runner.pod.worker). The ranks' sessions get the pod's node name (``SetEnv``: an ssh session starts with
#: sshd's environment, not the container's), so that each rank's result names its node.
WORKER_SCRIPT = f"""set -eu
d=/tmp/mlbench-sshd
mkdir -p "$d"
(umask 077 && cat {contract.SSH_DIR}/{contract.SSH_HOST_KEY} > "$d/host_key" \\
  && cat {contract.SSH_DIR}/{contract.SSH_PRIVATE_KEY} > "$d/{contract.SSH_PRIVATE_KEY}")
exec mlbench-runner worker -- /usr/sbin/sshd -D -e -f /dev/null -p {contract.SSH_PORT} -h "$d/host_key" \\
  -o PidFile="$d/sshd.pid" -o AuthorizedKeysFile={contract.SSH_DIR}/{contract.SSH_AUTHORIZED_KEYS} -o StrictModes=no \\
  -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o UsePAM=no -o PermitUserEnvironment=no \\
  -o LoginGraceTime={SSHD_LOGIN_GRACE_SECONDS} -o ClientAliveInterval={SSHD_CLIENT_ALIVE_INTERVAL} \\
  -o ClientAliveCountMax={SSHD_CLIENT_ALIVE_COUNT_MAX} \\
  -o "SetEnv={contract.ENV_NODE_NAME}=${{{contract.ENV_NODE_NAME}:-}}"
"""


def worker_script(ctx: RunContext) -> str:
    """:data:`WORKER_SCRIPT`, with sshd's LoginGraceTime grown by what ``spec.network`` adds to a handshake."""
    network = ctx.spec.network
    extra = network.ssh_handshake_delay() if network is not None else 0
    grace = f"LoginGraceTime={SSHD_LOGIN_GRACE_SECONDS}"
    return (
        WORKER_SCRIPT.replace(grace, f"LoginGraceTime={SSHD_LOGIN_GRACE_SECONDS + extra}") if extra else WORKER_SCRIPT
    )


#: The launcher's init container: mpirun starts only once every worker's DNS name resolves (Ready
#: pods can precede their DNS records; mpi-operator's launcher famously raced them).
WAIT_FOR_WORKERS_SCRIPT = f"""set -eu
deadline=$(( $(date +%s) + {{timeout}} ))
for host in $(cut -d' ' -f1 {contract.CONFIG_DIR}/{contract.HOSTFILE}); do
  until getent hosts "$host" >/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "worker $host does not resolve after {{timeout}}s" | tee {contract.TERMINATION_LOG} >&2
      exit 1
    fi
    sleep 1
  done
done
"""
DNS_WAIT_SECONDS = 300


def _env(ctx: RunContext, role: str) -> list[Obj]:
    return [
        {"name": contract.ENV_CONFIG, "value": f"{contract.CONFIG_DIR}/{contract.CONFIG_FILE}"},
        {"name": contract.ENV_HOSTFILE, "value": f"{contract.CONFIG_DIR}/{contract.HOSTFILE}"},
        {"name": contract.ENV_SSH_DIR, "value": contract.SSH_DIR},
        {"name": contract.ENV_SSH_PORT, "value": str(contract.SSH_PORT)},
        {"name": contract.ENV_SSH_KEY, "value": f"{contract.SSH_DIR}/{contract.SSH_PRIVATE_KEY}"},
        # strict host key checking: the run's host key, whatever name or address reaches a worker
        {"name": contract.ENV_SSH_KNOWN_HOSTS, "value": f"{contract.SSH_DIR}/{contract.SSH_KNOWN_HOSTS}"},
        {"name": contract.ENV_SSH_HOST_KEY_ALIAS, "value": n.ssh_host_key_alias(ctx.name, ctx.namespace)},
        {"name": contract.ENV_RUN, "value": ctx.name},
        {"name": contract.ENV_METRICS_LINGER_SECONDS, "value": str(ctx.metrics_linger_seconds)},
        {"name": contract.ENV_ROLE, "value": role},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": contract.ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        *pod_env(ctx),
    ]


def pod_env(ctx: RunContext) -> list[Obj]:
    """``spec.pod.env`` (workers and launcher alike), and the list of its names for the launcher to forward to
    every rank (``mpirun -x``; the ranks start under sshd, whose sessions do not inherit the container's
    environment). Nothing without ``spec.pod.env``."""
    given = ctx.spec.pod.env if ctx.spec.pod is not None else None
    if not given:
        return []
    names = ",".join(var.name for var in given)
    return [
        *({"name": var.name, "value": var.value} for var in given),
        {"name": contract.ENV_FORWARD_ENV, "value": names},
    ]


def _volumes(ctx: RunContext, with_data: bool) -> tuple[list[Obj], list[Obj]]:
    volumes: list[Obj] = [
        {"name": "config", "configMap": {"name": n.config_map_name(ctx.name)}},
        # root's files: readable by the operator's UID through fsGroup (0440), by whatever user the image
        # runs as otherwise (0444: the Secret is the run's own, and the pod has no other user). sshd and
        # the launcher's ssh use private copies of the two private keys (WORKER_SCRIPT, launch.private_key).
        {
            "name": "ssh",
            "secret": {
                "secretName": n.ssh_secret_name(ctx.name),
                "defaultMode": 0o444 if ctx.run_as_user is None else 0o440,
            },
        },
        {"name": "output", "emptyDir": {}},
    ]
    mounts: list[Obj] = [
        {"name": "config", "mountPath": contract.CONFIG_DIR, "readOnly": True},
        {"name": "ssh", "mountPath": contract.SSH_DIR, "readOnly": True},
        {"name": "output", "mountPath": contract.OUTPUT_DIR},
    ]
    if with_data and ctx.spec.checkpoint is not None:  # the workers: rank 0 writes, every rank may read
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": ctx.spec.checkpoint.claim_name}})
        mounts.append({"name": "checkpoints", "mountPath": contract.CHECKPOINT_DIR})
    if with_data:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
        dataset = ctx.task.dataset_spec  # None for a collectives task: no data volume
        if dataset is not None and dataset.source is not None:  # fetched into the namespace's dataset volume
            claim = {"claimName": ctx.dataset_claim, "readOnly": True}
            volumes.append({"name": "data", "persistentVolumeClaim": claim})
            mounts += datastore.worker_mounts(*sourced(dataset))  # its store entry and marker, at dataset.path
        elif dataset is not None and dataset.volume:
            volumes.append({**dataset.volume, "name": "data"})  # the task model refuses a name of its own
            mounts.append({"name": "data", "mountPath": contract.DATA_DIR, "readOnly": True})
    return volumes, mounts


def _pod_security(ctx: RunContext) -> Obj:
    if ctx.run_as_user is None:  # the image's own user (e.g. root sshd with privilege separation)
        return {"seccompProfile": {"type": "RuntimeDefault"}}
    uid = ctx.run_as_user
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security(ctx: RunContext) -> Obj:
    if ctx.run_as_user is None:
        return {"allowPrivilegeEscalation": False}
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


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


def _scheduling(ctx: RunContext) -> Obj:
    sched = ctx.spec.scheduling
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
    pod = ctx.spec.pod
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


def pod_group(ctx: RunContext) -> Obj | None:
    """The run's PodGroup (:mod:`.podgroup`), named and owned like the run; None without ``gang``."""
    g = gang(ctx)
    if g is None:
        return None
    requests = worker_resources(ctx).get("requests", {})
    return pg.pod_group(ctx.name, _metadata(ctx, ctx.name), g, ctx.spec.workers, requests)


def worker_metadata(ctx: RunContext, rank: int, attempt: int) -> Obj:
    """The worker's metadata: ``spec.pod``'s labels and annotations under MLBench's own (which win; the API
    refuses keys under mlbench.io/)."""
    meta = _metadata(ctx, n.worker_name(ctx.name, rank), role=n.ROLE_WORKER, rank=rank, attempt=attempt)
    pod = ctx.spec.pod
    if pod is not None and pod.labels:
        meta["labels"] = {**pod.labels, **meta["labels"]}
    if pod is not None and pod.annotations:
        meta["annotations"] = dict(pod.annotations)
    if gang(ctx) is not None:
        meta["labels"][pg.POD_GROUP_LABEL] = ctx.name
    return meta


def _pod_spec_common(ctx: RunContext, deadline_seconds: int | None = None) -> Obj:
    spec: Obj = {
        "restartPolicy": "Never",  # any failure restarts the whole gang, never a single rank
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(ctx),
        **_scheduling(ctx),
    }
    if deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = deadline_seconds
    return spec


def pod_deadline(start: datetime | None, active_deadline_seconds: int | None, now: datetime) -> int | None:
    """``activeDeadlineSeconds`` for a pod created ``now``: what is left of the run's deadline.

    The operator fails the run itself when ``runPolicy.activeDeadlineSeconds`` passes; the same bound
    on every pod makes the kubelet enforce it while the operator is down (no GPU held past the
    deadline). A pod's deadline counts from its own start, slightly after ``now``, so the operator's
    verdict (DeadlineExceeded on the run) normally comes first. At least 1 s (the API's minimum).
    """
    if start is None or active_deadline_seconds is None:
        return None
    left = active_deadline_seconds - (now - start).total_seconds()
    return max(1, min(math.ceil(left), MAX_INT32))


def metrics_ports(ctx: RunContext, worker: int) -> list[Obj]:
    """One declared port per rank on worker ``worker``, named for its global rank (``rank-5``).

    Each rank serves on ``9400 + local rank``; mpirun's ``--map-by slot`` fills worker 0's slots
    first, so worker ``i`` holds ranks ``i * slots ..``. Declared ports are what a PodMonitor (and
    Prometheus' pod discovery) can scrape; the name gives every series its ``rank`` label. None for a
    task's own program (``runner.serves_metrics``): a port nobody serves would fire the rank alerts.
    """
    if not ctx.task.runner.serves_metrics:
        return []
    slots = ctx.spec.slots_per_worker
    first = worker * slots
    ranks = range(first, min(first + slots, ctx.config.world_size))
    return [
        {"name": n.metrics_port_name(r), "containerPort": contract.METRICS_PORT + r - first, "protocol": "TCP"}
        for r in ranks
    ]


def gang_scheduler(ctx: RunContext) -> Obj:
    """A gang-scheduled worker's ``schedulerName`` (the run's, else the operator's); nothing without ``gang``."""
    g = gang(ctx)
    return {} if g is None else {"schedulerName": pg.scheduler_name(g, ctx.gang_scheduler_name)}


def worker_pod(ctx: RunContext, rank: int, attempt: int, deadline_seconds: int | None = None) -> Obj:
    """Worker ``rank``: sshd on 2222 for mpirun, the runner's ranks live here; metrics from 9400
    (``deadline_seconds``: :func:`pod_deadline`)."""
    volumes, mounts = _volumes(ctx, with_data=True)
    container: Obj = {
        "name": n.WORKER_CONTAINER,
        "image": ctx.image,
        "command": ["/bin/sh", "-c", worker_script(ctx)],
        "env": [*_env(ctx, n.ROLE_WORKER), {"name": contract.ENV_WORKER_INDEX, "value": str(rank)}],
        "ports": [{"name": "ssh", "containerPort": contract.SSH_PORT, "protocol": "TCP"}, *metrics_ports(ctx, rank)],
        "readinessProbe": {
            "tcpSocket": {"port": "ssh"},
            "initialDelaySeconds": 1,
            "periodSeconds": 2,
            "failureThreshold": 3,
            **probe_timeout(ctx),
        },
        "resources": worker_resources(ctx),
        "volumeMounts": mounts,
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _container_security(ctx),
    }
    netem = netem_init_container(ctx)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": worker_metadata(ctx, rank, attempt),
        "spec": {
            **_pod_spec_common(ctx, deadline_seconds),
            **worker_pod_settings(ctx, attempt),
            **gang_scheduler(ctx),
            "hostname": n.worker_name(ctx.name, rank),
            "subdomain": n.service_name(ctx.name),
            **({"initContainers": [netem]} if netem is not None else {}),
            "containers": [container],
            "volumes": volumes,
        },
    }


def probe_timeout(ctx: RunContext) -> Obj:
    """``timeoutSeconds`` of the worker's readiness probe when ``spec.network`` delays the worker's answer
    (its SYN-ACK leaves through netem): the delay plus a second, instead of the default 1 s."""
    network = ctx.spec.network
    if network is None or not network.latency_ms:
        return {}
    return {"timeoutSeconds": math.ceil((network.latency_ms + (network.jitter_ms or 0.0)) / 1000.0 + 1.0)}


#: The worker's init container that applies ``spec.network``, and the pod interface it shapes.
NETEM_CONTAINER = "network-emulation"
NETEM_INTERFACE = "eth0"


def netem_init_container(ctx: RunContext) -> Obj | None:
    """``mlbench-runner netem``: tc on the pod's eth0 (egress), from the run's config (htb for the bandwidth,
    netem for delay, jitter and loss); None without ``spec.network``.

    The qdiscs belong to the pod's network namespace, so they outlive the init container and shape
    everything the worker sends: rank-to-rank traffic (each direction by its sender), ssh, metrics
    replies. tc needs CAP_NET_ADMIN in that namespace: a non-root user gets no added capability
    (Kubernetes sets no ambient capabilities), so the container runs as root with only NET_ADMIN and no
    privilege escalation. That leaves the restricted (and baseline) Pod Security profile: the admission
    policy refuses ``spec.network`` unless MLBENCH_ALLOW_NETWORK_EMULATION is true. Its cpu and memory
    are the worker's (init containers count towards the pod's QoS class; GPUs it does not need).
    """
    if ctx.spec.network is None:
        return None
    resources = {
        kind: {k: v for k, v in quantities.items() if k in ("cpu", "memory")}
        for kind, quantities in worker_resources(ctx).items()
    }
    return {
        "name": NETEM_CONTAINER,
        "image": ctx.image,
        "command": [
            "mlbench-runner",
            "netem",
            "--interface",
            NETEM_INTERFACE,
            "--config",
            f"{contract.CONFIG_DIR}/{contract.CONFIG_FILE}",
        ],
        "resources": {kind: q for kind, q in resources.items() if q},
        "volumeMounts": [{"name": "config", "mountPath": contract.CONFIG_DIR, "readOnly": True}],
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
        },
    }


def launcher_pod(ctx: RunContext, attempt: int, deadline_seconds: int | None = None) -> Obj:
    """The launcher runs ``mpirun`` over the hostfile; its termination message is the run's result
    (``deadline_seconds``: :func:`pod_deadline`)."""
    volumes, mounts = _volumes(ctx, with_data=False)
    container: Obj = {
        "name": n.LAUNCHER_CONTAINER,
        "image": ctx.image,
        "command": ["mlbench-runner", "launch"],
        "env": _env(ctx, n.ROLE_LAUNCHER),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "volumeMounts": mounts,
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _container_security(ctx),
    }
    wait: Obj = {
        "name": "wait-for-workers",
        "image": ctx.image,
        "command": ["/bin/sh", "-c", WAIT_FOR_WORKERS_SCRIPT.format(timeout=DNS_WAIT_SECONDS)],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        "volumeMounts": [m for m in mounts if m["name"] == "config"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _container_security(ctx),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(ctx, n.launcher_name(ctx.name), role=n.ROLE_LAUNCHER, attempt=attempt),
        "spec": {
            **_pod_spec_common(ctx, deadline_seconds),
            "initContainers": [wait],
            "containers": [container],
            "volumes": volumes,
        },
    }


# -- datasets ------------------------------------------------------------------------------------------------------
def dataset_labels(dataset: str) -> dict[str, str]:
    return {n.LABEL_MANAGED_BY: n.MANAGER, n.LABEL_DATASET: n.dns_label(dataset, 63)}


def dataset_pvc(namespace: str, settings: DatasetSettings) -> Obj:
    """The namespace's dataset volume: a shared cache, owned by no run (deleting runs must not delete data)."""
    spec: Obj = {
        "accessModes": [settings.access_mode],
        "resources": {"requests": {"storage": settings.size}},
    }
    if settings.storage_class:  # absent = the cluster's default StorageClass
        spec["storageClassName"] = settings.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": settings.volume_name,
            "namespace": namespace,
            "labels": {n.LABEL_MANAGED_BY: n.MANAGER, "app.kubernetes.io/part-of": "mlbench"},
        },
        "spec": spec,
    }


def sourced(dataset: DatasetSpec) -> tuple[DatasetSource, str]:
    """The source and path of a dataset the operator fetches (the API guarantees a path with a source)."""
    if dataset.source is None or dataset.path is None:
        raise ValueError(f"dataset {dataset.name!r} has no source to fetch")
    return dataset.source, dataset.path


def fetch_key(dataset: DatasetSpec, image: str) -> str:
    source, _ = sourced(dataset)
    return n.dataset_key(source.sha256, source.unpack, source.strip_components, image)


def fetch_job_name(dataset: DatasetSpec, image: str) -> str:
    """Deterministic per (namespace, what the fetch produces, the pinned image): concurrent runs share one Job."""
    return n.dataset_job_name(dataset.name, fetch_key(dataset, image))


def fetch_command(dataset: DatasetSpec, volume: str) -> list[str]:
    """``mlbench-runner fetch-dataset`` for this dataset, into its store entry (named by checksum)."""
    source, _ = sourced(dataset)
    dest = datastore.fetch_dest(source)
    cmd = ["mlbench-runner", "fetch-dataset", "--url", source.url, "--sha256", source.sha256, "--dest", dest]
    if source.unpack:
        cmd += ["--unpack", "--strip-components", str(source.strip_components)]
    return [*cmd, "--volume", volume]


def fetch_job(ctx: RunContext, settings: DatasetSettings) -> Obj:
    """The Job that downloads the run's dataset into the dataset volume (mounted read-write at /data).

    Not owned by the run: runs sharing the dataset share the Job, and ttlSecondsAfterFinished removes
    it. podFailurePolicy fails it at once on a permanent failure (checksum mismatch, full volume);
    an unreachable source is retried ``backoffLimit`` times.
    """
    dataset = ctx.task.dataset
    source, _ = sourced(dataset)
    labels = {**dataset_labels(dataset.name), n.LABEL_DATASET_KEY: fetch_key(dataset, settings.fetch_image)}
    container: Obj = {
        "name": n.FETCH_CONTAINER,
        "image": settings.fetch_image,  # pinned by the operator: never a run's own image
        "command": fetch_command(dataset, settings.volume_name),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": contract.DATA_DIR}],
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _container_security(ctx),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": fetch_job_name(dataset, settings.fetch_image),
            "namespace": ctx.namespace,
            "labels": labels,
            "annotations": {
                n.ANNOTATION_DATASET_SHA256: source.sha256,
                n.ANNOTATION_DATASET_STORE: datastore.store_entry(source),
            },
        },
        "spec": {
            "backoffLimit": settings.backoff_limit,
            "activeDeadlineSeconds": settings.fetch_deadline_seconds,
            "ttlSecondsAfterFinished": settings.job_ttl_seconds,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": n.FETCH_CONTAINER,
                            "operator": "In",
                            "values": [int(code) for code in PERMANENT_EXITS],
                        },
                    },
                    # a preempted or evicted pod is not the fetch's fault: do not count it
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",  # required by podFailurePolicy; the Job retries with new pods
                    "enableServiceLinks": False,
                    "automountServiceAccountToken": False,
                    "securityContext": _pod_security(ctx),
                    **_scheduling(ctx),
                    "containers": [container],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": settings.volume_name}}],
                },
            },
        },
    }
