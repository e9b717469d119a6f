"""What a run may ask of the cluster: the cluster admin's admission policy for BenchmarkRuns.

A BenchmarkRun author is a namespace user, not a cluster admin, yet a run's pods are built from
fields anyone with ``edit`` can set: ``spec.image`` (and the task's ``runner.image``),
``scheduling.priorityClassName``, tolerations and node selectors, and the task's free-form
``dataset.volume``. Unchecked, those create pods with any image, ``system-node-critical``
priority, on control-plane nodes, or with a ``hostPath`` volume. The operator checks the run
against this policy at admission (a run that breaks it fails with reason ``PolicyViolation`` and
a message naming the field, having created nothing). The defaults are safe; the admin widens them
with ``MLBENCH_ALLOWED_*`` variables on the operator's Deployment.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mlbench_operator.settings import SettingsError

#: Images a run may use by default: the project's runner, any tag or digest.
DEFAULT_IMAGES = ("docker.io/mlbench/mlbench-runner:*", "docker.io/mlbench/mlbench-runner@sha256:*")
#: Volume types ``dataset.volume`` may use by default: storage a namespace user could mount anyway.
DEFAULT_VOLUME_TYPES = ("persistentVolumeClaim", "nfs", "csi", "ephemeral", "configMap", "emptyDir")
#: Priority classes refused unless the admin lists them (Kubernetes reserves ``system-`` for itself).
RESERVED_PRIORITY_PREFIX = "system-"
#: Node roles a run may not select or tolerate unless allowed: benchmarks do not belong on them.
CONTROL_PLANE_KEYS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")


def normalize_image(ref: str) -> str:
    """``mlbench/x:1`` and ``docker.io/mlbench/x:1`` are the same image; patterns and references are
    compared in the registry-qualified form (as the container runtime resolves them)."""
    first, _, rest = ref.partition("/")
    if not rest:  # "busybox:1" -> docker.io/library/busybox:1
        return f"docker.io/library/{ref}"
    if "." in first or ":" in first or first == "localhost":
        return "docker.io/" + rest if first == "index.docker.io" else ref
    return f"docker.io/{ref}"


@dataclass(frozen=True)
class AdmissionPolicy:
    """The admin's limits on runs; ``from_env`` reads them (``*`` allows everything)."""

    images: tuple[str, ...] = DEFAULT_IMAGES
    #: None: every class except the reserved ``system-*`` ones.
    priority_classes: tuple[str, ...] | None = None
    allow_control_plane: bool = False
    volume_types: tuple[str, ...] = DEFAULT_VOLUME_TYPES

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AdmissionPolicy:
        """``MLBENCH_ALLOWED_IMAGES``, ``MLBENCH_ALLOWED_PRIORITY_CLASSES``, ``MLBENCH_ALLOWED_VOLUME_TYPES``
        (comma-separated; shell-style patterns for images and classes) and ``MLBENCH_ALLOW_CONTROL_PLANE``
        (true/false). Raises :class:`SettingsError` naming the variable."""
        images = _list(env, "MLBENCH_ALLOWED_IMAGES")
        classes = _list(env, "MLBENCH_ALLOWED_PRIORITY_CLASSES")
        volumes = _list(env, "MLBENCH_ALLOWED_VOLUME_TYPES")
        raw = env.get("MLBENCH_ALLOW_CONTROL_PLANE", "").strip().lower()
        if raw not in ("", "true", "false"):
            raise SettingsError(f"MLBENCH_ALLOW_CONTROL_PLANE={raw!r} must be true or false")
        return cls(
            images=tuple(normalize_image(i) if i != "*" else i for i in images) if images else DEFAULT_IMAGES,
            priority_classes=tuple(classes) if classes else None,
            allow_control_plane=raw == "true",
            volume_types=tuple(volumes) if volumes else DEFAULT_VOLUME_TYPES,
        )


def _list(env: Mapping[str, str], key: str) -> list[str]:
    items = [x.strip() for x in env.get(key, "").split(",")]
    if any(not x for x in items) and any(items):
        raise SettingsError(f"{key}={env.get(key)!r} has an empty entry")
    return [x for x in items if x]


def _matches(value: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def check_image(image: str, field: str, policy: AdmissionPolicy) -> list[str]:
    if _matches(normalize_image(image), policy.images):
        return []
    allowed = ", ".join(policy.images)
    return [f"{field}: image {image!r} is not allowed by the operator's policy (MLBENCH_ALLOWED_IMAGES: {allowed})"]


def check_priority(name: str | None, policy: AdmissionPolicy) -> list[str]:
    if not name:
        return []
    field = "spec.scheduling.priorityClassName"
    if policy.priority_classes is None:
        if name.startswith(RESERVED_PRIORITY_PREFIX):
            return [f"{field}: {name!r} is reserved for the cluster's own components"]
        return []
    if _matches(name, policy.priority_classes):
        return []
    return [
        f"{field}: {name!r} is not allowed (MLBENCH_ALLOWED_PRIORITY_CLASSES: {', '.join(policy.priority_classes)})"
    ]


def check_placement(scheduling: Mapping[str, Any] | None, policy: AdmissionPolicy) -> list[str]:
    """Control-plane nodes: neither selected nor tolerated (a toleration of every taint included)."""
    if policy.allow_control_plane or not scheduling:
        return []
    out = []
    for key in scheduling.get("nodeSelector") or {}:
        if key in CONTROL_PLANE_KEYS:
            out.append(f"spec.scheduling.nodeSelector: {key!r} selects control-plane nodes")
    for i, tol in enumerate(scheduling.get("tolerations") or []):
        key = tol.get("key")
        if not key and tol.get("operator") == "Exists":
            out.append(f"spec.scheduling.tolerations[{i}]: tolerates every taint, control-plane ones included")
        elif key in CONTROL_PLANE_KEYS:
            out.append(f"spec.scheduling.tolerations[{i}]: tolerates {key!r} (control-plane nodes)")
    return out


def check_volume(volume: Mapping[str, Any] | None, policy: AdmissionPolicy) -> list[str]:
    """``dataset.volume`` is a free-form Volume source: only the allowed types (never hostPath by default)."""
    if not volume:
        return []
    kinds = sorted(k for k in volume if k != "name")
    refused = [k for k in kinds if k not in policy.volume_types]
    if not refused:
        return []
    return [
        f"task dataset.volume: volume type {refused[0]!r} is not allowed "
        f"(MLBENCH_ALLOWED_VOLUME_TYPES: {', '.join(policy.volume_types)})"
    ]


def violations(
    image: str,
    image_field: str,
    scheduling: Mapping[str, Any] | None,
    dataset_volume: Mapping[str, Any] | None,
    policy: AdmissionPolicy,
) -> list[str]:
    """Every way the run breaks the policy, each naming its field (empty: admitted)."""
    return [
        *check_image(image, image_field, policy),
        *check_priority((scheduling or {}).get("priorityClassName"), policy),
        *check_placement(scheduling, policy),
        *check_volume(dataset_volume, policy),
    ]
