"""The namespaced install's verdicts on its namespaces (:mod:`mlbench_operator.nsready`) and the gate that follows
them (:mod:`mlbench_operator.nsgate`): kopf watches only the readable namespaces, and each turn is said once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from mlbench_operator import nsready as r
from mlbench_operator.kube import ApiError
from mlbench_operator.nsgate import NamespaceGate


@pytest.mark.parametrize(
    ("synced", "error", "waited", "ready", "says"),
    [
        (True, None, 0.0, True, "is served"),
        (True, None, 999.0, True, "is served"),
        (False, None, 0.0, None, None),  # no answer yet, inside the bound: wait
        (False, None, 29.9, None, None),
        (False, None, 30.0, False, "not listed within 30 s (no answer)"),
        (False, 0, 31.0, False, "no answer"),
        (False, 500, 5.0, None, None),  # a server error inside the bound: retried
        (False, 500, 30.0, False, "HTTP 500"),
        (False, 403, 0.0, False, "RoleBinding"),  # a refusal is a verdict at once
        (True, 403, 0.0, False, "RoleBinding"),  # listed once, refused since (the RoleBinding deleted)
        (False, 401, 0.0, False, "HTTP 401"),
        (True, 404, 0.0, False, "does not exist"),
        (True, 0, 10.0, None, None),  # listed once, a lost watch: retried inside the bound
    ],
)
def test_health(synced: bool, error: int | None, waited: float, ready: bool | None, says: str | None) -> None:
    """A namespace's first sync (not served yet): the bound applies."""
    _check(r.health("team-b", synced, error, waited, 30.0, served=False), ready, says)


@pytest.mark.parametrize(
    ("synced", "error", "waited", "ready", "says"),
    [
        (True, None, 0.0, True, "is served"),
        # an API server that does not answer or fails (an outage, a restart) fails every namespace alike: the
        # namespace stays served however long it lasts (no verdict), as the operator's other namespaces do
        (True, 0, 31.0, None, None),
        (True, 0, 3600.0, None, None),
        (True, 500, 600.0, None, None),
        (True, 503, 31.0, None, None),
        (True, 429, 31.0, None, None),
        (False, 0, 600.0, None, None),
        # only a refusal un-serves it, at once: the RoleBinding deleted, the namespace gone
        (True, 403, 0.0, False, "RoleBinding"),
        (True, 401, 0.0, False, "HTTP 401"),
        (True, 404, 0.0, False, "does not exist"),
    ],
)
def test_health_of_a_served_namespace(
    synced: bool, error: int | None, waited: float, ready: bool | None, says: str | None
) -> None:
    """Issue 33: an API-server outage longer than the bound (30 s) un-served every namespace until it answered."""
    _check(r.health("team-b", synced, error, waited, 30.0, served=True), ready, says)


def _check(verdict: r.Health | None, ready: bool | None, says: str | None) -> None:
    if ready is None:
        assert verdict is None
        return
    assert verdict is not None
    assert verdict.ready is ready
    assert verdict.reason == (r.AVAILABLE if ready else r.UNAVAILABLE)
    assert says is not None
    assert says in verdict.message
    assert "team-b" in verdict.message


def _h(ns: str, ready: bool) -> r.Health:
    return r.Health(ns, ready, r.AVAILABLE if ready else r.UNAVAILABLE, "")


@pytest.mark.parametrize(
    ("current", "verdicts", "wanted"),
    [
        (set(), {"a": _h("a", True), "b": _h("b", False)}, {"a"}),
        ({"a", "b"}, {"a": _h("a", True), "b": _h("b", False)}, {"a"}),  # b lost: kopf stops watching it
        ({"a"}, {"a": _h("a", True), "b": _h("b", True)}, {"a", "b"}),  # b back
        ({"a"}, {"a": None, "b": None}, {"a"}),  # no verdict: each keeps its place
        (set(), {"a": None}, set()),
    ],
)
def test_served(current: set[str], verdicts: dict[str, r.Health | None], wanted: set[str]) -> None:
    assert r.served(frozenset(current), verdicts) == wanted


@pytest.mark.parametrize(
    ("before", "after", "news"),
    [
        (None, None, False),
        (None, _h("a", True), False),  # the normal start says nothing
        (None, _h("a", False), True),
        (_h("a", True), _h("a", False), True),
        (_h("a", False), _h("a", True), True),
        (_h("a", False), _h("a", False), False),  # said once, not every tick
        (_h("a", True), None, False),
    ],
)
def test_changed(before: r.Health | None, after: r.Health | None, news: bool) -> None:
    assert r.changed(before, after) is news


def test_reporter_and_event() -> None:
    assert r.reporter(("mlbench-system", "mlbench-operator"), ("mlbench-system", "op-0")) == r.Reporter(
        "coordination.k8s.io/v1", "Lease", "mlbench-system", "mlbench-operator"
    )
    assert r.reporter(None, ("mlbench-system", "op-0")) == r.Reporter("v1", "Pod", "mlbench-system", "op-0")
    assert r.reporter(None, ("", "")) is None
    about = r.Reporter("coordination.k8s.io/v1", "Lease", "mlbench-system", "mlbench-operator")
    verdict = r.health("team-b", False, 403, 0.0, 30.0, served=False)
    assert verdict is not None
    ev = r.event(about, verdict, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "mlbench-operator")
    assert ev["metadata"] == {"generateName": "mlbench-operator.", "namespace": "mlbench-system"}
    assert ev["involvedObject"]["kind"] == "Lease"
    assert (ev["type"], ev["reason"]) == ("Warning", r.UNAVAILABLE)
    assert "team-b" in ev["message"]
    assert ev["lastTimestamp"] == "2026-01-02T03:04:05Z"


