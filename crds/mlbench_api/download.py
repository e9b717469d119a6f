"""``mlbench fetch <namespace>/<run>``: a cluster run's kept results as a local result directory.

The operator keeps a finished run's ``summary.json``, ``events.jsonl`` and ``config.json`` in the
ConfigMap named by ``status.results.configMap`` (see :mod:`mlbench_api.bundle`). Downloaded, they
form the same directory a local run writes, so ``mlbench results`` tables and plots work alike.
"""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from mlbench_api import atomic, bundle
from mlbench_api.common import GROUP, VERSION
from mlbench_api.runstatus import TERMINAL

#: ``<namespace>/<run>``: a namespace is a DNS-1123 label, a run name a DNS-1035 label.
REF = re.compile(r"^(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)/(?P<run>[a-z]([-a-z0-9]*[a-z0-9])?)$")
DEFAULT_ROOT = Path("mlbench-results")
#: The operator records results within about a minute of the end (mlbench_operator.results.WAIT_SECONDS).
COLLECT_GRACE = timedelta(minutes=3)


class ResultsUnavailable(Exception):
    """The run, its results or the cluster cannot be reached; the message says which."""


def parse_ref(text: str) -> tuple[str, str] | None:
    """(namespace, run) of ``namespace/run``; None for anything else (e.g. a local directory)."""
    m = REF.match(text)
    return (m["namespace"], m["run"]) if m else None


def default_dir(namespace: str, run: str) -> Path:
    """``mlbench-results/<namespace>.<run>``: next to local runs' ``mlbench-results/<run>`` (run names
    have no dots, so the two never collide, and ``mlbench results mlbench-results/*`` reads both)."""
    return DEFAULT_ROOT / f"{namespace}.{run}"


def _clients(kubeconfig: str | None, context: str | None) -> tuple[Any, Any]:
    # Lazy: kubernetes is the `cli` extra's; the runner image imports this module without it.
    from kubernetes import client, config  # noqa: PLC0415
    from kubernetes.config.config_exception import ConfigException  # noqa: PLC0415

    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
    except (ConfigException, OSError, TypeError, yaml.YAMLError) as exc:  # YAMLError: a kubeconfig not YAML
        try:
            config.load_incluster_config()
        except ConfigException:
            raise ResultsUnavailable(f"no cluster configuration (kubeconfig: {exc})") from exc
    return client.CoreV1Api(), client.CustomObjectsApi()


def results_ref(run_obj: dict[str, Any], now: datetime | None = None) -> str:
    """The ConfigMap name in a run's ``status.results``; ResultsUnavailable saying why there is none.

    ``status.results`` holding only ``failingSince`` is a collection being retried, not an outcome: after
    the grace time it must not read as "no results were kept" while they may still come.
    """
    meta = run_obj.get("metadata") or {}
    status = run_obj.get("status") or {}
    ref = status.get("results") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    if ref.get("configMap"):
        return str(ref["configMap"])
    if ref.get("message"):
        raise ResultsUnavailable(f"{name} has no kept results: {ref['message']}")
    phase = status.get("phase") or "Pending"
    if phase not in TERMINAL:
        raise ResultsUnavailable(f"{name} is {phase}: results are kept once it has finished")
    if ref.get("failingSince"):  # not "none were kept": the operator retries (mlbench_operator.results)
        raise ResultsUnavailable(
            f"{name} finished; the operator is still retrying to collect its results (failing since "
            f"{ref['failingSince']}); try again shortly"
        )
    done = status.get("completionTime")
    ended = datetime.fromisoformat(done.replace("Z", "+00:00")) if done else None
    if ended is not None and (now or datetime.now(UTC)) - ended > COLLECT_GRACE:
        raise ResultsUnavailable(
            f"{name} finished at {done} and no results were kept (an operator older than kept results, "
            "or its launcher pod was gone)"
        )
    raise ResultsUnavailable(f"{name} finished but its results are not collected yet; try again shortly")


def from_config_map(cm_binary_data: dict[str, str] | None) -> bundle.Bundle:
    """The bundle in a results ConfigMap's ``binaryData`` (base64 strings, as the API returns them)."""
    if not cm_binary_data:
        raise bundle.BundleError("the results ConfigMap has no binaryData")
    return bundle.from_compressed({k: base64.b64decode(v) for k, v in cm_binary_data.items()})


def verified(run_obj: dict[str, Any], found: bundle.Bundle) -> bundle.Bundle:
    """``found`` when its files are those whose SHA-256 the operator recorded (``status.results.sha256``); a
    :class:`bundle.BundleError` naming the file otherwise. A run kept by an older operator recorded none: its
    files are taken as they are."""
    expected = ((run_obj.get("status") or {}).get("results") or {}).get("sha256")
    if expected:
        bundle.check_digests(found, expected)
    return found


def write(found: bundle.Bundle, dest: Path) -> list[Path]:
    """The files into ``dest`` (created), as a local run lays them out. A bundle file that this one lacks is
    removed first: it is an earlier fetch's (a run re-created under the same name that failed before its
    summary, an event log cut from the bundle), and would be read as this run's."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in set(bundle.FILES) - set(found.files):
        (dest / name).unlink(missing_ok=True)
    paths = []
    for name, data in sorted(found.files.items()):
        path = dest / name
        atomic.write_bytes(path, data)  # an interrupted fetch must not leave half a summary.json
        paths.append(path)
    return paths


def _why(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    return f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status else f"cannot reach the cluster: {exc}"


def download(
    namespace: str, run: str, dest: Path, *, kubeconfig: str | None = None, context: str | None = None
) -> list[Path]:
    """Fetch ``namespace/run``'s kept results into ``dest``; returns the written files."""
    # Lazy: kubernetes is the `cli` extra's; the runner image imports this module without it.
    import urllib3  # noqa: PLC0415
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    core, custom = _clients(kubeconfig, context)
    try:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "benchmarkruns", run)
    except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:
        raise ResultsUnavailable(f"BenchmarkRun {namespace}/{run}: {_why(exc)}") from exc
    name = results_ref(obj)
    try:
        cm = core.read_namespaced_config_map(name, namespace)
    except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:
        raise ResultsUnavailable(f"ConfigMap {namespace}/{name}: {_why(exc)}") from exc
    try:
        found = verified(obj, from_config_map(cm.binary_data))
    except bundle.BundleError as exc:
        raise ResultsUnavailable(f"{namespace}/{name}: {exc}") from exc
    return write(found, dest)
