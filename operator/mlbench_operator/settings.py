"""Typed operator settings from the environment (the Deployment sets them; defaults suit one node).

Parsed once at start-up into an :class:`OperatorConfig`, so a typo
(``MLBENCH_DATASET_ACCESS_MODE=ReadWriteMani``) stops the operator with the variable named instead of
surfacing as an odd PVC error on the first run. ``mlbench-operator`` (:mod:`.main`) hands the config to
kopf in the operator memo (``memo.config``); the handlers read it from there, never from ``os.environ``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from mlbench_api import bundle, contract
from mlbench_api.common import DNS1123_SUBDOMAIN, QUANTITY
from mlbench_operator import egress, fairshare, nsready
from mlbench_operator import naming as n
from mlbench_operator.env import SettingsError, cidrs, integer, port, seconds
from mlbench_operator.policy import DEFAULT_RUNNER_IMAGE, AdmissionPolicy

ACCESS_MODES = ("ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod")
#: Kubernetes' quantity grammar, the one the CRDs check (``+20Gi``, ``.5Gi`` and ``1e9`` are quantities too).
_QUANTITY = re.compile(QUANTITY)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN)


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
    #: ``MLBENCH_FETCH_EGRESS_CIDRS``: where a fetch Job may connect besides DNS (its NetworkPolicy's egress);
    #: None (unset): every address but the link-local metadata blocks. Nothing may connect to a fetch Job either way.
    egress_cidrs: tuple[str, ...] | None = None
    #: ``MLBENCH_FETCH_IMAGE`` (default: ``MLBENCH_RUNNER_IMAGE``'s): the image every fetch Job runs, pinned by
    #: the operator; never a run's own image (the Job writes the volume every run of the namespace reads).
    fetch_image: str = DEFAULT_RUNNER_IMAGE

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
            fetch_deadline_seconds=integer(env, "MLBENCH_DATASET_FETCH_DEADLINE_SECONDS", d.fetch_deadline_seconds),
            job_ttl_seconds=integer(env, "MLBENCH_DATASET_JOB_TTL_SECONDS", d.job_ttl_seconds),
            backoff_limit=integer(env, "MLBENCH_DATASET_BACKOFF_LIMIT", d.backoff_limit, minimum=0),
            egress_cidrs=fetch_egress_cidrs(env),
            fetch_image=fetch_image(env),
        )


def fetch_egress_cidrs(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """``MLBENCH_FETCH_EGRESS_CIDRS`` (comma-separated blocks; unset: None); a block within the link-local metadata
    addresses is refused (no egress rule may reach them). Raises :class:`SettingsError` naming the variable."""
    blocks = cidrs(env, "MLBENCH_FETCH_EGRESS_CIDRS")
    for block in blocks or ():
        meta = egress.metadata_overlap(block)
        if meta is not None:
            raise SettingsError(
                f"MLBENCH_FETCH_EGRESS_CIDRS: {block} lies within {meta}, the cloud metadata addresses, "
                "which a fetch Job may never reach"
            )
    return blocks


def fetch_image(env: Mapping[str, str]) -> str:
    """``MLBENCH_FETCH_IMAGE``, else ``MLBENCH_RUNNER_IMAGE``, else the default runner image; a pattern or a list
    is refused (:class:`SettingsError` naming the variable)."""
    name = "MLBENCH_FETCH_IMAGE" if env.get("MLBENCH_FETCH_IMAGE", "").strip() else "MLBENCH_RUNNER_IMAGE"
    image = env.get(name, "").strip() or DEFAULT_RUNNER_IMAGE
    if any(c in image for c in "*?[ ,"):
        raise SettingsError(f"{name}: expected an image reference, got {image!r}")
    return image


def metrics_linger_seconds(env: Mapping[str, str]) -> int:
    """``MLBENCH_METRICS_LINGER_SECONDS``: how long ranks keep serving metrics after training (0: not at all)."""
    return integer(env, contract.ENV_METRICS_LINGER_SECONDS, contract.METRICS_LINGER_SECONDS, minimum=0)


def results_wait_seconds(env: Mapping[str, str]) -> float:
    """``MLBENCH_RESULTS_WAIT_SECONDS``: how long a finished run's launcher log is waited for and retried
    (:data:`RESULTS_WAIT_SECONDS` by default; the kwok tests, whose nodes serve no logs, use 1)."""
    return float(integer(env, "MLBENCH_RESULTS_WAIT_SECONDS", int(RESULTS_WAIT_SECONDS), minimum=0))


def results_max_bytes(env: Mapping[str, str]) -> int:
    """``MLBENCH_RESULTS_MAX_BYTES``: the most a launcher's results files may hold together once decompressed
    (:data:`mlbench_api.bundle.MAX_TOTAL_BYTES` by default, what the launcher fits its bundle within); a larger
    bundle is counted without being kept and refused. At least 64 KiB, at most the default: the operator's
    memory limit is sized for it."""
    value = integer(env, "MLBENCH_RESULTS_MAX_BYTES", bundle.MAX_TOTAL_BYTES, minimum=64 * 1024)
    if value > bundle.MAX_TOTAL_BYTES:
        raise SettingsError(f"MLBENCH_RESULTS_MAX_BYTES={value} is over {bundle.MAX_TOTAL_BYTES}")
    return value


#: How long after the run ended a launcher that is still running may take to print its results (a
#: failed worker makes mpirun abort within seconds; reading worker 0 takes up to 2 x 15 s, more under a
#: spec.network delay: :func:`wait_for`), and how
#: long a log that cannot be read (kubelet restarting) is retried. The launcher and worker 0 are kept
#: that long at most, even under cleanPodPolicy All.
RESULTS_WAIT_SECONDS = 60.0


#: Namespaces allowed to scrape metrics by default: kube-prometheus-stack's usual home.
DEFAULT_METRICS_NAMESPACES = ("monitoring",)
#: Where the operator runs when the downward API does not say (manifests/operator/namespace.yaml).
DEFAULT_OPERATOR_NAMESPACE = "mlbench-system"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def scraper_namespaces(env: Mapping[str, str]) -> tuple[str, ...]:
    """``MLBENCH_METRICS_NAMESPACES`` (comma-separated; default ``monitoring``) plus the operator's own
    namespace (``POD_NAMESPACE``); raises :class:`SettingsError` naming the variable."""
    raw = env.get("MLBENCH_METRICS_NAMESPACES")
    names = [x.strip() for x in raw.split(",") if x.strip()] if raw is not None else list(DEFAULT_METRICS_NAMESPACES)
    for name in names:
        if not _DNS_LABEL.match(name):
            raise SettingsError(f"MLBENCH_METRICS_NAMESPACES: {name!r} is not a namespace name")
    own = env.get("POD_NAMESPACE", "").strip() or DEFAULT_OPERATOR_NAMESPACE
    return tuple(sorted({*names, own}))


def scraper_cidrs(env: Mapping[str, str]) -> tuple[str, ...]:
    """``MLBENCH_METRICS_CIDRS`` (comma-separated address blocks; default none): scrapers that live in no namespace
    the policy can select, e.g. a Prometheus on a host. Raises :class:`SettingsError` naming the variable."""
    return cidrs(env, "MLBENCH_METRICS_CIDRS") or ()


#: ``MLBENCH_NODE_LOSS_SECONDS``: a run's pods stay this long on a node that stopped answering, then Kubernetes
#: evicts them (a disruption: the gang restarts on the nodes left without spending maxRestarts).
NODE_LOSS_SECONDS = 60


def node_loss_seconds(env: Mapping[str, str]) -> int | None:
    """``MLBENCH_NODE_LOSS_SECONDS`` (default 60; ``default``: Kubernetes' own 300 s, no toleration added)."""
    if env.get("MLBENCH_NODE_LOSS_SECONDS", "").strip() == "default":
        return None
    return integer(env, "MLBENCH_NODE_LOSS_SECONDS", NODE_LOSS_SECONDS, minimum=0)


#: ``MLBENCH_RESYNC_SECONDS``: a run's daemon re-checks its run this often even without an event.
RESYNC_SECONDS = 300.0
#: ``MLBENCH_DEBOUNCE_SECONDS``: after a wake-up, wait this long for more events before reconciling.
DEBOUNCE_SECONDS = 0.3
#: ``MLBENCH_METRICS_PORT``: the operator's own Prometheus endpoint (0: none).
METRICS_PORT = 8080
#: ``MLBENCH_PROGRESS_SECONDS``: how often rank 0's metrics are copied into ``status.progress`` (``kubectl get
#: br``'s EPOCH, ACCURACY): the interval of the progress timer, fixed when the handlers are registered.
PROGRESS_SECONDS = 30.0


#: ``MLBENCH_GANG_SCHEDULER_NAME``: scheduler-plugins' usual second scheduler (its coscheduling profile).
GANG_SCHEDULER_NAME = "scheduler-plugins-scheduler"


def gang_scheduler_name(env: Mapping[str, str]) -> str:
    """``MLBENCH_GANG_SCHEDULER_NAME`` (default scheduler-plugins-scheduler); raises :class:`SettingsError`."""
    name = env.get("MLBENCH_GANG_SCHEDULER_NAME", GANG_SCHEDULER_NAME).strip()
    if not _DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        raise SettingsError(f"MLBENCH_GANG_SCHEDULER_NAME={name!r} is not a scheduler name (a DNS subdomain)")
    return name


@dataclass(frozen=True)
class ScratchLimits:
    """Size limits of the run's pods' scratch emptyDirs (a pod past one is evicted, naming it): a run cannot fill
    its node's disk or memory through them."""

    #: ``MLBENCH_SHM_SIZE_LIMIT``: the workers' memory-backed ``/dev/shm`` (DataLoader workers, NCCL's shm transport).
    shm: str = "1Gi"
    #: ``MLBENCH_OUTPUT_SIZE_LIMIT``: the ranks' output (summary, events, the launcher's collected results).
    output: str = "1Gi"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ScratchLimits:
        """Storage quantities (e.g. ``512Mi``); unset or empty: the default. Raises :class:`SettingsError`."""
        d = cls()
        out = {}
        for key, field_name, default in (
            ("MLBENCH_SHM_SIZE_LIMIT", "shm", d.shm),
            ("MLBENCH_OUTPUT_SIZE_LIMIT", "output", d.output),
        ):
            raw = env.get(key, "").strip() or default
            if not _QUANTITY.match(raw):
                raise SettingsError(f"{key}={raw!r} is not a storage quantity (e.g. 512Mi)")
            out[field_name] = raw
        return cls(**out)


#: The defaults (1Gi each).
SCRATCH_LIMITS = ScratchLimits()


def _default_scrapers() -> tuple[str, ...]:
    return scraper_namespaces({})


def _default_results_wait() -> float:
    return results_wait_seconds({})


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the handlers are configured with, parsed once (``from_env``) and then only read.

    Not here: the leader election's settings (:class:`mlbench_operator.leadersettings.LeaderSettings`), which only
    :mod:`.main` uses.
    """

    datasets: DatasetSettings = field(default_factory=DatasetSettings)
    #: ``MLBENCH_METRICS_LINGER_SECONDS``, passed on to the ranks.
    metrics_linger_seconds: int = contract.METRICS_LINGER_SECONDS
    #: ``MLBENCH_RESULTS_WAIT_SECONDS``
    results_wait_seconds: float = field(default_factory=_default_results_wait)
    #: ``MLBENCH_RESULTS_MAX_BYTES``
    results_max_bytes: int = bundle.MAX_TOTAL_BYTES
    #: ``MLBENCH_ALLOWED_*``, ``MLBENCH_ALLOW_CONTROL_PLANE``, ``MLBENCH_ALLOW_NETWORK_EMULATION``
    policy: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    #: ``MLBENCH_METRICS_NAMESPACES`` plus the operator's own (``POD_NAMESPACE``): they may scrape the ranks.
    scraper_namespaces: tuple[str, ...] = field(default_factory=_default_scrapers)
    #: ``MLBENCH_METRICS_CIDRS``: address blocks that may scrape the ranks too.
    scraper_cidrs: tuple[str, ...] = ()
    #: ``MLBENCH_NODE_LOSS_SECONDS``: the run's pods' NoExecute tolerations of a lost node (None: Kubernetes' own)
    node_loss_seconds: int | None = NODE_LOSS_SECONDS
    #: ``MLBENCH_RUNNER_UID``: the UID runner containers run as; None ("image") keeps the image's user, root
    #: or not (the ssh Secret is then root-owned 0444, no fsGroup; sshd and ssh copy their keys: docs/operator.md).
    runner_uid: int | None = contract.RUNNER_UID
    #: ``MLBENCH_GANG_SCHEDULER_NAME``: the scheduler of gang-scheduled workers (spec.scheduling.gang) that name none.
    gang_scheduler_name: str = GANG_SCHEDULER_NAME
    #: ``MLBENCH_SHM_SIZE_LIMIT``, ``MLBENCH_OUTPUT_SIZE_LIMIT``: the pods' scratch emptyDirs.
    scratch: ScratchLimits = SCRATCH_LIMITS
    #: ``MLBENCH_RUN_SELECTOR`` (or ``--selector``): serve only BenchmarkRuns matching it ("" = all).
    run_selector: str = ""
    #: ``MLBENCH_METRICS_PORT`` (or ``--metrics-port``)
    metrics_port: int = METRICS_PORT
    #: ``--namespace`` (repeatable): the namespaces the operator serves; () = cluster-wide. Not from the
    #: environment: kopf's flag, which main.py passes to kopf and, through here, to the pod watches.
    namespaces: tuple[str, ...] = ()
    #: ``MLBENCH_NAMESPACE_SYNC_SECONDS``: with ``namespaces``, how long the start waits for one's first pod listing
    #: before it serves the others without it (:mod:`.nsready`).
    namespace_sync_seconds: float = nsready.SYNC_SECONDS
    #: ``MLBENCH_CREATE_SLOTS``: creates in flight at once, all runs together, handed out in turn to the
    #: namespaces, then the runs, that wait (:mod:`.fairshare`).
    create_slots: int = fairshare.CREATE_SLOTS
    resync_seconds: float = RESYNC_SECONDS
    debounce_seconds: float = DEBOUNCE_SECONDS
    progress_seconds: float = PROGRESS_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorConfig:
        """Every setting above from ``env``; raises :class:`SettingsError` naming the first bad variable."""
        return cls(
            datasets=DatasetSettings.from_env(env),
            metrics_linger_seconds=metrics_linger_seconds(env),
            results_wait_seconds=results_wait_seconds(env),
            results_max_bytes=results_max_bytes(env),
            policy=AdmissionPolicy.from_env(env),
            scraper_namespaces=scraper_namespaces(env),
            scraper_cidrs=scraper_cidrs(env),
            node_loss_seconds=node_loss_seconds(env),
            runner_uid=runner_uid(env),
            gang_scheduler_name=gang_scheduler_name(env),
            scratch=ScratchLimits.from_env(env),
            run_selector=env.get("MLBENCH_RUN_SELECTOR", "").strip(),
            metrics_port=port(env, "MLBENCH_METRICS_PORT", METRICS_PORT),
            namespace_sync_seconds=seconds(env, "MLBENCH_NAMESPACE_SYNC_SECONDS", nsready.SYNC_SECONDS, positive=True),
            create_slots=integer(env, "MLBENCH_CREATE_SLOTS", fairshare.CREATE_SLOTS),
            resync_seconds=seconds(env, "MLBENCH_RESYNC_SECONDS", RESYNC_SECONDS, positive=True),
            debounce_seconds=seconds(env, "MLBENCH_DEBOUNCE_SECONDS", DEBOUNCE_SECONDS),
            progress_seconds=seconds(env, "MLBENCH_PROGRESS_SECONDS", PROGRESS_SECONDS, positive=True),
        )


def runner_uid(env: Mapping[str, str]) -> int | None:
    """``MLBENCH_RUNNER_UID``: the non-root UID runner containers run as (default 1000); "image" (or "")
    keeps the image's own user."""
    raw = env.get("MLBENCH_RUNNER_UID", str(contract.RUNNER_UID)).strip()
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
