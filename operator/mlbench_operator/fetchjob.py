"""Pure builders of a namespace's dataset volume (PVC) and the Job that fetches a run's dataset into it."""

from __future__ import annotations

from mlbench_api import contract
from mlbench_api.datasets import PERMANENT_EXITS
from mlbench_api.dataspec import DatasetSpec
from mlbench_operator import datastore
from mlbench_operator import naming as n
from mlbench_operator.datastore import sourced
from mlbench_operator.podscheduling import pod_scheduling
from mlbench_operator.runcontext import Obj, RunContext
from mlbench_operator.runpods import container_security, image_pull_secrets, pod_security
from mlbench_operator.settings import DatasetSettings

# -- datasets ------------------------------------------------------------------------------------------------------
#: The namespace's dataset volume's labels (what ``make uninstall`` selects it by).
DATASET_PVC_LABELS = {n.LABEL_MANAGED_BY: n.MANAGER, "app.kubernetes.io/part-of": "mlbench"}


def dataset_labels(dataset: str) -> dict[str, str]:
    """The labels of a dataset's fetch Job and its NetworkPolicy (owned by no run: :data:`FETCH_SELECTOR`)."""
    return {n.LABEL_MANAGED_BY: n.MANAGER, n.LABEL_DATASET: n.dns_label(dataset, 63)}


#: Selects the fetch Jobs and their NetworkPolicies, of every dataset (what the operator's Job watch and
#: ``make uninstall`` select them by): the operator's, with a dataset label (:func:`dataset_labels`).
FETCH_SELECTOR = f"{n.LABEL_MANAGED_BY}={n.MANAGER},{n.LABEL_DATASET}"


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
            "labels": dict(DATASET_PVC_LABELS),
        },
        "spec": spec,
    }


def fetch_key(dataset: DatasetSpec, image: str) -> str:
    source, _ = sourced(dataset)
    return n.dataset_key(source.sha256, source.unpack, source.strip_components, image)


def fetch_job_name(dataset: DatasetSpec, image: str) -> str:
    """Deterministic per (namespace, what the fetch produces, the pinned image): concurrent runs share one Job."""
    return n.dataset_job_name(dataset.name, fetch_key(dataset, image))


#: The fetch command's source flag. The trust check leaves its value out: a mirror with the same bytes (the same
#: ``--sha256``, verified by the fetcher) is the same fetch, as the Job's name says (``naming.dataset_job_name``).
URL_FLAG = "--url"


def fetch_command(dataset: DatasetSpec, volume: str) -> list[str]:
    """``mlbench-runner fetch-dataset`` for this dataset, into its store entry (named by checksum)."""
    source, _ = sourced(dataset)
    dest = datastore.fetch_dest(source)
    cmd = ["mlbench-runner", "fetch-dataset", URL_FLAG, source.url, "--sha256", source.sha256, "--dest", dest]
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
        "volumeMounts": [{"name": datastore.VOLUME, "mountPath": contract.DATA_DIR}],
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(ctx),
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
                    "securityContext": pod_security(ctx),
                    **image_pull_secrets(ctx),  # the pinned fetch image is usually in the runs' registry
                    **pod_scheduling(ctx),
                    "containers": [container],
                    "volumes": [
                        {"name": datastore.VOLUME, "persistentVolumeClaim": {"claimName": settings.volume_name}}
                    ],
                },
            },
        },
    }
