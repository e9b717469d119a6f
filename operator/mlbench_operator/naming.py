"""Object names, labels, ports and paths: the contract between operator, runner and users.

Kept in one module so that the runner, the docs and the tests can import the same strings.
"""

from __future__ import annotations

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

ROLE_WORKER = "worker"
ROLE_LAUNCHER = "launcher"

# Ports.
SSH_PORT = 2222
METRICS_PORT = 9400

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

# Keys of the per-run SSH Secret.
SSH_PRIVATE_KEY = "id_ed25519"
SSH_PUBLIC_KEY = "id_ed25519.pub"
SSH_AUTHORIZED_KEYS = "authorized_keys"

#: The user the runner image runs as (non-root; sshd listens on an unprivileged port).
RUNNER_UID = 1000

WORKER_CONTAINER = "worker"
LAUNCHER_CONTAINER = "launcher"


def service_name(run: str) -> str:
    """The headless Service; also the pods' ``subdomain`` so every worker has a DNS name."""
    return run


def config_map_name(run: str) -> str:
    return f"{run}-config"


def ssh_secret_name(run: str) -> str:
    return f"{run}-ssh"


def worker_name(run: str, rank: int) -> str:
    return f"{run}-worker-{rank}"


def launcher_name(run: str) -> str:
    return f"{run}-launcher"


def worker_fqdn(run: str, namespace: str, rank: int) -> str:
    """The worker's stable DNS name through the headless Service (no cluster-domain suffix)."""
    return f"{worker_name(run, rank)}.{service_name(run)}.{namespace}.svc"


def run_selector(run: str) -> str:
    """Label selector for every pod of a run."""
    return f"{LABEL_RUN}={run}"
