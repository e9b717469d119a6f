"""Pure builders of a namespace's dataset volume (PVC) and the Job that fetches a run's dataset into it."""

from __future__ import annotations

from mlbench_api import contract
from mlbench_api.datasets import PERMANENT_EXITS
from mlbench_api.dataspec import DatasetSource, DatasetSpec
from mlbench_operator import naming as n
from mlbench_operator.podscheduling import pod_scheduling
from mlbench_operator.runcontext import Obj, RunContext
from mlbench_operator.runpods import container_security, image_pull_secrets, pod_security
from mlbench_operator.settings import DatasetSettings


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


def fetch_job_name(dataset: DatasetSpec) -> str:
    """Deterministic per (namespace, what the fetch produces): concurrent runs share one Job."""
    source, path = sourced(dataset)
    key = n.dataset_key(source.sha256, path, source.unpack, source.strip_components)
    return n.dataset_job_name(dataset.name, key)


def fetch_command(dataset: DatasetSpec, volume: str) -> list[str]:
    """``mlbench-runner fetch-dataset`` for this dataset; the path is the same inside the Job and the workers."""
    source, path = sourced(dataset)
    cmd = ["mlbench-runner", "fetch-dataset", "--url", source.url, "--sha256", source.sha256, "--dest", path]
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
    source, path = sourced(dataset)
    labels = dataset_labels(dataset.name)
    container: Obj = {
        "name": n.FETCH_CONTAINER,
        "image": ctx.image,
        "command": fetch_command(dataset, settings.volume_name),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": contract.DATA_DIR}],
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(ctx),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": fetch_job_name(dataset),
            "namespace": ctx.namespace,
            "labels": labels,
            "annotations": {n.ANNOTATION_DATASET_SHA256: source.sha256, n.ANNOTATION_DATASET_PATH: path},
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
                    "securityContext": pod_security(ctx),
                    **image_pull_secrets(ctx),  # it pulls the run's image
                    **pod_scheduling(ctx),
                    "containers": [container],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": settings.volume_name}}],
                },
            },
        },
    }