# -- the gate (glue), with stand-ins for the pod watches, kopf's Insights and the API ------------------------------
class _Watch:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.synced = asyncio.Event()
        self.error: int | None = None


class _Insights:
    def __init__(self) -> None:
        self.namespaces: set[str] = set()
        self.revised = asyncio.Condition()
        self.revisions = 0

    async def notify(self) -> None:
        self.revisions += 1


class _Kube:
    """Records Events; ``refused`` namespaces answer the probe with 403; every probe fails with ``failing`` (an
    outage: an ApiError or no answer) while it is set."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.refused: set[str] = set()
        self.failing: Exception | None = None

    async def run(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    def post_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def probe_runs(self, namespace: str) -> None:
        if self.failing is not None:
            raise self.failing
        if namespace in self.refused:
            raise ApiError(403, "GET", namespace, "forbidden")


def test_the_gate_serves_the_readable_namespaces_and_says_each_turn_once() -> None:
    async def scenario() -> None:
        now = [0.0]
        a, b = _Watch("a"), _Watch("b")
        kube, insights = _Kube(), _Insights()
        about = r.Reporter("coordination.k8s.io/v1", "Lease", "mlbench-system", "op")
        gate = NamespaceGate(kube, [a, b], insights, about, 30.0, clock=lambda: now[0])  # type: ignore[arg-type]
        a.synced.set()
        b.error = 403  # its RoleBinding is missing
        await gate.settle()  # at once: both have a verdict
        assert insights.namespaces == {"a"}
        assert [(e["reason"], "b" in e["message"]) for e in kube.events] == [(r.UNAVAILABLE, True)]
        await gate.step()
        assert len(kube.events) == 1  # said once
        b.error, now[0] = None, 5.0  # the RoleBinding is back: the pod watch listed again
        b.synced.set()
        await gate.step()
        assert insights.namespaces == {"a", "b"}
        assert kube.events[-1]["reason"] == r.AVAILABLE
        kube.refused.add("b")  # deleted again; the pod watch has not noticed (its watch is still open)
        now[0] = 5.0 + r.PROBE_SECONDS
        await gate.step()
        assert insights.namespaces == {"a"}
        assert kube.events[-1]["reason"] == r.UNAVAILABLE

    asyncio.run(scenario())


def test_the_start_waits_for_a_silent_namespace_at_most_the_bound() -> None:
    async def scenario() -> None:
        now = [0.0]
        a, b = _Watch("a"), _Watch("b")  # b never answers
        gate = NamespaceGate(_Kube(), [a, b], _Insights(), None, 30.0, clock=lambda: now[0])  # type: ignore[arg-type]
        a.synced.set()
        await gate.step()
        assert not gate.settled()
        now[0] = 30.0
        await gate.step()
        assert gate.settled()
        assert gate.insights.namespaces == {"a"}

    asyncio.run(scenario())


@pytest.mark.parametrize("outage", [ApiError(503, "GET", "runs", "unavailable"), ConnectionRefusedError("refused")])
def test_an_api_server_outage_longer_than_the_bound_keeps_the_served_namespaces(outage: Exception) -> None:
    """Issue 33: the bound is for a namespace's first sync. A served namespace whose watch and probe fail (no answer,
    5xx) for longer stays served, and nothing is said; a refusal (403) still un-serves it at once."""

    async def scenario() -> None:
        now = [0.0]
        a, b = _Watch("a"), _Watch("b")  # b never answers: its first sync is bounded
        kube, insights = _Kube(), _Insights()
        about = r.Reporter("coordination.k8s.io/v1", "Lease", "mlbench-system", "op")
        gate = NamespaceGate(kube, [a, b], insights, about, 30.0, clock=lambda: now[0])  # type: ignore[arg-type]
        a.synced.set()
        await gate.step()
        now[0] = 30.0
        await gate.settle()
        assert insights.namespaces == {"a"}
        assert [e["reason"] for e in kube.events] == [r.UNAVAILABLE]  # b's
        kube.failing = outage  # the API server is down: the probe fails, the pod watch fails (no answer)
        a.error = 0
        for t in range(31, 31 + 10 * int(r.PROBE_SECONDS), 7):  # ten probes' worth: far past the bound
            now[0] = float(t)
            await gate.step()
            assert insights.namespaces == {"a"}, t
        assert [e["reason"] for e in kube.events] == [r.UNAVAILABLE]  # nothing said about a
        assert gate.verdicts["a"] is not None
        assert gate.verdicts["a"].ready
        kube.failing, a.error = None, None  # back: the pod watch listed again
        kube.refused.add("a")  # and then a's RoleBinding is deleted: a refusal un-serves at once
        now[0] += r.PROBE_SECONDS
        await gate.step()
        assert insights.namespaces == set()
        assert [e["reason"] for e in kube.events] == [r.UNAVAILABLE, r.UNAVAILABLE]

    asyncio.run(scenario())
