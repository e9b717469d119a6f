"""BenchmarkSweeps, pure: from (the sweep, its runs that exist, now) to the runs to create next and its status.

No I/O here; :mod:`.handlers` lists the sweep's runs, calls :func:`decide`, creates what it
says and writes the status.

* The expansion is ``mlbench_api.sweep.expand``: the runs, their names and labels, in order.
* At most ``spec.maxConcurrent`` runs exist unfinished at a time; the next ones are created in
  expansion order as earlier ones finish.
* ``status.runs`` remembers each run's last phase. A finished run is never created again (also
  when it was deleted afterwards, by hand or by its ttlSecondsAfterFinished); an unfinished one that
  disappears is created again, under the same name.
* The sweep is finished when every run has finished, or, with ``failurePolicy: Stop``, when a run
  failed and none is left unfinished; ``status.completionTime`` is then set and the sweep never
  creates a run again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum, unique
from typing import Any

from pydantic import ValidationError

from mlbench_api.common import API_VERSION
from mlbench_api.errors import format_errors
from mlbench_api.runstatus import TERMINAL, Phase
from mlbench_api.sweep import BenchmarkSweep, FailurePolicy, SweepRun, expand
from mlbench_operator import conditions as c
from mlbench_operator.podview import controller_uid

#: The phases a run never leaves.
#: The condition types of a sweep (kstatus: what Flux, Argo CD and ``kubectl wait`` read).
TYPES = (c.READY, c.RECONCILING, c.STALLED)

Event = tuple[str, str, str]  # (type, reason, message)


@unique
class SweepReason(StrEnum):
    """Every condition reason of a BenchmarkSweep."""

    PROGRESSING = "Progressing"  #: runs remain; Ready False, Reconciling True
    COMPLETED = "Completed"  #: every run finished (some may have failed); Ready True
    INVALID_SPEC = "InvalidSpec"  #: the spec does not validate (e.g. an expansion the CRD could not check)
    NAME_CONFLICT = "NameConflict"  #: a BenchmarkRun with a run's name exists and is not this sweep's
    CREATE_FAILED = "CreateFailed"  #: the API server refused to create a run (403: quota, policy; 422)
    RUN_FAILED = "RunFailed"  #: a run failed and failurePolicy is Stop: no further run is created


@dataclass(frozen=True)
class Observed:
    """One of the sweep's runs as it exists now."""

    name: str
    phase: str | None = None
    deleting: bool = False


@dataclass(frozen=True)
class Problem:
    """Why a run could not be created in this pass (it is tried again in a later one)."""

    reason: SweepReason
    message: str


@dataclass
class Decision:
    """What to do now: the runs to create, the status to write (as if the creates succeed), the Events."""

    create: list[SweepRun] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    #: the Event of each run to create, by name: emitted once the create succeeded
    created_events: dict[str, Event] = field(default_factory=dict)
    #: True once the sweep is over (completionTime set): nothing is ever created again
    finished: bool = False
    #: True when nothing goes on without the user (invalid spec, conflict, refused create)
    stalled: bool = False


def observe(runs: Iterable[Mapping[str, Any]], sweep_uid: str) -> dict[str, Observed]:
    """The runs (API objects, e.g. listed by the sweep label) that this sweep controls, by name."""
    out = {}
    for run in runs:
        meta = run.get("metadata") or {}
        if controller_uid(run) != sweep_uid or not meta.get("name"):
            continue
        phase = (run.get("status") or {}).get("phase")
        out[meta["name"]] = Observed(meta["name"], phase, bool(meta.get("deletionTimestamp")))
    return out


def outcome_recorded(sweep: Mapping[str, Any] | None, run: Mapping[str, Any]) -> bool:
    """Whether the finished ``run`` can be deleted without its sweep losing its outcome.

    False only while the sweep that controls the run exists, is unfinished and has not yet written
    the run's final phase into ``status.runs``: deleted then (its ttlSecondsAfterFinished), the run
    would look to the sweep like an unfinished run that disappeared, and be created again.
    """
    if sweep is None or controller_uid(run) != (sweep.get("metadata") or {}).get("uid"):
        return True
    status = sweep.get("status") or {}
    name = str((run.get("metadata") or {}).get("name"))
    return bool(status.get("completionTime")) or recorded_phases(status).get(name) in TERMINAL


