"""Leader election, without a cluster: the decision table, the settings, and the loops on a fake Lease."""

from __future__ import annotations

import asyncio
import copy
import os
import socket
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from prometheus_client import REGISTRY

from mlbench_operator import elector as el
from mlbench_operator import leader, leaderprobe, leadersettings, leaseapi
from mlbench_operator import leasedecision as ld
from mlbench_operator.env import SettingsError

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
S = leadersettings.LeaderSettings(identity="me", lease_duration=15, renew_deadline=10, retry_period=2)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def record(holder: str, renewed: datetime = T0, duration: int = 15, transitions: int = 3) -> ld.LeaseRecord:
    return ld.LeaseRecord(
        holder=holder,
        lease_duration_seconds=duration,
        acquire_time=ld.micro_time(T0 - timedelta(hours=1)),
        renew_time=ld.micro_time(renewed),
        transitions=transitions,
        resource_version="42",
    )


def seen(rec: ld.LeaseRecord, since: float) -> ld.Observed:
    return ld.Observed(rec, at(since))


# -- the decision table -------------------------------------------------------------------------------
NOW = 100.0
CASES: list[tuple[str, ld.Observed | None, ld.Action, str]] = [
    ("free: no Lease yet", None, ld.Action.ACQUIRE, "no-lease"),
    ("held by me", seen(record("me"), NOW - 1), ld.Action.RENEW, "held-by-me"),
    ("held by me, unrenewed past its duration", seen(record("me"), NOW - 60), ld.Action.RENEW, "held-by-me"),
    ("held by other, fresh", seen(record("other"), NOW - 5), ld.Action.STANDBY, "held-by-other"),
    ("held by other, just short of expiry", seen(record("other"), NOW - 14.999), ld.Action.STANDBY, "held-by-other"),
    ("held by other, expired (exactly)", seen(record("other"), NOW - 15), ld.Action.ACQUIRE, "expired"),
    ("held by other, expired", seen(record("other"), NOW - 16), ld.Action.ACQUIRE, "expired"),
    (
        "held by other with a longer lease",
        seen(record("other", duration=60), NOW - 30),
        ld.Action.STANDBY,
        "held-by-other",
    ),
    ("released (no holder)", seen(record(""), NOW), ld.Action.ACQUIRE, "released"),
    ("released, as client-go writes it (1 s)", seen(record("", duration=1), NOW), ld.Action.ACQUIRE, "released"),
    # clock skew: the holder's renewTime is never compared with our clock, only our own observations are
    (
        "skew: holder's clock 1 h ahead, unchanged for 16 s",
        seen(record("other", renewed=at(NOW + 3600)), NOW - 16),
        ld.Action.ACQUIRE,
        "expired",
    ),
    (
        "skew: holder's clock 1 h behind, just renewed",
        seen(record("other", renewed=at(NOW - 3600)), NOW - 1),
        ld.Action.STANDBY,
        "held-by-other",
    ),
]


