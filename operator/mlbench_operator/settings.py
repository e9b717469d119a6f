"""Typed operator settings from the environment (the Deployment sets them; defaults suit one node).

Parsed once at start-up, so a typo (``MLBENCH_DATASET_ACCESS_MODE=ReadWriteMani``) stops the operator
with the variable named instead of surfacing as an odd PVC error on the first run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from mlbench_operator import naming as n

ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class SettingsError(ValueError):
    """An environment variable holds an unusable value; the message names it."""


@dataclass(frozen=True)
class DatasetSettings:
    """The namespace dataset volume (a PVC the operator creates when missing) and the fetch Jobs."""

    #: PVC name in every namespace that runs sourced datasets.
    volume_name: str = n.DATASET_VOLUME
    #: StorageClass of the PVC; "" = the cluster's default class (the field is left out).
    storage_class: str = ""
    size: str = "20Gi"
    #: ReadWriteOnce suits one node; a multi-node cluster needs ReadWriteMany (workers on many nodes).
    access_mode: str = "ReadWriteOnce"
    #: The fetch Job's limit: a stalled download fails the run (DatasetFetchFailed) instead of hanging.
    fetch_deadline_seconds: int = 3600
    #: Finished fetch Jobs are garbage after this; the marker on the volume is what persists.
    job_ttl_seconds: int = 3600
    #: Retries of a retryable failure (SourceUnreachable); permanent ones fail at once.
    backoff_limit: int = 2

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DatasetSettings:
        """``MLBENCH_DATASET_*``; raises :class:`SettingsError` naming the variable."""
        d = cls()
        name = env.get("MLBENCH_DATASET_VOLUME", d.volume_name).strip()
        if not _DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
            raise SettingsError(f"MLBENCH_DATASET_VOLUME={name!r} is not a valid PVC name")
        storage_class = env.get("MLBENCH_DATASET_STORAGE_CLASS", "").strip()
        if storage_class and not _DNS1123_SUBDOMAIN.match(storage_class):
            raise SettingsError(f"MLBENCH_DATASET_STORAGE_CLASS={storage_class!r} is not a valid StorageClass name")
        size = env.get("MLBENCH_DATASET_VOLUME_SIZE", d.size).strip()
        if not _QUANTITY.match(size):
            raise SettingsError(f"MLBENCH_DATASET_VOLUME_SIZE={size!r} is not a storage quantity (e.g. 20Gi)")
        mode = env.get("MLBENCH_DATASET_ACCESS_MODE", d.access_mode).strip()
        if mode not in ACCESS_MODES:
            raise SettingsError(f"MLBENCH_DATASET_ACCESS_MODE={mode!r} is not one of {', '.join(ACCESS_MODES)}")
        return cls(
            volume_name=name,
            storage_class=storage_class,
            size=size,
            access_mode=mode,
            fetch_deadline_seconds=_positive(env, "MLBENCH_DATASET_FETCH_DEADLINE_SECONDS", d.fetch_deadline_seconds),
            job_ttl_seconds=_positive(env, "MLBENCH_DATASET_JOB_TTL_SECONDS", d.job_ttl_seconds),
            backoff_limit=_positive(env, "MLBENCH_DATASET_BACKOFF_LIMIT", d.backoff_limit, minimum=0),
        )


def metrics_linger_seconds(env: Mapping[str, str]) -> int:
    """``MLBENCH_METRICS_LINGER_SECONDS``: how long ranks keep serving metrics after training (0: not at all)."""
    return _positive(env, "MLBENCH_METRICS_LINGER_SECONDS", n.METRICS_LINGER_SECONDS, minimum=0)


def results_wait_seconds(env: Mapping[str, str]) -> float:
    """``MLBENCH_RESULTS_WAIT_SECONDS``: how long a finished run's launcher log is waited for and retried
    (mlbench_operator.results.WAIT_SECONDS by default; the kwok tests, whose nodes serve no logs, use 1)."""
    from mlbench_operator.results import WAIT_SECONDS

    return float(_positive(env, "MLBENCH_RESULTS_WAIT_SECONDS", int(WAIT_SECONDS), minimum=0))


def _positive(env: Mapping[str, str], key: str, default: int, minimum: int = 1) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{key}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{key}={raw!r} must be at least {minimum}")
    return value