def sweep_of(run: Mapping[str, Any]) -> str | None:
    """The name of the BenchmarkSweep that controls ``run`` (its controller owner reference), else None. Not the
    ``mlbench.io/sweep`` label: a user may remove a label (then the run's TTL would not wait for its sweep)."""
    for ref in (run.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "BenchmarkSweep":
            return str(ref.get("name"))
    return None


def recovered_status(ours: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    """The status to go on from after a failed pass: the watch's copy (a write may have landed although its
    answer was an error), with every run outcome we wrote that it does not show yet. A finished run whose
    outcome the echo lacks could be deleted by its TTL (which reads the sweep fresh) and then look to the next
    pass like a run that never ran: created again."""
    finished = {name: phase for name, phase in recorded_phases(ours).items() if phase in TERMINAL}
    runs = [
        {**entry, "phase": finished[entry.get("name")]}
        if entry.get("name") in finished and entry.get("phase") not in TERMINAL
        else entry
        for entry in live.get("runs") or []
    ]
    seen = {entry.get("name") for entry in runs}
    runs += [{"name": name, "phase": phase} for name, phase in finished.items() if name not in seen]
    return {**live, "runs": runs} if runs else dict(live)


def recorded_phases(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status.runs`` by run name: each run's last phase the sweep wrote down."""
    return {e.get("name"): e.get("phase") for e in status.get("runs") or []}


def owner_reference(sweep: Mapping[str, Any]) -> dict[str, Any]:
    """Controller owner reference: deleting the sweep garbage-collects its runs."""
    meta = sweep["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": "BenchmarkSweep",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def run_object(sweep: Mapping[str, Any], run: SweepRun) -> dict[str, Any]:
    """The BenchmarkRun to create: the expansion's, in the sweep's namespace, owned by the sweep."""
    obj = run.to_api(sweep["metadata"]["namespace"])
    obj["metadata"]["ownerReferences"] = [owner_reference(sweep)]
    return obj


def parse(sweep: Mapping[str, Any]) -> BenchmarkSweep:
    """The sweep's metadata and spec as the model (the status is ours, not validated)."""
    return BenchmarkSweep.model_validate({"metadata": sweep.get("metadata") or {}, "spec": sweep.get("spec") or {}})


def _counts(phases: Mapping[str, str | None]) -> dict[str, int]:
    values = list(phases.values())
    return {
        "total": len(values),
        "pending": sum(1 for p in values if p is None),
        "running": sum(1 for p in values if p is not None and p not in TERMINAL),
        "succeeded": sum(1 for p in values if p == Phase.SUCCEEDED),
        "failed": sum(1 for p in values if p == Phase.FAILED),
    }


def summary(counts: Mapping[str, int]) -> str:
    """One line: how far the sweep is."""
    done = counts["succeeded"] + counts["failed"]
    return (
        f"{done}/{counts['total']} runs finished ({counts['succeeded']} succeeded, {counts['failed']} failed), "
        f"{counts['running']} running, {counts['pending']} not created yet"
    )


def _conditions(
    old: list[dict[str, Any]] | None,
    values: Mapping[str, tuple[str, SweepReason]],
    message: str,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    conds = list(old or [])
    for type_ in TYPES:
        status, reason = values[type_]
        conds = c.set_condition(conds, type_, status, reason, message, now=now, generation=generation)
    return conds


def _invalid(old: Mapping[str, Any], status: dict[str, Any], problem: str, now: datetime) -> Decision:
    """The spec does not validate: Stalled, nothing created; the sweep waits for a spec change."""
    message = f"invalid spec: {problem}"
    reason = SweepReason.INVALID_SPEC
    values = {c.READY: ("False", reason), c.RECONCILING: ("False", reason), c.STALLED: ("True", reason)}
    status["conditions"] = _conditions(old.get("conditions"), values, message, now, status["observedGeneration"])
    status["message"] = message
    stalled_before = c.is_true(old.get("conditions"), c.STALLED) and old.get("message") == message
    return Decision(status=status, events=[] if stalled_before else [("Warning", reason.value, message)], stalled=True)


def _phases(runs: list[SweepRun], observed: Mapping[str, Observed], previous: Mapping[str, Any]) -> dict[str, Any]:
    """Each run's phase now: what exists; else a finished run's kept outcome; else None (to be created)."""
    phases: dict[str, str | None] = {}
    for run in runs:
        seen = observed.get(run.name)
        if seen is not None:
            phases[run.name] = seen.phase or Phase.PENDING.value
        elif previous.get(run.name) in TERMINAL:
            phases[run.name] = previous[run.name]  # finished, then deleted: its outcome is kept
        else:
            phases[run.name] = None  # not created yet, or gone before it finished: created (again)
    return phases


Verdict = tuple[SweepReason, dict[str, tuple[str, SweepReason]], str]


def _verdict(
    phases: Mapping[str, str | None],
    problems: Mapping[str, Problem],
    stopped: bool,
    finished: bool,
    counts: Mapping[str, int],
) -> Verdict:
    """The reason, the kstatus conditions' (status, reason) and the message. A failed run under Stop comes first:
    no run is created any more, so a create refused in the same pass is no longer the sweep's problem."""
    message = summary(counts)
    if stopped:
        reason = SweepReason.RUN_FAILED
        failed = next(name for name, phase in phases.items() if phase == Phase.FAILED)
        values = {
            c.READY: ("False", reason),
            c.RECONCILING: ("False" if finished else "True", reason),
            c.STALLED: ("True", reason),
        }
        return reason, values, f"run {failed} failed and failurePolicy is Stop: no further run is created; {message}"
    if problems:
        name, first = next(iter(problems.items()))
        reason = first.reason
        stalled = {c.READY: ("False", reason), c.RECONCILING: ("True", reason), c.STALLED: ("True", reason)}
        return reason, stalled, f"cannot create run {name}: {first.message}; {message}"
    if finished:
        reason = SweepReason.COMPLETED
        return (
            reason,
            {c.READY: ("True", reason), c.RECONCILING: ("False", reason), c.STALLED: ("False", reason)},
            message,
        )
    reason = SweepReason.PROGRESSING
    return reason, {c.READY: ("False", reason), c.RECONCILING: ("True", reason), c.STALLED: ("False", reason)}, message


def decide(
    sweep: Mapping[str, Any],
    observed: Mapping[str, Observed],
    now: datetime,
    problems: Mapping[str, Problem] | None = None,
) -> Decision:
    """The runs to create next and the sweep's next status.

    ``sweep`` is the object (its status: the last one written); ``observed`` its runs that exist
    (:func:`observe`); ``problems`` the runs that could not be created in this pass: with any, nothing
    is created (the handler asks again with them, for the status only) and the sweep is Stalled.
    """
    problems = problems or {}
    old: dict[str, Any] = dict(sweep.get("status") or {})
    generation = (sweep.get("metadata") or {}).get("generation")
    status: dict[str, Any] = {**old, "observedGeneration": generation, "startTime": old.get("startTime")}
    status["startTime"] = status["startTime"] or c.timestamp(now)
    if old.get("completionTime"):  # finished is final: only the generation catches up
        return Decision(status=status, finished=True)
    try:
        parsed = parse(sweep)
        runs = expand(parsed)
    except ValidationError as err:
        return _invalid(old, status, "; ".join(format_errors(err)), now)
    except ValueError as err:
        return _invalid(old, status, str(err), now)

    previous = recorded_phases(old)
    phases = _phases(runs, observed, previous)
    events: list[Event] = [
        ("Warning", SweepReason.RUN_FAILED.value, f"run {name} failed")
        for name, phase in phases.items()
        if phase == Phase.FAILED and previous.get(name) != Phase.FAILED
    ]
    stopped = parsed.spec.failure_policy is FailurePolicy.STOP and _counts(phases)["failed"] > 0
    create: list[SweepRun] = []
    if not stopped and not problems:
        free = parsed.spec.max_concurrent - _counts(phases)["running"]
        create = [r for r in runs if phases[r.name] is None][: max(free, 0)]
    position = {r.name: i for i, r in enumerate(runs, start=1)}
    created_events: dict[str, Event] = {}
    for run in create:
        phases[run.name] = Phase.PENDING.value
        message = f"created run {run.name} ({position[run.name]} of {len(runs)})"
        created_events[run.name] = ("Normal", "RunCreated", message)
    counts = _counts(phases)
    finished = counts["running"] == 0 and (counts["pending"] == 0 or stopped)

    reason, values, message = _verdict(phases, problems, stopped, finished, counts)
    cause = message.rsplit("; ", 1)[0]  # without the counts, which move on
    said = c.is_true(old.get("conditions"), c.STALLED) and str(old.get("message", "")).startswith(cause)
    if problems and not stopped and not said:
        events.append(("Warning", reason.value, message))
    if finished:
        status["completionTime"] = c.timestamp(now)
        events.append(("Warning" if stopped or counts["failed"] else "Normal", reason.value, message))
    status.update(counts)
    status["runs"] = [{"name": name, **({"phase": phase} if phase else {})} for name, phase in phases.items()]
    status["conditions"] = _conditions(old.get("conditions"), values, message, now, generation)
    status["message"] = message
    return Decision(
        create=create,
        status=status,
        events=events,
        created_events=created_events,
        finished=finished,
        stalled=bool(problems) and not stopped,
    )
