"""Object names, labels, ports and paths: the contract between operator, runner and users.

Kept in one module so that the runner, the docs and the tests can import the same strings.
"""

from __future__ import annotations

import hashlib
import re

from mlbench_api.common import GROUP

# Labels on every object the operator creates.
LABEL_RUN = f"{GROUP}/run"
LABEL_TASK = f"{GROUP}/task"
LABEL_ROLE = f"{GROUP}/role"
LABEL_RANK = f"{GROUP}/rank"
#: Which gang (world) a pod belongs to; equals ``status.restarts`` when the world was created.
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "mlbench-operator"
#: On dataset fetch Jobs and their pods: the dataset's (sanitised) name.
LABEL_DATASET = f"{GROUP}/dataset"
#: Full sha256 and destination of a fetch Job (annotations: a label value holds only 63 characters).
ANNOTATION_DATASET_SHA256 = f"{GROUP}/dataset-sha256"
ANNOTATION_DATASET_PATH = f"{GROUP}/dataset-path"
#: On a run's results ConfigMap: the bundle format (mlbench_api.bundle.SCHEMA).
ANNOTATION_RESULTS_SCHEMA = f"{GROUP}/results-schema"
#: Set by the Job controller on a Job's pods.
LABEL_JOB_NAME = "batch.kubernetes.io/job-name"

ROLE_WORKER = "worker"
ROLE_LAUNCHER = "launcher"

# Ports.
SSH_PORT = 2222
METRICS_PORT = 9400
#: Default of MLBENCH_METRICS_LINGER_SECONDS: three scrapes at the PodMonitor's 15 s, one at a 30 s default.
METRICS_LINGER_SECONDS = 45


def metrics_port_name(rank: int) -> str:
    """The declared port of global rank ``rank`` (port names: at most 15 characters)."""
    return f"rank-{rank}"


# In-container paths and environment.
CONFIG_DIR = "/etc/mlbench"
CONFIG_FILE = "config.json"
HOSTFILE = "hostfile"
SSH_DIR = "/etc/mlbench-ssh"
OUTPUT_DIR = "/tmp/mlbench"
DATA_DIR = "/data"
ENV_CONFIG = "MLBENCH_RUN_CONFIG"
ENV_HOSTFILE = "MLBENCH_HOSTFILE"
ENV_SSH_DIR = "MLBENCH_SSH_DIR"
ENV_SSH_PORT = "MLBENCH_SSH_PORT"
ENV_SSH_KEY = "MLBENCH_SSH_KEY"
ENV_SSH_KNOWN_HOSTS = "MLBENCH_SSH_KNOWN_HOSTS"
ENV_SSH_HOST_KEY_ALIAS = "MLBENCH_SSH_HOST_KEY_ALIAS"

# Keys of the per-run SSH Secret (type kubernetes.io/ssh-auth, which requires ``ssh-privatekey``).
#: The client's private key (launcher; workers too, for mpirun's tree spawn).
SSH_PRIVATE_KEY = "ssh-privatekey"
#: ``restrict <client public key>``: the only key every worker's sshd lets in.
SSH_AUTHORIZED_KEYS = "authorized_keys"
#: The run's host key: every worker's sshd presents it (``-h``).
SSH_HOST_KEY = "ssh_host_ed25519_key"
#: ``<host key alias> <host public key>``: the only host key the client accepts.
SSH_KNOWN_HOSTS = "known_hosts"

#: The user the runner image runs as (non-root; sshd listens on an unprivileged port).
RUNNER_UID = 1000

WORKER_CONTAINER = "worker"
LAUNCHER_CONTAINER = "launcher"
FETCH_CONTAINER = "fetch"

#: The namespace's dataset volume (PVC), shared by every run there; MLBENCH_DATASET_VOLUME renames it.
DATASET_VOLUME = "mlbench-datasets"
_JOB_PREFIX = "mlbench-dataset-"
#: Job names become pod label values (``batch.kubernetes.io/job-name``): at most 63 characters.
_MAX_JOB_NAME = 63


def service_name(run: str) -> str:
    """The headless Service; also the pods' ``subdomain`` so every worker has a DNS name."""
    return run


def config_map_name(run: str) -> str:
    return f"{run}-config"


def results_config_map_name(run: str) -> str:
    """The run's kept results (see mlbench_api.bundle); survives the pods, not the run."""
    return f"{run}-results"


def ssh_secret_name(run: str) -> str:
    return f"{run}-ssh"


def ssh_host_key_alias(run: str, namespace: str) -> str:
    """The name every worker's host key is checked under (ssh ``HostKeyAlias``; never resolved).

    All workers of a run present the run's one host key, so one known_hosts line covers them
    whatever name or address mpirun uses; with an alias ssh looks up the plain name, not
    ``[name]:2222``. Namespaces hold no dots, so the name is unambiguous.
    """
    return f"mlbench-workers.{run}.{namespace}"


def worker_name(run: str, rank: int) -> str:
    return f"{run}-worker-{rank}"


def launcher_name(run: str) -> str:
    return f"{run}-launcher"


def worker_fqdn(run: str, namespace: str, rank: int) -> str:
    """The worker's stable DNS name through the headless Service (no cluster-domain suffix)."""
    return f"{worker_name(run, rank)}.{service_name(run)}.{namespace}.svc"


def dns_label(text: str, limit: int) -> str:
    """``text`` as a DNS-1123 label fragment: lowercase, ``[a-z0-9-]``, no leading/trailing dash."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:limit].strip("-")
    return out or "data"


def dataset_key(sha256: str, path: str, unpack: bool, strip_components: int) -> str:
    """What a fetch produces: the bytes (sha256) and where/how they land. The URL is not part of it: a
    mirror with the same bytes is the same dataset. 10 hex digits of sha256 over the four."""
    text = f"{sha256}\n{path}\n{int(unpack)}\n{strip_components}"
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def dataset_job_name(dataset: str, key: str) -> str:
    """``mlbench-dataset-<name>-<key>``: deterministic per (namespace, dataset), so concurrent runs share one."""
    room = _MAX_JOB_NAME - len(_JOB_PREFIX) - len(key) - 1
    return f"{_JOB_PREFIX}{dns_label(dataset, room)}-{key}"


def run_selector(run: str) -> str:
    """Label selector for every pod of a run."""
    return f"{LABEL_RUN}={run}"
