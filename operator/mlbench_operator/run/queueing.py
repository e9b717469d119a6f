"""The Kueue objects a queued run reads and writes (blocking calls, run on the :class:`~.kube.Kube` pool);
what they hold and mean is :mod:`.kueue`'s."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from mlbench_operator.kube import ApiError, Kube
from mlbench_operator.run import kueue

RESOURCE = "workloads"


def get_workload(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """The Workload, or None when it does not exist."""
    path = kueue.WORKLOADS.format(namespace=namespace)
    try:
        found: dict[str, Any] = kube.request("GET", f"{path}/{quote(name)}", resource=RESOURCE)
        return found
    except ApiError as err:
        if err.status == 404:
            return None
        raise


def create_workload(kube: Kube, obj: dict[str, Any]) -> None:
    """Create the run's Workload (409: it exists already, which is as good)."""
    try:
        kube.request("POST", kueue.WORKLOADS.format(namespace=obj["metadata"]["namespace"]), obj, resource=RESOURCE)
    except ApiError as err:
        if err.status != 409:
            raise


def get_flavor(kube: Kube, name: str) -> dict[str, Any]:
    """A ResourceFlavor Kueue assigned (an empty one when it is gone: no labels to add)."""
    try:
        found: dict[str, Any] = kube.request("GET", kueue.FLAVOR.format(name=quote(name)), resource="resourceflavors")
        return found
    except ApiError as err:
        if err.status == 404:
            return {}
        raise


def apply_workload_status(kube: Kube, namespace: str, name: str, patch: dict[str, Any]) -> None:
    """Apply conditions of the Workload (``Finished``, ``PodsReady``: server-side apply, the operator's own
    field manager)."""
    path = kueue.WORKLOADS.format(namespace=namespace)
    try:
        kube.request(
            "PATCH",
            f"{path}/{quote(name)}/status",
            patch,
            query=[("fieldManager", kueue.FIELD_MANAGER), ("force", "true")],
            content_type="application/apply-patch+yaml",
            resource=f"{RESOURCE}/status",
        )
    except ApiError as err:
        if err.status != 404:
            raise


def release_workload(kube: Kube, namespace: str, name: str, patch: dict[str, Any]) -> None:
    """Give an evicted Workload's quota back (a merge patch guarded by its resourceVersion: 409, it changed
    meanwhile, and 404, it is gone, are left to the next pass)."""
    path = kueue.WORKLOADS.format(namespace=namespace)
    try:
        kube.request(
            "PATCH",
            f"{path}/{quote(name)}/status",
            patch,
            content_type="application/merge-patch+json",
            resource=f"{RESOURCE}/status",
        )
    except ApiError as err:
        if err.status not in (404, 409):
            raise
