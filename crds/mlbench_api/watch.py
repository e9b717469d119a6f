"""``mlbench watch <namespace>/<run>``: follow a cluster run until it ends, and exit with its outcome.

The pure functions here decide (the line a status prints as, the exit code an event ends the watch with);
:func:`follow` is the glue on the Kubernetes client's watch API (``kubernetes`` comes with the ``cli`` extra,
imported only when a cluster is watched, as :mod:`mlbench_api.download` does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mlbench_api.common import GROUP, VERSION
from mlbench_api.contract import FAILED
from mlbench_api.display import duration, epoch, percent
from mlbench_api.download import ResultsUnavailable, _clients, _why
from mlbench_api.runstatus import Phase

#: The run ended Succeeded.
EXIT_SUCCEEDED = 0
#: The run ended Failed.
EXIT_FAILED = 1
# 2 is EXIT_BAD_INPUT (mlbench_api.badinput): no <namespace>/<run>, an unknown flag.
#: The run was deleted while watched: it has no outcome.
EXIT_DELETED = 3
#: The run cannot be watched: not found, forbidden, or the cluster cannot be reached.
EXIT_UNAVAILABLE = 4
#: Seconds of one watch request before it is renewed (the API server ends a watch after at most its own limit).
WATCH_SECONDS = 300


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _reason(status: Mapping[str, Any], kind: str) -> str:
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == kind and cond.get("status") == "True":
            return str(cond.get("reason") or "")
    return ""


def status_line(obj: Mapping[str, Any]) -> str:
    """One line for a person: ``Running  epoch 2.5  score 24.3 BLEU  workers 2/2``, then the outcome's figures."""
    status = _status(obj)
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    parts = [str(status.get("phase") or "Pending")]
    workers = status.get("workers") or {}
    progress = status.get("progress") or {}
    result = status.get("result") or {}
    if isinstance(progress.get("epoch"), int | float):
        parts.append(f"epoch {epoch(progress['epoch'])}")
    if isinstance(progress.get("score"), str):
        parts.append(f"score {progress['score']}")
    elif isinstance(progress.get("lastAccuracy"), int | float):  # an operator older than status.progress.score
        parts.append(f"accuracy {percent(progress['lastAccuracy'])}")
    if isinstance(workers.get("ready"), int) and status.get("phase") not in (Phase.SUCCEEDED, Phase.FAILED):
        parts.append(f"workers {workers['ready']}/{workers.get('total', spec.get('workers', '?'))}")
    if result:
        parts.append("goal reached" if result.get("goalReached") else "goal not reached")
        if isinstance(result.get("timeToGoalSeconds"), int | float):
            parts.append(f"time to goal {duration(result['timeToGoalSeconds'])}")
    reason = _reason(status, FAILED) if status.get("phase") == Phase.FAILED else ""
    if reason:
        parts.append(f"reason {reason}")
    if status.get("message") and status.get("phase") == Phase.FAILED:
        parts.append(str(status["message"]))
    return "  ".join(parts)


def outcome(event_type: str, obj: Mapping[str, Any]) -> int | None:
    """The exit code this watch event ends the watch with; None while the run goes on."""
    if event_type == "DELETED":
        return EXIT_DELETED
    phase = _status(obj).get("phase")
    if phase == Phase.SUCCEEDED:
        return EXIT_SUCCEEDED
    if phase == Phase.FAILED:
        return EXIT_FAILED
    return None


#: How a change is said: its status line and the run it was made from (``-o json`` prints the run).
Say = Callable[[str, Mapping[str, Any]], None]


def follow_events(events: Iterable[tuple[str, Mapping[str, Any]]], say: Say, last: str = "") -> tuple[int | None, str]:
    """Say each event (type, object) whose status line is new; the outcome that ended them (None: they ran out,
    the watch must be renewed) and the last line said."""
    for event_type, obj in events:
        line = "deleted while watched" if event_type == "DELETED" else status_line(obj)
        if line != last:
            say(line, obj)
            last = line
        code = outcome(event_type, obj)
        if code is not None:
            return code, last
    return None, last


def follow(namespace: str, run: str, say: Say, *, kubeconfig: str | None = None, context: str | None = None) -> int:
    """Watch ``namespace/run`` until it ends (ResultsUnavailable: the cluster or the run cannot be read)."""
    # Lazy: kubernetes is the `cli` extra's; the runner image imports this module without it.
    import urllib3  # noqa: PLC0415
    from kubernetes import watch  # noqa: PLC0415
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    _, custom = _clients(kubeconfig, context)
    last = ""
    while True:
        try:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "benchmarkruns", run)
            code, last = follow_events([("ADDED", obj)], say, last)
            if code is not None:
                return code
            stream = watch.Watch().stream(
                custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                "benchmarkruns",
                field_selector=f"metadata.name={run}",
                resource_version=obj["metadata"]["resourceVersion"],
                timeout_seconds=WATCH_SECONDS,
            )
            code, last = follow_events(((e["type"], e["object"]) for e in stream), say, last)
        except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:
            if getattr(exc, "status", None) == 410:  # the resource version expired: read the run again
                continue
            raise ResultsUnavailable(f"BenchmarkRun {namespace}/{run}: {_why(exc)}") from exc
        if code is not None:
            return code
