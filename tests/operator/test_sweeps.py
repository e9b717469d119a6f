"""BenchmarkSweeps, pure: which runs to create next and the sweep's status, as tables; and the thin glue
against a fake API (409s, refused creates, the status written once per change)."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mlbench_api.sweep import LABEL_SWEEP
from mlbench_operator import conditions as c
from mlbench_operator import runtime
from mlbench_operator.kube import ApiError
from mlbench_operator.sweep import handlers as sweep_handlers
from mlbench_operator.sweep import plan as sweep_plan
from mlbench_operator.sweep.plan import Observed, Problem, SweepReason

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
UID = "uid-sweep"
#: The 2 workers x 2 seeds study, in expansion order.
W1S1, W1S2, W2S1, W2S2 = "s-w1-s1", "s-w1-s2", "s-w2-s1", "s-w2-s2"
ALL = [W1S1, W1S2, W2S1, W2S2]


def sweep(
    max_concurrent: int = 2,
    policy: str = "Continue",
    status: dict[str, Any] | None = None,
    matrix: dict[str, Any] | None = None,
    **template: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkSweep",
        "metadata": {"name": "s", "namespace": "ns", "uid": UID, "generation": 1, "labels": {"team": "a"}},
        "spec": {
            "template": {"taskRef": {"name": "t"}, **template},
            "matrix": matrix if matrix is not None else {"workers": [1, 2], "seeds": [1, 2]},
            "maxConcurrent": max_concurrent,
            "failurePolicy": policy,
        },
    }
    if status is not None:
        body["status"] = status
    return body


def observed(**phases: str | None) -> dict[str, Observed]:
    """``w1s1="Running"`` -> the run s-w1-s1 exists in that phase (None: created, not admitted yet)."""
    out = {}
    for key, phase in phases.items():
        name = f"s-{key[:2]}-{key[2:]}"
        out[name] = Observed(name, phase)
    return out


def recorded(**phases: str | None) -> dict[str, Any]:
    """A previous status whose runs list holds these phases (the others not created)."""
    known = {f"s-{k[:2]}-{k[2:]}": v for k, v in phases.items()}
    return {"runs": [{"name": n, **({"phase": known[n]} if known.get(n) else {})} for n in ALL]}


def cond(status: dict[str, Any], type_: str) -> tuple[str, str]:
    found = c.get(status.get("conditions"), type_)
    assert found is not None, type_
    return found["status"], found["reason"]


def counts(status: dict[str, Any]) -> tuple[int, ...]:
    return tuple(status[k] for k in ("total", "pending", "running", "succeeded", "failed"))


# -- which runs are created, and the counts --------------------------------------------------------------------
@dataclass(frozen=True)
class Create:
    """One row: the sweep (maxConcurrent, failurePolicy), what its last status recorded, what exists now;
    then the runs to create and the counts after them (total, pending = not created, running = created and
    unfinished, succeeded, failed)."""

    max_concurrent: int
    policy: str
    previous: dict[str, str]
    exists: dict[str, str | None]
    create: list[str]
    counts: tuple[int, int, int, int, int]


CREATE_TABLE = {
    "first pass: the first two in order": Create(2, "Continue", {}, {}, [W1S1, W1S2], (4, 2, 2, 0, 0)),
    "one at a time": Create(1, "Continue", {}, {}, [W1S1], (4, 3, 1, 0, 0)),
    "all at once when allowed": Create(8, "Continue", {}, {}, ALL, (4, 0, 4, 0, 0)),
    "both slots taken": Create(2, "Continue", {}, {"w1s1": "Running", "w1s2": "Pending"}, [], (4, 2, 2, 0, 0)),
    "created, not admitted yet: holds a slot": Create(1, "Continue", {}, {"w1s1": None}, [], (4, 3, 1, 0, 0)),
    "a slot freed": Create(2, "Continue", {}, {"w1s1": "Succeeded", "w1s2": "Running"}, [W2S1], (4, 1, 2, 1, 0)),
    "a failure frees a slot too": Create(2, "Continue", {}, {"w1s1": "Failed"}, [W1S2, W2S1], (4, 1, 2, 0, 1)),
    "Stop: nothing after a failure": Create(2, "Stop", {}, {"w1s1": "Failed", "w1s2": "Running"}, [], (4, 2, 1, 0, 1)),
    "maxConcurrent lowered below what runs": Create(
        1, "Continue", {}, {"w1s1": "Running", "w1s2": "Starting", "w2s1": "Pending"}, [], (4, 1, 3, 0, 0)
    ),
    "a finished run deleted (TTL, by hand) is not created again": Create(
        1, "Continue", {"w1s1": "Succeeded"}, {}, [W1S2], (4, 2, 1, 1, 0)
    ),
    "a failed run deleted is not created again either": Create(
        1, "Continue", {"w1s1": "Failed"}, {}, [W1S2], (4, 2, 1, 0, 1)
    ),
    "an unfinished run deleted is created again": Create(
        1, "Continue", {"w1s1": "Running"}, {}, [W1S1], (4, 3, 1, 0, 0)
    ),
    "the last one": Create(
        2, "Continue", {"w1s1": "Succeeded", "w1s2": "Failed"}, {"w2s1": "Succeeded"}, [W2S2], (4, 0, 1, 2, 1)
    ),
}


@pytest.mark.parametrize("case", CREATE_TABLE.values(), ids=CREATE_TABLE.keys())
def test_what_is_created(case: Create) -> None:
    body = sweep(case.max_concurrent, case.policy, recorded(**case.previous))
    decision = sweep_plan.decide(body, observed(**case.exists), T0)
    assert [r.name for r in decision.create] == case.create
    assert counts(decision.status) == case.counts
    assert [e["name"] for e in decision.status["runs"]] == ALL
    assert not decision.finished


@dataclass(frozen=True)
class Kstatus:
    """One row: the failurePolicy and the runs that exist; then finished?, and Ready, Reconciling, Stalled."""

    policy: str
    exists: dict[str, str]
    finished: bool
    conditions: tuple[str, str, str]


KSTATUS_TABLE = {
    "progressing": Kstatus("Continue", {"w1s1": "Running"}, False, ("False", "True", "False")),
    "all succeeded": Kstatus(
        "Continue", dict.fromkeys(["w1s1", "w1s2", "w2s1", "w2s2"], "Succeeded"), True, ("True", "False", "False")
    ),
    "all finished, some failed: complete all the same": Kstatus(
        "Continue",
        {"w1s1": "Failed", "w1s2": "Succeeded", "w2s1": "Failed", "w2s2": "Succeeded"},
        True,
        ("True", "False", "False"),
    ),
    "Stop, failed, one still running": Kstatus(
        "Stop", {"w1s1": "Failed", "w1s2": "Running"}, False, ("False", "True", "True")
    ),
    "Stop, failed, none running: over": Kstatus(
        "Stop", {"w1s1": "Failed", "w1s2": "Succeeded"}, True, ("False", "False", "True")
    ),
}


@pytest.mark.parametrize("case", KSTATUS_TABLE.values(), ids=KSTATUS_TABLE.keys())
def test_kstatus_conditions(case: Kstatus) -> None:
    decision = sweep_plan.decide(sweep(2, case.policy), observed(**case.exists), T0)
    status = decision.status
    assert decision.finished is case.finished
    assert tuple(cond(status, t)[0] for t in (c.READY, c.RECONCILING, c.STALLED)) == case.conditions
    assert ("completionTime" in status) is case.finished
    if case.policy == "Stop":
        assert cond(status, c.STALLED)[1] == SweepReason.RUN_FAILED
        assert "failurePolicy is Stop" in status["message"]
    elif case.finished:
        assert cond(status, c.READY)[1] == SweepReason.COMPLETED
    else:
        assert cond(status, c.READY)[1] == SweepReason.PROGRESSING


def test_status_fields_and_phases() -> None:
    body = sweep(2)
    decision = sweep_plan.decide(body, observed(w1s1="Running"), T0)
    status = decision.status
    assert status["runs"] == [
        {"name": W1S1, "phase": "Running"},
        {"name": W1S2, "phase": "Pending"},  # created in this pass
        {"name": W2S1},
        {"name": W2S2},
    ]
    assert status["observedGeneration"] == 1
    assert status["startTime"] == "2026-01-01T12:00:00Z"
    assert status["message"] == "0/4 runs finished (0 succeeded, 0 failed), 2 running, 2 not created yet"
    # the next pass, later: startTime and the conditions' lastTransitionTime stay
    body["status"] = status
    later = sweep_plan.decide(body, observed(w1s1="Running", w1s2="Pending"), T0 + timedelta(minutes=5))
    assert later.status["startTime"] == status["startTime"]
    assert later.status["conditions"] == status["conditions"]
    assert runtime.status_patch(status, later.status) == {}
    assert later.events == []


def test_events_on_creation_failure_and_completion() -> None:
    decision = sweep_plan.decide(sweep(2), {}, T0)
    assert decision.events == []
    assert decision.created_events == {
        W1S1: ("Normal", "RunCreated", f"created run {W1S1} (1 of 4)"),
        W1S2: ("Normal", "RunCreated", f"created run {W1S2} (2 of 4)"),
    }
    body = sweep(2, status=decision.status)
    failed = sweep_plan.decide(body, observed(w1s1="Failed", w1s2="Running"), T0)
    assert ("Warning", "RunFailed", f"run {W1S1} failed") in failed.events
    body["status"] = failed.status
    again = sweep_plan.decide(body, observed(w1s1="Failed", w1s2="Running", w2s1="Pending"), T0)
    assert not [e for e in again.events if e[1] == "RunFailed"]  # once per failure
    done = sweep_plan.decide(body, observed(w1s1="Failed", w1s2="Succeeded", w2s1="Succeeded", w2s2="Succeeded"), T0)
    assert done.events[-1][:2] == ("Warning", "Completed")  # completed with a failure


def test_a_finished_sweep_stays_finished() -> None:
    body = sweep(2)
    body["status"] = {**sweep_plan.decide(body, {}, T0).status, "completionTime": "2026-01-01T13:00:00Z"}
    body["metadata"]["generation"] = 2
    decision = sweep_plan.decide(body, {}, T0)  # every run gone: none is created again
    assert decision.finished
    assert decision.create == []
    assert decision.status["observedGeneration"] == 2
    assert decision.status["completionTime"] == "2026-01-01T13:00:00Z"


def test_an_invalid_spec_stalls_and_creates_nothing() -> None:
    body = sweep(2, matrix={"backends": ["gloo", "nccl"]})  # what the CRD's CEL rules would refuse
    decision = sweep_plan.decide(body, {}, T0)
    assert decision.create == []
    assert decision.stalled
    assert not decision.finished
    assert cond(decision.status, c.STALLED) == ("True", SweepReason.INVALID_SPEC)
    assert cond(decision.status, c.READY) == ("False", SweepReason.INVALID_SPEC)
    assert "spec.matrix.backends" in decision.status["message"]
    assert [e[1] for e in decision.events] == ["InvalidSpec"]
    body["status"] = decision.status
    assert sweep_plan.decide(body, {}, T0).events == []  # said once


@pytest.mark.parametrize("reason", [SweepReason.NAME_CONFLICT, SweepReason.CREATE_FAILED])
def test_problems_stall_the_sweep_without_further_creates(reason: SweepReason) -> None:
    problems = {W1S1: Problem(reason, "the reason")}
    decision = sweep_plan.decide(sweep(2), observed(w1s2=None), T0, problems)
    assert decision.create == []
    assert decision.stalled
    assert cond(decision.status, c.STALLED) == ("True", reason)
    assert cond(decision.status, c.RECONCILING) == ("True", reason)
    assert decision.status["message"].startswith(f"cannot create run {W1S1}: the reason; ")
    assert counts(decision.status) == (4, 3, 1, 0, 0)
    assert [e[1] for e in decision.events] == [reason.value]
    body = sweep(2, status=decision.status)
    assert sweep_plan.decide(body, observed(w1s2="Running"), T0, problems).events == []  # not repeated


def test_observe_keeps_only_the_runs_this_sweep_controls() -> None:
    def run(name: str, uid: str, phase: str | None = None, deleting: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "ownerReferences": [{"uid": uid, "controller": True}]}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, **({"status": {"phase": phase}} if phase else {})}

    got = sweep_plan.observe(
        [run(W1S1, UID, "Running"), run(W1S2, "other"), run(W2S1, UID, deleting=True)],
        UID,
    )
    assert got == {W1S1: Observed(W1S1, "Running"), W2S1: Observed(W2S1, None, deleting=True)}


def _owned(name: str, uid: str = UID) -> dict[str, Any]:
    return {"metadata": {"name": name, "ownerReferences": [{"uid": uid, "controller": True}]}}


@pytest.mark.parametrize(
    ("the_sweep", "run", "deletable"),
    [
        pytest.param(None, _owned(W1S1), True, id="the sweep is gone"),
        pytest.param(sweep(status=recorded(w1s1="Succeeded")), _owned(W1S1), True, id="recorded succeeded"),
        pytest.param(sweep(status=recorded(w1s1="Failed")), _owned(W1S1), True, id="recorded failed"),
        pytest.param(sweep(status=recorded(w1s1="Running")), _owned(W1S1), False, id="still running in the status"),
        pytest.param(sweep(status=recorded()), _owned(W1S1), False, id="not in the status yet"),
        pytest.param(sweep(), _owned(W1S1), False, id="no status yet"),
        pytest.param(
            sweep(status={**recorded(w1s1="Running"), "completionTime": "2026-01-01T12:00:00Z"}),
            _owned(W1S1),
            True,
            id="the sweep has finished",
        ),
        pytest.param(sweep(status=recorded(w1s1="Running")), _owned(W1S1, "other"), True, id="another sweep's run"),
        pytest.param(sweep(status=recorded(w1s1="Running")), {"metadata": {"name": W1S1}}, True, id="no owner"),
    ],
)
def test_a_ttl_deletes_a_sweeps_run_only_once_the_sweep_recorded_its_end(
    the_sweep: dict[str, Any] | None, run: dict[str, Any], deletable: bool
) -> None:
    """Else the sweep would see an unfinished run disappear and create it again."""
    assert sweep_plan.outcome_recorded(the_sweep, run) is deletable


def test_run_objects_are_owned_by_the_sweep_and_carry_its_labels() -> None:
    body = sweep(2)
    (first, *_) = sweep_plan.decide(body, {}, T0).create
    obj = sweep_plan.run_object(body, first)
    assert obj["metadata"]["namespace"] == "ns"
    assert obj["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "mlbench.io/v1alpha1",
            "kind": "BenchmarkSweep",
            "name": "s",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert obj["metadata"]["labels"]["team"] == "a"
    assert obj["metadata"]["labels"][LABEL_SWEEP] == "s"
    assert obj["spec"]["workers"] == 1
    assert obj["spec"]["seed"] == 1


# -- the glue against a fake API ---------------------------------------------------------------------------------
class FakeKube:
    """The sweep reconciler's API calls; ``kube.run(fn, *args)`` calls fn inline."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.refuse: dict[str, ApiError] = {}
        self.patches: list[dict[str, Any]] = []
        self.selectors: list[str] = []
        self.versions: list[str] = []  # the resourceVersion each status patch was made at
        self.live: dict[str, Any] | None = None  # the sweep in the API server: status patches fenced by its version

    async def run(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    def list_runs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.selectors.append(selector)
        key, _, value = selector.partition("=")
        return [r for r in self.runs.values() if r["metadata"].get("labels", {}).get(key) == value]

    def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.runs.get(name)

    def create_run(self, obj: dict[str, Any]) -> bool:
        name = obj["metadata"]["name"]
        if name in self.refuse:
            raise self.refuse[name]
        if name in self.runs:
            return False
        self.runs[name] = copy.deepcopy(obj)
        return True

    def patch_sweep_status(self, namespace: str, name: str, status: dict[str, Any], resource_version: str = "") -> str:
        self.patches.append(status)
        self.versions.append(resource_version)
        if self.live is None:
            return ""
        meta = self.live["metadata"]
        if resource_version and resource_version != meta["resourceVersion"]:  # the API server's precondition
            raise ApiError(409, "PATCH", "/status", '{"reason": "Conflict"}')
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        self.live["status"] = {**self.live["status"], **status}
        return str(meta["resourceVersion"])

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert kind == "BenchmarkSweep"
        return None if self.live is None else copy.deepcopy(self.live)


def _reconciler(body: dict[str, Any], kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> Any:
    from mlbench_operator.sweep import handlers as sweep_handlers

    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(sweep_handlers.SweepReconciler, "event", lambda self, *e: events.append(e))
    rec = sweep_handlers.SweepReconciler(body, kube, runtime.DEFAULT_CONFIG)  # type: ignore[arg-type]
    setattr(rec, "events", events)  # noqa: B010 - a test-only attribute
    return rec


def test_the_reconciler_creates_owned_runs_and_writes_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    kube, body = FakeKube(), sweep(2)
    rec = _reconciler(body, kube, monkeypatch)
    assert asyncio.run(rec.step()) == rec.config.resync_seconds
    assert sorted(kube.runs) == [W1S1, W1S2]
    assert kube.selectors == [f"{LABEL_SWEEP}=s"]
    assert all(r["metadata"]["ownerReferences"][0]["uid"] == UID for r in kube.runs.values())
    assert counts(kube.patches[-1]) == (4, 2, 2, 0, 0)
    assert [e[:2] for e in rec.events] == [("Normal", "RunCreated")] * 2
    # nothing changed: nothing written, nothing created
    asyncio.run(rec.step())
    assert len(kube.patches) == 1
    assert sorted(kube.runs) == [W1S1, W1S2]
    # both finish: the next two; then they finish: done
    for name in (W1S1, W1S2):
        kube.runs[name]["status"] = {"phase": "Succeeded"}
    asyncio.run(rec.step())
    assert sorted(kube.runs) == ALL
    for name in (W2S1, W2S2):
        kube.runs[name]["status"] = {"phase": "Succeeded"}
    assert asyncio.run(rec.step()) is None  # the daemon stops
    assert counts(rec.status) == (4, 0, 0, 4, 0)
    assert "completionTime" in rec.status


def test_a_409_on_our_own_run_is_fine_and_on_anothers_a_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    kube, body = FakeKube(), sweep(2)
    # ours from an interrupted pass, without the label the list selects by: found by the GET after the 409
    mine = sweep_plan.run_object(body, sweep_plan.decide(body, {}, T0).create[0])
    del mine["metadata"]["labels"][LABEL_SWEEP]
    kube.runs[W1S1] = {**mine, "status": {"phase": "Running"}}
    kube.runs[W1S2] = {"metadata": {"name": W1S2, "labels": {}}, "spec": {}}  # someone else's
    rec = _reconciler(body, kube, monkeypatch)
    assert asyncio.run(rec.step()) == 30.0
    status = kube.patches[-1]
    assert cond(status, c.STALLED) == ("True", SweepReason.NAME_CONFLICT)
    assert status["message"].startswith(f"cannot create run {W1S2}: a BenchmarkRun of that name exists")
    assert {"name": W1S1, "phase": "Running"} in status["runs"]
    assert rec.events == [("Warning", "NameConflict", status["message"])]  # W1S1 existed: not created now


@pytest.mark.parametrize("code", [403, 422])
def test_a_refused_create_is_a_condition(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    kube, body = FakeKube(), sweep(1)
    kube.refuse[W1S1] = ApiError(code, "POST", "/benchmarkruns", '{"message": "exceeded quota: count/benchmarkruns"}')
    rec = _reconciler(body, kube, monkeypatch)
    asyncio.run(rec.step())
    status = kube.patches[-1]
    assert cond(status, c.STALLED) == ("True", SweepReason.CREATE_FAILED)
    assert f"HTTP {code}: exceeded quota" in status["message"]
    assert status["pending"] == 4
    # the quota lifted: created on a later pass
    del kube.refuse[W1S1]
    asyncio.run(rec.step())
    assert list(kube.runs) == [W1S1]
    assert cond(kube.patches[-1], c.STALLED) == ("False", SweepReason.PROGRESSING)


def test_another_error_raises_for_the_daemons_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import kopf

    kube, body = FakeKube(), sweep(1)
    kube.refuse[W1S1] = ApiError(500, "POST", "/benchmarkruns", '{"message": "etcd timeout"}')
    rec = _reconciler(body, kube, monkeypatch)
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(rec.step())
    assert kube.patches == []


def test_a_sweeps_passes_are_counted_as_a_sweeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconcile counters say whose pass it was: a sweep that keeps failing is no run's trouble
    (MLBenchReconcileErrors names the kind)."""
    from prometheus_client import REGISTRY

    def passes(kind: str) -> float:
        return REGISTRY.get_sample_value("mlbench_operator_reconciles_total", {"kind": kind}) or 0.0

    before = (passes("benchmarksweep"), passes("benchmarkrun"))
    asyncio.run(_reconciler(sweep(2), FakeKube(), monkeypatch).step())
    assert (passes("benchmarksweep"), passes("benchmarkrun")) == (before[0] + 1, before[1])


def test_our_run_without_the_label_is_seen_in_its_phase_and_the_sweep_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its label removed (``kubectl label br ... mlbench.io/sweep-``), the list misses the run: its create meets
    the 409, the read finds it ours and Succeeded. That phase is recorded and the next run created; the sweep
    froze with it Pending for ever when nothing else conflicted."""
    kube, body = FakeKube(), sweep(1)
    mine = sweep_plan.run_object(body, sweep_plan.decide(body, {}, T0).create[0])
    del mine["metadata"]["labels"][LABEL_SWEEP]
    kube.runs[W1S1] = {**mine, "status": {"phase": "Succeeded"}}
    rec = _reconciler(body, kube, monkeypatch)
    assert asyncio.run(rec.step()) == sweep_handlers.REPLAN_SECONDS  # its slot is free: the next pass at once
    assert {"name": W1S1, "phase": "Succeeded"} in kube.patches[-1]["runs"]
    asyncio.run(rec.step())
    assert W1S2 in kube.runs


@pytest.mark.parametrize(
    ("ours", "live", "runs"),
    [
        pytest.param(
            recorded(w1s1="Succeeded"),
            recorded(w1s1="Running"),
            recorded(w1s1="Succeeded")["runs"],
            id="an outcome the echo lacks is kept",
        ),
        pytest.param(
            recorded(w1s1="Running"),
            recorded(w1s1="Failed"),
            recorded(w1s1="Failed")["runs"],
            id="a newer outcome in the cluster's copy stands",
        ),
        pytest.param(
            recorded(w1s1="Succeeded"), {}, [{"name": W1S1, "phase": "Succeeded"}], id="no runs in the copy yet"
        ),
    ],
)
def test_a_recovered_status_keeps_the_outcomes_we_wrote(
    ours: dict[str, Any], live: dict[str, Any], runs: list[dict[str, Any]]
) -> None:
    """After a failed pass, a finished run's outcome must survive: its TTL (reading the sweep fresh) may delete it,
    and without the outcome the sweep would create it again."""
    assert sweep_plan.recovered_status(ours, live)["runs"] == runs


@pytest.mark.parametrize(
    ("run", "name"),
    [
        pytest.param(_owned(W1S1), None, id="a controller that is no sweep"),
        pytest.param(
            sweep_plan.run_object(sweep(), sweep_plan.decide(sweep(), {}, T0).create[0]), "s", id="the sweep's run"
        ),
        pytest.param({"metadata": {"name": W1S1, "labels": {LABEL_SWEEP: "s"}}}, None, id="a label only"),
    ],
)
def test_a_runs_sweep_is_its_controller_not_its_label(run: dict[str, Any], name: str | None) -> None:
    assert sweep_plan.sweep_of(run) == name


def test_a_run_failed_under_stop_outweighs_a_create_refused_in_the_same_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """One pass learns both (the failed run was ours, found by the 409's read): the sweep has stopped for good, so
    its final status says why it stopped, not the refusal, and Reconciling ends (kubectl wait returns)."""
    kube, body = FakeKube(), sweep(2, policy="Stop")
    mine = sweep_plan.run_object(body, sweep_plan.decide(body, {}, T0).create[0])
    del mine["metadata"]["labels"][LABEL_SWEEP]
    kube.runs[W1S1] = {**mine, "status": {"phase": "Failed"}}
    kube.refuse[W1S2] = ApiError(403, "POST", "/benchmarkruns", '{"message": "exceeded quota"}')
    rec = _reconciler(body, kube, monkeypatch)
    assert asyncio.run(rec.step()) is None  # finished
    status = kube.patches[-1]
    assert cond(status, c.STALLED) == ("True", SweepReason.RUN_FAILED)
    assert cond(status, c.RECONCILING) == ("False", SweepReason.RUN_FAILED)
    assert status["message"].startswith(f"run {W1S1} failed and failurePolicy is Stop")
    assert "completionTime" in status
    assert "CreateFailed" not in [e[1] for e in rec.events]  # the refusal is no longer the story


def test_a_deposed_leaders_late_sweep_status_is_refused_and_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33 (fencing), as for runs: the sweep's status write carries the version it was planned from; the
    new leader wrote since (version 9, this replica read 3): refused (409), the sweep read again, and the next
    pass plans from what it read and writes at 9."""
    from mlbench_operator.runtime import StatusConflict

    kube, body = FakeKube(), sweep(2)
    body["metadata"]["resourceVersion"] = "3"
    kube.live = {"metadata": {**body["metadata"], "resourceVersion": "9"}, "status": {"message": "new leader"}}
    rec = _reconciler(body, kube, monkeypatch)
    with pytest.raises(StatusConflict, match=r"resourceVersion 3 was refused \(409\): read again"):
        asyncio.run(rec.step())
    assert kube.live["status"] == {"message": "new leader"}  # the stale write did not land
    rec.recover()
    assert rec.status["message"] == "new leader"
    asyncio.run(rec.step())
    assert kube.versions == ["3", "9"]
    assert counts(kube.live["status"]) == (4, 2, 2, 0, 0)
