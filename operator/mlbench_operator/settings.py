"""Typed operator settings from the environment (the Deployment sets them; defaults suit one node).

Parsed once at start-up into an :class:`OperatorConfig`, so a typo
(``MLBENCH_DATASET_ACCESS_MODE=ReadWriteMani``) stops the operator with the variable named instead of
surfacing as an odd PVC error on the first run. ``mlbench-operator`` (:mod:`.main`) hands the config to
kopf in the operator memo (``memo.config``); the handlers read it from there, never from ``os.environ``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mlbench_api.common import DNS1123_SUBDOMAIN, QUANTITY
from mlbench_operator import naming as n

if TYPE_CHECKING:
    from mlbench_operator.policy import AdmissionPolicy

ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod")
#: Kubernetes' quantity grammar, the one the CRDs check (``+20Gi``, ``.5Gi`` and ``1e9`` are quantities too).
_QUANTITY = re.compile(QUANTITY)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN)


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


#: ``MLBENCH_RESYNC_SECONDS``: a run's daemon re-checks its run this often even without an event.
RESYNC_SECONDS = 300.0
#: ``MLBENCH_DEBOUNCE_SECONDS``: after a wake-up, wait this long for more events before reconciling.
DEBOUNCE_SECONDS = 0.3
#: ``MLBENCH_METRICS_PORT``: the operator's own Prometheus endpoint (0: none).
METRICS_PORT = 8080


def _default_policy() -> AdmissionPolicy:
    from mlbench_operator.policy import AdmissionPolicy

    return AdmissionPolicy()


def _default_scrapers() -> tuple[str, ...]:
    from mlbench_operator.netpol import scraper_namespaces

    return scraper_namespaces({})


def _default_results_wait() -> float:
    return results_wait_seconds({})


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the handlers are configured with, parsed once (``from_env``) and then only read.

    Not here: ``MLBENCH_PROGRESS_SECONDS``, the interval of a ``@kopf.timer`` fixed when
    mlbench_operator.handlers is imported (before any config exists), and the leader election's
    settings (:class:`mlbench_operator.leader.LeaderSettings`), which only :mod:`.main` uses.
    """

    datasets: DatasetSettings = field(default_factory=DatasetSettings)
    #: ``MLBENCH_METRICS_LINGER_SECONDS``, passed on to the ranks.
    metrics_linger_seconds: int = n.METRICS_LINGER_SECONDS
    #: ``MLBENCH_RESULTS_WAIT_SECONDS``
    results_wait_seconds: float = field(default_factory=_default_results_wait)
    #: ``MLBENCH_ALLOWED_*``, ``MLBENCH_ALLOW_CONTROL_PLANE``, ``MLBENCH_ALLOW_NETWORK_EMULATION``
    policy: AdmissionPolicy = field(default_factory=_default_policy)
    #: ``MLBENCH_METRICS_NAMESPACES`` plus the operator's own (``POD_NAMESPACE``): they may scrape the ranks.
    scraper_namespaces: tuple[str, ...] = field(default_factory=_default_scrapers)
    #: ``MLBENCH_RUNNER_UID``: the UID runner containers run as; None ("image") keeps the image's user, root
    #: or not (the ssh Secret is then root-owned 0444, no fsGroup; sshd and ssh copy their keys: docs/operator.md).
    runner_uid: int | None = n.RUNNER_UID
    #: ``MLBENCH_RUN_SELECTOR`` (or ``--selector``): serve only BenchmarkRuns matching it ("" = all).
    run_selector: str = ""
    #: ``MLBENCH_METRICS_PORT`` (or ``--metrics-port``)
    metrics_port: int = METRICS_PORT
    #: ``--namespace`` (repeatable): the namespaces the operator serves; () = cluster-wide. Not from the
    #: environment: kopf's flag, which main.py passes to kopf and, through here, to the pod watches.
    namespaces: tuple[str, ...] = ()
    resync_seconds: float = RESYNC_SECONDS
    debounce_seconds: float = DEBOUNCE_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorConfig:
        """Every setting above from ``env``; raises :class:`SettingsError` naming the first bad variable."""
        from mlbench_operator.netpol import scraper_namespaces
        from mlbench_operator.policy import AdmissionPolicy

        return cls(
            datasets=DatasetSettings.from_env(env),
            metrics_linger_seconds=metrics_linger_seconds(env),
            results_wait_seconds=results_wait_seconds(env),
            policy=AdmissionPolicy.from_env(env),
            scraper_namespaces=scraper_namespaces(env),
            runner_uid=runner_uid(env),
            run_selector=env.get("MLBENCH_RUN_SELECTOR", "").strip(),
            metrics_port=_port(env, "MLBENCH_METRICS_PORT", METRICS_PORT),
            resync_seconds=_seconds(env, "MLBENCH_RESYNC_SECONDS", RESYNC_SECONDS, positive=True),
            debounce_seconds=_seconds(env, "MLBENCH_DEBOUNCE_SECONDS", DEBOUNCE_SECONDS),
        )


def runner_uid(env: Mapping[str, str]) -> int | None:
    """``MLBENCH_RUNNER_UID``: the non-root UID runner containers run as (default 1000); "image" (or "")
    keeps the image's own user."""
    raw = env.get("MLBENCH_RUNNER_UID", str(n.RUNNER_UID)).strip()
    if raw in ("", "image"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"MLBENCH_RUNNER_UID={raw!r} is not a UID (an integer) or 'image'") from None
    if value < 0:
        raise SettingsError(f"MLBENCH_RUNNER_UID={raw!r} must be at least 1")
    if value == 0:
        # pods with a UID get runAsNonRoot: true, which the kubelet refuses for UID 0, forever
        raise SettingsError(
            "MLBENCH_RUNNER_UID=0 is root, but runner pods run with runAsNonRoot: true (the kubelet would refuse "
            "to start them); use a non-root UID, or 'image' to keep the image's own user (e.g. root)"
        )
    return value


def _port(env: Mapping[str, str], key: str, default: int) -> int:
    value = _positive(env, key, default, minimum=0)
    if value > 65535:
        raise SettingsError(f"{key}={value} is not a TCP port (0 to 65535)")
    return value


def _seconds(env: Mapping[str, str], key: str, default: float, positive: bool = False) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{key}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise SettingsError(f"{key}={raw!r} must be {'greater than' if positive else 'at least'} 0")
    return value


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
