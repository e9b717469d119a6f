"""Which watched namespaces the operator can serve (the namespaced install, ``--namespace``): pure decisions.

A namespace whose RoleBinding was deleted (or that does not exist: its RoleBinding cannot either) answers every
request with 403. kopf stops the whole operator when one of its watch streams meets a 403, and the operator's
start waited for every namespace's first pod listing: one such namespace stopped every other. So kopf watches
only the namespaces whose pods were listed (:func:`served`), each namespace's first sync has a time bound
(:func:`health`), and a namespace that cannot be read is reported (metric, Event, log) and looked at again. A
namespace once served stays served through an API server's outage, however long: only a refusal un-serves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: ``MLBENCH_NAMESPACE_SYNC_SECONDS`` default: how long the start waits for a namespace's first pod listing (a
#: namespace's first sync only: a served one is not timed).
SYNC_SECONDS = 30.0
#: How often a served namespace is asked whether it is still readable (a RoleBinding deleted while the
#: operator runs), well inside the watches' 300 s, so that kopf stops watching it before its watch meets the 403.
PROBE_SECONDS = 20.0

#: Event reasons (on the operator's Lease, or its pod without leader election).
UNAVAILABLE = "NamespaceUnavailable"
AVAILABLE = "NamespaceAvailable"


@dataclass(frozen=True)
class Health:
    """One namespace's verdict: ``ready`` (kopf watches it), else why not (``reason``, ``message``)."""

    namespace: str
    ready: bool
    reason: str
    message: str


def health(
    namespace: str, synced: bool, error: int | None, waited: float, bound: float, *, served: bool
) -> Health | None:
    """The verdict on ``namespace`` from its pod watch: ``synced`` (its latest listing succeeded and no failure
    came after it), ``error`` (the HTTP status of its latest failure, 0 for no answer; None: none since), after
    ``waited`` seconds of trying; None while there is no verdict yet (no answer, still inside ``bound``).

    ``bound`` is for a namespace's first sync only. One already ``served`` is un-served by a refusal (401, 403,
    404) alone: no answer, a 5xx or a 429 is the API server's trouble (an outage, a restart), which every
    namespace meets alike; timed, an outage longer than ``bound`` un-served them all until it answered again."""
    if synced and error is None:
        return Health(namespace, True, AVAILABLE, f"namespace {namespace} is served")
    if error in (401, 403):
        return Health(
            namespace,
            False,
            UNAVAILABLE,
            f"the operator may not read namespace {namespace} (HTTP {error}): its RoleBinding to the operator's "
            "Role is missing, or the namespace does not exist; the other namespaces are served",
        )
    if error == 404:
        return Health(namespace, False, UNAVAILABLE, f"namespace {namespace} does not exist (HTTP 404)")
    if served or waited < bound:
        return None
    why = f"HTTP {error}" if error else "no answer"
    return Health(
        namespace,
        False,
        UNAVAILABLE,
        f"namespace {namespace} was not listed within {bound:g} s ({why}); the other namespaces are served",
    )


def served(current: frozenset[str], verdicts: dict[str, Health | None]) -> frozenset[str]:
    """The namespaces kopf should watch: the ready ones; one without a verdict yet keeps what it had."""
    keep = {ns for ns, h in verdicts.items() if h is None and ns in current}
    return frozenset({ns for ns, h in verdicts.items() if h is not None and h.ready} | keep)


def changed(before: Health | None, after: Health | None) -> bool:
    """Whether ``after`` is news worth an Event: a first verdict that the namespace is unavailable, or a turn
    (ready to unavailable, unavailable to ready). A first ready verdict is the normal start: no Event."""
    if after is None:
        return False
    if before is None:
        return not after.ready
    return before.ready != after.ready


@dataclass(frozen=True)
class Reporter:
    """The object the namespace Events are about: the operator's Lease (leader election), or its pod."""

    api_version: str
    kind: str
    namespace: str
    name: str


def reporter(lease: tuple[str, str] | None, pod: tuple[str, str] | None) -> Reporter | None:
    """The Lease ``(namespace, name)`` when the operator elects a leader, else its pod (``POD_NAMESPACE``,
    ``POD_NAME``) when it knows it; None: logged and counted only."""
    if lease is not None:
        return Reporter("coordination.k8s.io/v1", "Lease", *lease)
    if pod is not None and all(pod):
        return Reporter("v1", "Pod", *pod)
    return None


def event(about: Reporter, verdict: Health, now: datetime, component: str) -> dict[str, Any]:
    """A core/v1 Event on ``about`` saying ``verdict`` (Warning when the namespace is unavailable)."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{about.name}.", "namespace": about.namespace},
        "involvedObject": {
            "apiVersion": about.api_version,
            "kind": about.kind,
            "namespace": about.namespace,
            "name": about.name,
        },
        "reason": verdict.reason,
        "message": verdict.message,
        "type": "Normal" if verdict.ready else "Warning",
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