@pytest.mark.parametrize(("observed", "action", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(observed: ld.Observed | None, action: ld.Action, reason: str) -> None:
    now = at(NOW)
    d = ld.decide(observed, "me", now, S)
    assert (d.action, d.reason) == (action, reason)
    stamp = ld.micro_time(now)
    if action is ld.Action.STANDBY:
        assert d.spec is None
        assert d.holder == "other"
        return
    assert d.spec is not None
    assert d.spec["holderIdentity"] == "me"
    assert d.spec["leaseDurationSeconds"] == 15  # ours, whatever the previous holder wrote
    assert d.spec["renewTime"] == stamp
    if observed is None:
        assert d.create
        assert d.spec == {**d.spec, "acquireTime": stamp, "leaseTransitions": 0}
        return
    assert not d.create
    assert d.resource_version == "42"  # optimistic concurrency: the write is at the version read
    if action is ld.Action.RENEW:  # acquireTime and transitions kept
        assert d.spec["acquireTime"] == observed.record.acquire_time
        assert d.spec["leaseTransitions"] == 3
    else:  # a new term
        assert d.spec["acquireTime"] == stamp
        assert d.spec["leaseTransitions"] == 4
        assert d.holder == observed.record.holder


def test_micro_time() -> None:
    assert ld.micro_time(datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC)) == "2025-01-02T03:04:05.000006Z"
    plus_two = datetime(2025, 1, 2, 5, 4, 5, tzinfo=UTC).astimezone(timezone(timedelta(hours=2)))
    assert ld.micro_time(plus_two) == "2025-01-02T05:04:05.000000Z"


def test_observe_moves_only_on_a_change() -> None:
    first = ld.observe(None, record("other"), at(0))
    assert first.since == at(0)
    same = ld.observe(first, replace(record("other"), resource_version="43"), at(10))
    assert same.since == at(0)  # unchanged record: still counting from the first sight
    assert same.record.resource_version == "43"
    renewed = ld.observe(same, record("other", renewed=at(12)), at(12))
    assert renewed.since == at(12)
    assert ld.expiry(renewed, S) == at(27)
    assert ld.expiry(ld.Observed(replace(record("x"), lease_duration_seconds=0), at(0)), S) == at(15)


def test_record_from_lease() -> None:
    lease = {
        "metadata": {"name": "l", "resourceVersion": "7"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 4, "renewTime": "t", "leaseTransitions": 2},
    }
    assert ld.LeaseRecord.from_lease(lease) == ld.LeaseRecord("a", 4, None, "t", 2, "7")
    assert ld.LeaseRecord.from_lease({"metadata": {}}) == ld.LeaseRecord()  # a Lease with no spec: free


def test_release_spec() -> None:
    mine = seen(record("me"), 0)
    assert ld.release_spec(mine, "me", at(5)) == {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": ld.micro_time(at(5)),
        "renewTime": ld.micro_time(at(5)),
        "leaseTransitions": 3,
    }
    assert ld.release_spec(seen(record("other"), 0), "me", at(5)) is None
    assert ld.release_spec(None, "me", at(5)) is None


# -- settings -----------------------------------------------------------------------------------------
def test_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "host")
    s = leadersettings.LeaderSettings.from_env({})
    assert s == leadersettings.LeaderSettings(
        enabled=True,
        name="mlbench-operator",
        namespace="mlbench-system",
        identity=f"host_{os.getpid()}",
        lease_duration=15,
        renew_deadline=10.0,
        retry_period=2.0,
    )


def test_settings_from_env() -> None:
    env = {
        "MLBENCH_LEADER_ELECT": "false",
        "MLBENCH_LEADER_ELECTION_ID": "op-abc",
        "POD_NAMESPACE": "ops",
        "POD_NAME": "mlbench-operator-7d9-x2",
        "MLBENCH_LEADER_ELECTION_LEASE_DURATION_SECONDS": "4",
        "MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS": "3",
        "MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS": "0.5",
    }
    s = leadersettings.LeaderSettings.from_env(env)
    assert s == leadersettings.LeaderSettings(False, "op-abc", "ops", "mlbench-operator-7d9-x2", 4, 3.0, 0.5)
    # the explicit namespace wins over the pod's; the --[no-]leader-elect flag wins over the environment
    s = leadersettings.LeaderSettings.from_env({**env, "MLBENCH_LEADER_ELECTION_NAMESPACE": "elsewhere"}, enabled=True)
    assert (s.enabled, s.namespace) == (True, "elsewhere")
    assert not leadersettings.LeaderSettings.from_env({"MLBENCH_LEADER_ELECT": " OFF "}).enabled
    assert leadersettings.LeaderSettings.from_env({"MLBENCH_LEADER_ELECT": "yes"}).enabled


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MLBENCH_LEADER_ELECT": "maybe"}, "MLBENCH_LEADER_ELECT="),
        ({"MLBENCH_LEADER_ELECTION_ID": "Not_A_Name"}, "MLBENCH_LEADER_ELECTION_ID="),
        ({"MLBENCH_LEADER_ELECTION_NAMESPACE": "a.b"}, "MLBENCH_LEADER_ELECTION_NAMESPACE="),
        ({"POD_NAMESPACE": "-x"}, "POD_NAMESPACE="),
        ({"MLBENCH_LEADER_ELECTION_LEASE_DURATION_SECONDS": "1.5"}, "LEASE_DURATION_SECONDS='1.5' is not a whole"),
        ({"MLBENCH_LEADER_ELECTION_LEASE_DURATION_SECONDS": "0"}, "LEASE_DURATION_SECONDS='0' must be greater than 0"),
        ({"MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS": "soon"}, "RENEW_DEADLINE_SECONDS='soon' is not a number"),
        ({"MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS": "-1"}, "RETRY_PERIOD_SECONDS='-1' must be greater"),
        ({"MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS": "nan"}, "RETRY_PERIOD_SECONDS='nan' must be greater"),
        (
            {"MLBENCH_LEADER_ELECTION_LEASE_DURATION_SECONDS": "10"},
            "LEASE_DURATION_SECONDS=10 must be greater than MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS=10",
        ),
        (
            {"MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS": "9"},
            "RENEW_DEADLINE_SECONDS=10 must be greater than 1.2 x MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS=9",
        ),
    ],
)
def test_settings_errors_name_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=None) as err:
        leadersettings.LeaderSettings.from_env(env)
    assert named in str(err.value)


