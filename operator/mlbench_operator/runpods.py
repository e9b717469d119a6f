"""Pure builders of a run's pods: the workers (sshd for mpirun, the ranks, the netem init container) and the
launcher (mpirun over the hostfile), with the pod contract's environment, volumes and security.
"""

from __future__ import annotations

import math
from datetime import datetime

from mlbench_api import contract
from mlbench_api.common import MAX_INT32
from mlbench_operator import datastore
from mlbench_operator import naming as n
from mlbench_operator import podgroup as pg
from mlbench_operator.podscheduling import gang, gang_scheduler, pod_scheduling, worker_pod_settings
from mlbench_operator.runcontext import Obj, RunContext, object_metadata


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
    pod = ctx.pod
    extended = pod.extended_resources if pod is not None else None
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
d={contract.SSH_SCRATCH_DIR}
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
    """The pod settings' env (the run's ``spec.pod`` over its task's, :attr:`RunContext.pod`; workers and launcher
    alike), and the list of its names for the launcher to forward to every rank (``mpirun -x``; the ranks start
    under sshd, whose sessions do not inherit the container's environment). Nothing without env."""
    pod = ctx.pod
    given = pod.env if pod is not None else None
    if not given:
        return []
    names = ",".join(var.name for var in given)
    return [
        *({"name": var.name, "value": var.value} for var in given),
        {"name": contract.ENV_FORWARD_ENV, "value": names},
    ]


#: The ssh key copies' memory-backed emptyDir: two keys and sshd's pid file need a few KiB.
SSH_SCRATCH_SIZE = "1Mi"


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
        {"name": "output", "emptyDir": {"sizeLimit": ctx.scratch.output}},
        # the private copies of the keys (WORKER_SCRIPT, launch.private_key) in memory, never on the node's disk
        {"name": "ssh-scratch", "emptyDir": {"medium": "Memory", "sizeLimit": SSH_SCRATCH_SIZE}},
    ]
    mounts: list[Obj] = [
        {"name": "config", "mountPath": contract.CONFIG_DIR, "readOnly": True},
        {"name": "ssh", "mountPath": contract.SSH_DIR, "readOnly": True},
        {"name": "output", "mountPath": contract.OUTPUT_DIR},
        {"name": "ssh-scratch", "mountPath": contract.SSH_SCRATCH_DIR},
    ]
    if with_data and ctx.spec.checkpoint is not None:  # the workers: rank 0 writes, every rank may read
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": ctx.spec.checkpoint.claim_name}})
        mounts.append({"name": "checkpoints", "mountPath": contract.CHECKPOINT_DIR})
    if with_data:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": ctx.scratch.shm}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
        dataset = ctx.task.dataset_spec  # None for a collectives task: no data volume
        if dataset is not None and dataset.source is not None:  # fetched into the namespace's dataset volume
            claim = {"claimName": ctx.dataset_claim, "readOnly": True}
            volumes.append({"name": datastore.VOLUME, "persistentVolumeClaim": claim})
            mounts += datastore.worker_mounts(*datastore.sourced(dataset))  # its store entry and marker only
        elif dataset is not None and dataset.volume:
            volumes.append({**dataset.volume, "name": datastore.VOLUME})  # the task model refuses a name of its own
            mounts.append({"name": datastore.VOLUME, "mountPath": contract.DATA_DIR, "readOnly": True})
    return volumes, mounts


def pod_security(ctx: RunContext) -> Obj:
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


def container_security(ctx: RunContext) -> Obj:
    if ctx.run_as_user is None:
        return {"allowPrivilegeEscalation": False}
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def worker_metadata(ctx: RunContext, rank: int, attempt: int) -> Obj:
    """The worker's metadata: ``spec.pod``'s labels and annotations under MLBench's own (which win; the API
    refuses keys under mlbench.io/)."""
    meta = object_metadata(ctx, n.worker_name(ctx.name, rank), role=n.ROLE_WORKER, rank=rank, attempt=attempt)
    pod = ctx.pod
    if pod is not None and pod.labels:
        meta["labels"] = {**pod.labels, **meta["labels"]}
    if pod is not None and pod.annotations:
        meta["annotations"] = dict(pod.annotations)
    if gang(ctx) is not None:
        meta["labels"][pg.POD_GROUP_LABEL] = ctx.name
    return meta


def image_pull_secrets(ctx: RunContext) -> Obj:
    """``spec.pod.imagePullSecrets`` as a pod spec's field, for every pod that pulls the run's image (none set:
    nothing, and the namespace's default service account's imagePullSecrets apply)."""
    pod = ctx.pod
    secrets = pod.image_pull_secrets if pod is not None else None
    return {"imagePullSecrets": [{"name": s.name} for s in secrets]} if secrets else {}


def _pod_spec_common(ctx: RunContext, deadline_seconds: int | None = None, launcher: bool = False) -> Obj:
    spec: Obj = {
        "restartPolicy": "Never",  # any failure restarts the whole gang, never a single rank
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pod_security(ctx),
        **image_pull_secrets(ctx),
        **pod_scheduling(ctx, launcher),
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
        "securityContext": container_security(ctx),
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
        "securityContext": container_security(ctx),
    }
    wait: Obj = {
        "name": "wait-for-workers",
        "image": ctx.image,
        "command": ["/bin/sh", "-c", WAIT_FOR_WORKERS_SCRIPT.format(timeout=DNS_WAIT_SECONDS)],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
        "volumeMounts": [m for m in mounts if m["name"] == "config"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(ctx),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": object_metadata(ctx, n.launcher_name(ctx.name), role=n.ROLE_LAUNCHER, attempt=attempt),
        "spec": {
            **_pod_spec_common(ctx, deadline_seconds, launcher=True),
            "initContainers": [wait],
            "containers": [container],
            "volumes": volumes,
        },
    }
