"""The names of the operator's objects and their labels.

The contract with the runner (environment, paths, ports, the SSH Secret's keys) is :mod:`mlbench_api.contract`,
which the runner image ships too.
"""

from __future__ import annotations

import hashlib
import re

from mlbench_api.common import GROUP

# Labels on every object the operator creates.
#: kopf's finalizer on runs and sweeps (handlers.configure: settings.persistence.finalizer).
FINALIZER = f"{GROUP}/operator"
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
#: Full sha256 of a fetch Job's source (an annotation: a label value holds only 63 characters).
ANNOTATION_DATASET_SHA256 = f"{GROUP}/dataset-sha256"
#: On dataset fetch Jobs: the store folder it fills (mlbench_api.datasets.store_name), and its key label.
ANNOTATION_DATASET_STORE = f"{GROUP}/dataset-store"
LABEL_DATASET_KEY = f"{GROUP}/dataset-key"
#: On a run's results ConfigMap: the bundle format (mlbench_api.bundle.SCHEMA).
ANNOTATION_RESULTS_SCHEMA = f"{GROUP}/results-schema"
#: Set by the Job controller on a Job's pods.
LABEL_JOB_NAME = "batch.kubernetes.io/job-name"

ROLE_WORKER = "worker"
ROLE_LAUNCHER = "launcher"


def metrics_port_name(rank: int) -> str:
    """The declared port of global rank ``rank`` (port names: at most 15 characters)."""
    return f"rank-{rank}"


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


def dataset_key(sha256: str, unpack: bool, strip_components: int, image: str) -> str:
    """What a fetch produces and who produces it: the bytes (sha256), how they are laid out, and the pinned
    fetch image (a new image is a new Job, never one an older operator made). Not the URL (a mirror with the
    same bytes is the same dataset) nor the task's path (the data is stored by checksum). 10 hex digits."""
    text = f"{sha256}\n{int(unpack)}\n{strip_components}\n{image}"
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def dataset_job_name(dataset: str, key: str) -> str:
    """``mlbench-dataset-<name>-<key>``: deterministic per (namespace, dataset), so concurrent runs share one."""
    room = _MAX_JOB_NAME - len(_JOB_PREFIX) - len(key) - 1
    return f"{_JOB_PREFIX}{dns_label(dataset, room)}-{key}"


def run_selector(run: str) -> str:
    """Label selector for every pod of a run."""
    return f"{LABEL_RUN}={run}"