def test_bad_setting_stops_the_operator_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlbench_operator import main

    monkeypatch.setenv("MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS", "zero")
    monkeypatch.setenv("MLBENCH_METRICS_PORT", "0")
    monkeypatch.setenv("MLBENCH_RUN_SELECTOR", "")
    assert main.main(["--metrics-port=0", "--liveness="]) == 2
    assert "MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS='zero'" in capsys.readouterr().err


def test_leader_elect_flag() -> None:
    from mlbench_operator import main

    assert main.parse_args([]).leader_elect is None  # from the environment (default on)
    assert main.parse_args(["--no-leader-elect"]).leader_elect is False
    assert main.parse_args(["--leader-elect"]).leader_elect is True


# -- the loops on a fake Lease ------------------------------------------------------------------------
class FakeLeases:
    """One Lease with the API server's optimistic concurrency (create: 409 when it exists; update: 409
    when the resourceVersion is stale)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.lock = threading.Lock()
        self.down = False
        self.barrier: threading.Barrier | None = None
        self.writes = 0

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("the API server is down")

    def get(self) -> dict[str, Any] | None:
        self._check()
        with self.lock:
            snapshot = copy.deepcopy(self.lease)
        if self.barrier is not None:
            self.barrier.wait(5)  # both replicas read before either writes
        return snapshot

    def _store(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.writes += 1
        self.lease = {"metadata": {"name": "l", "resourceVersion": str(self.version)}, "spec": dict(spec)}
        return copy.deepcopy(self.lease)

    def create(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        self._check()
        with self.lock:
            return None if self.lease is not None else self._store(spec)

    def update(self, spec: dict[str, Any], resource_version: str) -> dict[str, Any] | None:
        self._check()
        with self.lock:
            if self.lease is None or self.lease["metadata"]["resourceVersion"] != resource_version:
                return None
            return self._store(spec)

    def close(self) -> None:
        pass

    @property
    def holder(self) -> str | None:
        return None if self.lease is None else self.lease["spec"]["holderIdentity"]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> datetime:
        return at(self.t)


def elector(leases: FakeLeases, identity: str, clock: Clock, **durations: float) -> el.Elector:
    settings = replace(S, identity=identity, **durations)  # type: ignore[arg-type]
    return el.Elector(leases, settings, clock=clock, jitter=lambda: 0.0)


def gauge() -> float | None:
    return REGISTRY.get_sample_value("mlbench_operator_leader")


def test_one_of_two_acquires_then_the_standby_waits_for_expiry() -> None:
    leases, clock = FakeLeases(), Clock()
    a, b = elector(leases, "a", clock), elector(leases, "b", clock)

    async def scenario() -> None:
        assert (await a.try_acquire_or_renew()).action is ld.Action.ACQUIRE
        assert (await b.try_acquire_or_renew()).action is ld.Action.STANDBY
        clock.t = 10
        assert (await a.try_acquire_or_renew()).action is ld.Action.RENEW  # a renews: b counts afresh
        clock.t = 20
        assert (await b.try_acquire_or_renew()).action is ld.Action.STANDBY
        clock.t = 24.9  # a stopped renewing at 10; b saw that record at 20 and waits a full lease from then
        assert (await b.try_acquire_or_renew()).action is ld.Action.STANDBY
        clock.t = 35
        d = await b.try_acquire_or_renew()
        assert (d.action, d.reason, d.holder) == (ld.Action.ACQUIRE, "expired", "a")
        assert leases.holder == "b"
        assert leases.lease is not None
        assert leases.lease["spec"]["leaseTransitions"] == 1
        # a comes back: the Lease is b's now
        assert (await a.try_acquire_or_renew()).action is ld.Action.STANDBY

    asyncio.run(scenario())


def test_simultaneous_writes_one_wins_the_other_gets_a_conflict() -> None:
    for start in ("create", "update"):
        leases, clock = FakeLeases(), Clock()
        if start == "update":  # a released Lease both may take
            leases._store({"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 5})
        a, b = elector(leases, "a", clock), elector(leases, "b", clock)
        leases.barrier = threading.Barrier(2)

        async def both(a: el.Elector = a, b: el.Elector = b) -> list[ld.Decision]:
            return list(await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew()))

        decisions = asyncio.run(both())
        assert sorted(d.action for d in decisions) == [ld.Action.ACQUIRE, ld.Action.STANDBY], start
        assert [d.reason for d in decisions if d.action is ld.Action.STANDBY] == ["conflict"]
        winner = next(e for e, d in zip((a, b), decisions, strict=True) if d.action is ld.Action.ACQUIRE)
        assert leases.holder == winner.identity
        assert leases.writes == (1 if start == "create" else 2)


def test_acquire_renew_release_and_the_gauge() -> None:
    leases = FakeLeases()
    fast = {"lease_duration": 2, "renew_deadline": 0.5, "retry_period": 0.05}
    a = el.Elector(leases, replace(S, identity="a", **fast))  # type: ignore[arg-type]
    b = el.Elector(leases, replace(S, identity="b", **fast))  # type: ignore[arg-type]

    async def scenario() -> None:
        stop = asyncio.Event()
        assert await a.acquire(stop)
        assert gauge() == 1
        b_task = asyncio.create_task(b.acquire(asyncio.Event()))
        renew = asyncio.create_task(a.renew(stop, lambda: None))
        await asyncio.sleep(0.3)
        assert not b_task.done()  # a renews: b stands by
        assert leases.lease is not None
        assert leases.writes >= 2  # acquired, renewed
        stop.set()
        await renew
        assert not a.lost
        assert await a.release()
        assert leases.holder == ""
        assert await asyncio.wait_for(b_task, 1)  # released: b takes over at once, not after 2 s
        assert leases.holder == "b"
        assert not await a.release()  # not leading: nothing to release

    asyncio.run(scenario())


def test_renewals_failing_past_the_deadline_lose_the_lease() -> None:
    leases = FakeLeases()
    a = el.Elector(leases, replace(S, identity="a", lease_duration=2, renew_deadline=0.3, retry_period=0.05))
    lost: list[bool] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        assert await a.acquire(stop)
        leases.down = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(a.renew(stop, lambda: lost.append(True)), 2)
        assert 0.25 <= loop.time() - started < 2.0
        assert stop.is_set()  # kopf is told to stop

    asyncio.run(scenario())
    assert a.lost
    assert lost == [True]
    assert gauge() == 0


def test_a_lease_taken_by_another_is_lost_at_once() -> None:
    leases = FakeLeases()
    a = el.Elector(leases, replace(S, identity="a", lease_duration=20, renew_deadline=10, retry_period=0.05))

    async def scenario() -> None:
        stop = asyncio.Event()
        assert await a.acquire(stop)
        assert leases.lease is not None
        leases._store({**leases.lease["spec"], "holderIdentity": "intruder"})
        await asyncio.wait_for(a.renew(stop, lambda: None), 1)  # well before the 10 s renew deadline

    asyncio.run(scenario())
    assert a.lost
    assert leases.holder == "intruder"


@pytest.mark.parametrize("outcome", ["stopped", "lost", "standby"])
def test_run_elected(outcome: str) -> None:
    leases = FakeLeases()
    if outcome == "standby":
        leases._store({"holderIdentity": "other", "leaseDurationSeconds": 30, "leaseTransitions": 0})
    settings = replace(S, identity="me", lease_duration=3, renew_deadline=0.3, retry_period=0.05)
    ran: list[str] = []

    async def operator(stop: asyncio.Event) -> None:
        ran.append("kopf")
        if outcome == "lost":
            leases.down = True
            await asyncio.wait_for(stop.wait(), 2)  # the renew loop stops kopf
            leases.down = False
        else:
            await asyncio.sleep(0.2)  # kopf returns, as after a SIGTERM

    async def scenario() -> int:
        stop = asyncio.Event()
        if outcome == "standby":  # SIGTERM while standing by
            asyncio.get_running_loop().call_later(0.3, stop.set)
        return await leader.run_elected(operator, settings, client=leases, stop=stop)

    code = asyncio.run(scenario())
    if outcome == "stopped":
        assert (code, ran, leases.holder) == (0, ["kopf"], "")  # released
    elif outcome == "lost":
        assert (code, ran, leases.holder) == (1, ["kopf"], "me")  # not released: it was not ours to trust
    else:
        assert (code, ran, leases.holder) == (0, [], "other")


# -- a Lease namespace that does not exist (issue 33) -------------------------------------------------------------
class _Response:
    def __init__(self, status: int, body: str) -> None:
        self.status, self.body = status, body

    def read(self) -> bytes:
        return self.body.encode()


NOT_FOUND = (
    '{"kind":"Status","status":"Failure","message":"namespaces \\"mlbench-system\\" not found",'
    '"reason":"NotFound","details":{"name":"mlbench-system","kind":"namespaces"},"code":404}'
)


def _lease_api(monkeypatch: pytest.MonkeyPatch, answer: Any) -> leaseapi.LeaseApi:
    """A LeaseApi whose transport answers ``answer`` (a response, or the client's ApiException raised)."""
    from kubernetes import client as k8s

    api = leaseapi.LeaseApi("mlbench-system", "mlbench-operator", 5, configuration=k8s.Configuration())

    def call_api(*_args: Any, **_kw: Any) -> Any:
        if isinstance(answer, BaseException):
            raise answer
        return answer

    monkeypatch.setattr(api.api, "call_api", call_api)
    return api


@pytest.mark.parametrize("raised", [False, True], ids=["response", "ApiException"])
def test_a_lease_create_answered_404_names_the_missing_namespace(monkeypatch: pytest.MonkeyPatch, raised: bool) -> None:
    """A 404 on create is not a lost race (409): the namespace is missing, and the error says which."""
    from kubernetes import client as k8s

    answer: Any = (
        k8s.ApiException(status=404, reason="Not Found", body=NOT_FOUND) if raised else _Response(404, NOT_FOUND)
    )
    api = _lease_api(monkeypatch, answer)
    assert api.get() is None  # a GET's 404: no Lease yet, as before
    with pytest.raises(leaseapi.LeaseNamespaceMissing, match="namespace 'mlbench-system' does not exist") as err:
        api.create({"holderIdentity": "me"})
    assert isinstance(err.value, SettingsError)
    assert "MLBENCH_LEADER_ELECTION_NAMESPACE" in str(err.value)


@pytest.mark.parametrize("raised", [False, True], ids=["response", "ApiException"])
def test_a_lease_create_answered_409_is_still_a_lost_race(monkeypatch: pytest.MonkeyPatch, raised: bool) -> None:
    from kubernetes import client as k8s

    body = '{"kind":"Status","reason":"AlreadyExists","code":409}'
    answer: Any = k8s.ApiException(status=409, reason="Conflict", body=body) if raised else _Response(409, body)
    assert _lease_api(monkeypatch, answer).create({"holderIdentity": "me"}) is None


def test_other_lease_errors_are_raised_with_their_status(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client as k8s

    from mlbench_operator.kube import ApiError

    api = _lease_api(monkeypatch, k8s.ApiException(status=403, reason="Forbidden", body='{"message": "no"}'))
    with pytest.raises(ApiError) as err:
        api.create({"holderIdentity": "me"})
    assert err.value.status == 403


class _NoNamespace(FakeLeases):
    def create(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        self.writes += 1
        raise leaseapi.LeaseNamespaceMissing("mlbench-system")


def test_a_missing_lease_namespace_stops_the_operator_instead_of_standing_by() -> None:
    """Issue 33: started where mlbench-system does not exist, the operator reconciled nothing and said nothing
    (the 404 read as "another replica holds it"). Now run_elected raises the named error at the first try."""
    leases = _NoNamespace()
    settings = replace(S, retry_period=0.01)
    ran: list[str] = []

    async def operator(stop: asyncio.Event) -> None:
        ran.append("kopf")

    async def scenario() -> int:
        return await asyncio.wait_for(leader.run_elected(operator, settings, client=leases), 5)

    with pytest.raises(leaseapi.LeaseNamespaceMissing, match="'mlbench-system'"):
        asyncio.run(scenario())
    assert ran == []
    assert leases.writes == 1  # not retried in a loop


def test_main_exits_2_naming_the_namespace(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from mlbench_operator import main as entry

    async def refused(*_args: Any, **_kw: Any) -> int:
        raise leaseapi.LeaseNamespaceMissing("mlbench-system")

    monkeypatch.setattr(entry.leader, "run_elected", refused)
    monkeypatch.setattr(entry, "start_http_server", lambda *_: None)
    assert entry.main(["--metrics-port", "0"]) == 2
    assert "namespace 'mlbench-system' does not exist" in capsys.readouterr().err


def test_a_standby_says_whom_it_waits_for_and_until_when(caplog: pytest.LogCaptureFixture) -> None:
    leases, clock = FakeLeases(), Clock()
    leases._store({"holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": ld.micro_time(at(0))})
    b = elector(leases, "b", clock)
    with caplog.at_level("INFO", logger="mlbench_operator.leader"):
        assert asyncio.run(b.try_acquire_or_renew()).action is ld.Action.STANDBY
    (record,) = [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == "leader_standby"]
    assert record["holder"] == "other"
    assert record["lease"] == "mlbench-system/mlbench-operator"
    assert record["expires"] == ld.micro_time(at(15))  # the holder's claim, unless it renews


@pytest.mark.parametrize(
    ("reported", "holder", "seconds", "due"),
    [
        (None, "other", 0, True),  # the first attempt
        (("other", 0), "other", 2, False),  # the next attempt, 2 s on: quiet
        (("other", 0), "other", 59.9, False),
        (("other", 0), "other", 60, True),  # once a minute
        (("other", 0), "third", 2, True),  # a new holder: at once
    ],
)
def test_standby_report_due(reported: tuple[str, float] | None, holder: str, seconds: float, due: bool) -> None:
    last = None if reported is None else (reported[0], at(reported[1]))
    assert el.standby_report_due(last, holder, at(seconds)) is due


def _waiting_for(holder: str) -> float | None:
    return REGISTRY.get_sample_value("mlbench_operator_leader_waiting_for", {"holder": holder})


def test_a_standby_reports_the_holder_and_its_renew_time_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 33: a standby says whom it waits for (log, rate-limited; a gauge at every attempt) and when that
    holder last renewed; the gauge goes once this replica leads."""
    leases, clock = FakeLeases(), Clock()
    leases._store({"holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": ld.micro_time(at(0))})
    b = elector(leases, "b", clock)

    def standby_logs() -> list[dict[str, Any]]:
        return [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == "leader_standby"]

    async def renewed_by_other(t: float) -> None:
        clock.t = t
        leases._store({"holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": ld.micro_time(at(t))})
        assert (await b.try_acquire_or_renew()).action is ld.Action.STANDBY

    async def scenario() -> None:
        for t in (0, 2, 4, 30, 61):
            await renewed_by_other(t)

    with caplog.at_level("INFO", logger="mlbench_operator.leader"):
        asyncio.run(scenario())
    logged = standby_logs()
    assert [r["renew_time"] for r in logged] == [ld.micro_time(at(0)), ld.micro_time(at(61))]
    assert {r["holder"] for r in logged} == {"other"}
    assert _waiting_for("other") == at(61).timestamp()  # the last attempt's renewTime, not the last log's
    clock.t = 200  # the holder stopped renewing: b takes over, and waits for no one
    assert asyncio.run(b.acquire(asyncio.Event())) is True
    assert _waiting_for("other") is None


@pytest.mark.parametrize(
    ("since", "now", "alive"),
    [(None, 1e6, True), (100.0, 399.0, True), (100.0, 400.0, True), (100.0, 401.0, False)],
    ids=["standing by", "syncing", "at the limit", "sync too long"],
)
def test_syncing_verdict(since: float | None, now: float, alive: bool) -> None:
    assert (leaderprobe.syncing_verdict(since, now, limit=300.0) is None) is alive


def test_the_probe_is_answered_through_the_first_sync_until_handed_over() -> None:
    """Issue 33: kopf serves /healthz only after its startup handlers (the first pod listing). The standby's
    endpoint used to stop as soon as the Lease was taken: a slow first sync failed the probe. Now it answers
    (leader: true) until the startup handler stops it, and the stopper is safe to call twice."""
    import json as js
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/healthz"
    leases = FakeLeases()
    settings = replace(S, identity="me", lease_duration=3, renew_deadline=0.3, retry_period=0.05)
    handed: list[Any] = []
    answers: list[Any] = []

    def probe() -> Any:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return js.loads(resp.read())
        except OSError as err:
            return type(err).__name__

    async def operator(stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        answers.append(await loop.run_in_executor(None, probe))  # kopf's first sync: still answered
        await handed[0]()  # the startup handler's handover
        answers.append(await loop.run_in_executor(None, probe))  # the port is free for kopf

    code = asyncio.run(leader.run_elected(operator, settings, url, client=leases, handover=handed.append))
    assert code == 0
    assert answers[0] == {"leader": True, "holder": None, "lease": "mlbench-system/mlbench-operator"}
    assert answers[1] == "URLError"
