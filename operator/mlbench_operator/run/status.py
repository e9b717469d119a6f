"""A run's status, typed: parsed tolerantly from the stored one, built as ``BenchmarkRunStatus``, written
as the wire's dict.

Every status is built as the API's typed ``BenchmarkRunStatus`` (``Phase``, ``WorkerCounts``, typed conditions
with :class:`~.conditions.Reason` members) from the stored one, parsed tolerantly (:class:`StoredStatus`), and
serialized once, as each public function returns it (:meth:`_Status.dump`): the executor and
:func:`mlbench_operator.runtime.status_patch` see the wire's dicts. An Event is planned only for a condition
(or the phase) that changed, never for a pass that merely restates it.
"""

from __future__ import annotations

import copy
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from mlbench_api.common import Condition as ConditionModel
from mlbench_api.errors import format_errors
from mlbench_api.runstatus import TERMINAL, BenchmarkRunStatus, Phase
from mlbench_api.task import RunnerSpec
from mlbench_operator import conditions as c
from mlbench_operator import logs
from mlbench_operator.conditions import Reason

log = logs.get_logger("mlbench_operator.run.status")


@dataclass
class Plan:
    """The next status and what to do to the world to get there."""

    status: dict[str, Any]  #: as the API server gets it (:meth:`_Status.dump`); :func:`finalize` completes it
    create_workers: list[int] = field(default_factory=list)
    create_launcher: bool = False
    #: pods of earlier attempts to delete (gang restart): name -> UID. Only this run's own pods, and each
    #: delete is conditional on the UID, so neither a foreign pod with our labels nor the next attempt's
    #: pod of the same name is ever touched (a label-selector deletecollection would do both).
    delete_stale: dict[str, str] = field(default_factory=dict)
    cleanup: list[str] = field(default_factory=list)  #: pods to delete as the run finishes
    force_delete: list[str] = field(default_factory=list)  #: pods stuck Terminating (lost node): grace 0
    events: list[tuple[str, str, str]] = field(default_factory=list)  #: (type, reason, message)
    #: a failed launcher about to be deleted by a gang restart: its log's tail goes into an Event first,
    #: so each attempt's mpirun output outlives the pod (the launcher's name repeats across attempts)
    keep_log_of: str | None = None
    requeue_after: float | None = None  #: wake up by then even without pod events (deadline)

    @property
    def terminal(self) -> bool:
        return self.status.get("phase") in TERMINAL


class ReportedOnce:
    """The stored values that do not validate and were already logged, per run (bounded, oldest forgotten).

    A bad stored field stays until a pass rewrites it, and every pass parses the status: without
    this its warning would repeat on every pass, burying everything else in the log.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def first(self, run: str, part: str, value: Any) -> bool:
        """True the first time ``run``'s ``part`` is seen holding ``value``."""
        key = (run, part, json.dumps(value, sort_keys=True, default=str))
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > self.size:
            self._seen.popitem(last=False)
        return True


#: The operator's one record of what it has logged as unparsed.
REPORTED = ReportedOnce()


@dataclass(frozen=True)
class StoredStatus:
    """A run's stored status, parsed into the typed model as far as it validates.

    A status written by an older operator, or one holding a value the models now refuse (an
    out-of-range number, a field since removed), must not stop reconciliation. The fallback: the
    whole status is tried first, then field by field; a top-level field that does not validate (or that
    the model does not know) is left out of :attr:`model` and kept as it was in :attr:`unparsed`, and so
    is a single condition that does not (:attr:`unparsed_conditions`). Kept parts are written back
    unchanged (nothing is lost, nothing re-written) until a pass sets that field, or a condition of that
    type, itself, which replaces them. Each one is logged with the reason when the status is parsed.
    """

    raw: Mapping[str, Any]  #: the status as stored (or as last written by this operator)
    valid: Mapping[str, Any]  #: the part of ``raw`` that validates (``model``'s input)
    model: BenchmarkRunStatus  #: everything that validates
    unparsed: Mapping[str, Any] = field(default_factory=dict)  #: wire key -> stored value
    unparsed_conditions: tuple[Any, ...] = ()  #: stored conditions that do not validate

    def fresh(self) -> BenchmarkRunStatus:
        """A new copy of :attr:`model` to build the next status in (validating anew is the cheap deep copy)."""
        return BenchmarkRunStatus.model_validate(self.valid)

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None, *, report: bool = True, run: str | None = None) -> StoredStatus:
        """``report``: log what does not validate (off where the same status was just parsed and logged);
        with ``run`` (the run's uid), each bad value only the first time it is seen in that run."""
        raw = dict(raw or {})
        try:
            return cls(raw, raw, BenchmarkRunStatus.model_validate(raw))
        except ValidationError:
            pass  # find out which parts do not validate, keep the rest typed
        good: dict[str, Any] = {}
        unparsed: dict[str, Any] = {}
        bad_conditions: list[Any] = []
        for key, value in raw.items():
            if key == "conditions" and isinstance(value, list):
                value, bad_conditions = _split_conditions(value, report, run)
            problem = _field_problem(key, value)
            if problem is None:
                good[key] = value
                continue
            unparsed[key] = raw[key]
            bad_conditions = [] if key == "conditions" else bad_conditions  # the whole list is kept
            if report and (run is None or REPORTED.first(run, key, raw[key])):
                log.warning("status_field_unparsed", field=key, error=problem, kept="as stored")
        return cls(raw, good, BenchmarkRunStatus.model_validate(good), unparsed, tuple(bad_conditions))


def _uid(body: Mapping[str, Any]) -> str | None:
    """The run's uid (None for a body without one: then every pass reports)."""
    uid = (body.get("metadata") or {}).get("uid")
    return str(uid) if uid else None


def _field_problem(key: str, value: Any) -> str | None:
    """Why ``status.<key>: value`` does not validate on its own; None when it does."""
    try:
        BenchmarkRunStatus.model_validate({key: value})
    except ValidationError as err:
        return _short(err, 512)
    return None


def _split_conditions(items: list[Any], report: bool, run: str | None) -> tuple[list[Any], list[Any]]:
    """(the stored conditions that validate, those that do not)."""
    good: list[Any] = []
    bad: list[Any] = []
    for item in items:
        try:
            ConditionModel.model_validate(item)
        except ValidationError as err:
            bad.append(item)
            if report and (run is None or REPORTED.first(run, "conditions", item)):
                kind = item.get("type") if isinstance(item, Mapping) else None
                log.warning("status_condition_unparsed", type=kind, error=_short(err, 512), kept="as stored")
        else:
            good.append(item)
    return good, bad


def _condition_type(item: Any) -> str:
    kind = item.get("type") if isinstance(item, Mapping) else None
    return kind if isinstance(kind, str) else ""


#: ``BenchmarkRunStatus``'s fields: wire key -> attribute name.
_STATUS_FIELDS = {info.alias or name: name for name, info in BenchmarkRunStatus.model_fields.items()}


class _Status:
    """Builds the next status, typed, from the stored one; :meth:`dump` is its one serialization."""

    def __init__(self, prev: StoredStatus, now: datetime, generation: int | None) -> None:
        self.prev = prev
        self.old = prev.model  #: the stored status (read only)
        self.new = prev.fresh()
        self.now = now
        self.generation = generation  #: the observedGeneration of every condition set
        #: fields written as given, not typed (stored ones that do not validate): wire key -> value
        self.kept: dict[str, Any] = dict(prev.unparsed)
        #: stored conditions that do not validate, kept until a condition of their type is set
        self.kept_conditions = list(prev.unparsed_conditions)

    @classmethod
    def of(cls, body: Mapping[str, Any], now: datetime) -> _Status:
        """The next status of the run ``body``: it reflects the run's current generation."""
        generation = (body.get("metadata") or {}).get("generation")
        return cls.following(StoredStatus.parse(body.get("status"), run=_uid(body)), now, generation)

    @classmethod
    def following(cls, prev: StoredStatus, now: datetime, generation: int | None) -> _Status:
        st = cls(prev, now, generation)
        st.new.observed_generation = generation
        if st.new.conditions is None:
            st.new.conditions = []
        return st

    def cond(self, type_: str, status: c.ConditionStatus, reason: str, message: str = "") -> None:
        """Set a condition (see :func:`conditions.put`)."""
        if self.new.conditions is None:
            self.new.conditions = []
        # Edited in place, not assigned: the CRD's maxItems is the API server's to enforce, as for any
        # status it refuses (a 422 fails the run InvalidResult), rather than an exception in the planner.
        conds = self.new.conditions
        conds[:] = c.put(conds, type_, status, reason, message, now=self.now, generation=self.generation)
        self.kept_conditions = [k for k in self.kept_conditions if _condition_type(k) != type_]

    def changed(self, type_: str, *, message: bool = False) -> bool:
        """Whether condition ``type_`` of the next status differs from the stored one in status or reason
        (or, with ``message``, its message): what an Event is planned for, never a mere re-statement."""
        before, after = c.find(self.old.conditions, type_), c.find(self.new.conditions, type_)

        def seen(cond: ConditionModel | None) -> tuple[str, str, str] | None:
            return None if cond is None else (cond.status, cond.reason, cond.message if message else "")

        return seen(before) != seen(after)

    def message_of(self, type_: str) -> str:
        """The message of a condition of the next status, as stored."""
        cond = c.find(self.new.conditions, type_)
        return cond.message if cond is not None else ""

    def keep(self, key: str, value: Any, why: str) -> None:
        """Write ``status.<key>`` as given, untyped, because it does not validate (``why``); logged."""
        log.warning("status_field_unparsed", field=key, error=why, kept="as given")
        setattr(self.new, _STATUS_FIELDS[key], None)
        self.kept[key] = value

    def say(self, message: str) -> None:
        """``status.message``, as stored (cleaned of control characters, at most the CRD's maxLength)."""
        self.new.message = c.stored_text(message)

    def in_progress(self) -> None:
        self.cond(c.GOAL_REACHED, "Unknown", Reason.NO_RESULT_YET, "the run has not finished")
        self.cond(c.SUCCEEDED, "False", Reason.IN_PROGRESS, "")
        self.cond(c.FAILED, "False", Reason.IN_PROGRESS, "")

    def fail(self, reason: str, message: str) -> None:
        self.new.phase = Phase.FAILED
        self.say(message)
        if self.new.completion_time is None:
            self.new.completion_time = c.instant(self.now)
        self.cond(c.WORKERS_READY, "False", Reason.RUN_FAILED, "the run failed")
        self.cond(c.RUNNING, "False", Reason.RUN_FAILED, "the run failed")
        self.cond(c.GOAL_REACHED, "False", Reason.RUN_FAILED, "the run failed before it reported a result")
        self.cond(c.SUCCEEDED, "False", reason, message)
        self.cond(c.FAILED, "True", reason, message)

    def dump(self) -> dict[str, Any]:
        """The next status as the API server gets it (``model_dump``: camelCase, RFC 3339 times, no nulls).

        A field this pass left as it was is written exactly as stored, and one that does not validate as
        it was stored or given (:attr:`kept`, see :class:`StoredStatus`), so that no pass rewrites what
        it did not decide and :func:`status_patch` sends only real changes. A field the pass cleared is
        written as null, which deletes it in the status' merge patch (``observedGeneration`` of a run
        without ``metadata.generation``).
        """
        typed = self.new.model_dump(mode="json", by_alias=True, exclude_none=True)
        raw = self.prev.raw
        out: dict[str, Any] = {}
        for key, name in _STATUS_FIELDS.items():
            value = getattr(self.new, name)
            if value is None and key in self.kept:
                out[key] = copy.deepcopy(self.kept[key])
            elif key in raw and value == getattr(self.old, name):
                out[key] = copy.deepcopy(raw[key])
            elif value is None:
                if key in raw:
                    out[key] = None
            elif name == "conditions" and self.kept_conditions:
                kept = copy.deepcopy(self.kept_conditions)
                out[key] = sorted([*typed[key], *kept], key=lambda x: c.order(_condition_type(x)))
            else:
                out[key] = typed[key]
        out.update({k: copy.deepcopy(v) for k, v in self.kept.items() if k not in _STATUS_FIELDS})
        return out


def _spec_workers(body: Mapping[str, Any], default: int) -> int:
    """``spec.workers`` from the raw spec (a rejected run's spec may not validate); ``default`` when
    unset, 0 when unusable (not a number, negative)."""
    value = (body.get("spec") or {}).get("workers")
    if value is None:
        return default
    try:
        return max(int(value), 0)
    except (TypeError, ValueError, OverflowError):
        return 0


def failed_status(body: Mapping[str, Any], reason: str, message: str, now: datetime) -> dict[str, Any]:
    """Status for an admitted run that fails outside :func:`plan` (restarts and workers are kept)."""
    st = _Status.of(body, now)
    st.fail(reason, message)
    return st.dump()


def serves_metrics(status: Mapping[str, Any]) -> bool | None:
    """Whether the admitted run's ranks serve metrics (``RunnerSpec.serves_metrics`` of its task snapshot);
    None before admission (no snapshot yet) or for a snapshot that does not read."""
    runner = (status.get("taskSnapshot") or {}).get("runner")
    if not isinstance(runner, Mapping):
        return None
    try:
        return RunnerSpec.model_validate(runner).serves_metrics
    except ValidationError:
        return None


def finalize(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The status as it is written: text from pods cleaned, and the kstatus conditions derived.

    ``Ready``, ``Reconciling`` and ``Stalled`` are a projection of the phase and the ``Failed``
    condition, computed here at write time, so that no policy can forget them and generic tools
    (Flux, Argo CD, ``kubectl wait --for=condition=Ready``) read every run the same way. The one
    input of its own is a ``Stalled``/``NoProgress`` set by :func:`plan` while Running.
    """
    raw = dict(status)
    if isinstance(raw.get("message"), str):
        raw["message"] = c.stored_text(raw["message"])
    st = _Status(StoredStatus.parse(raw, report=False), now, None)  # a part that does not validate was logged
    _kstatus(st)
    return st.dump()


def _kstatus(st: _Status) -> None:
    """Ready, Reconciling and Stalled of the next status (see :func:`finalize`); nothing without a phase.
    Their observedGeneration is the status' own."""
    new = st.new
    st.generation = new.observed_generation
    phase = new.phase
    if phase is None:
        return
    message = new.message or ""
    failed = c.find(new.conditions, c.FAILED)
    stalled = c.find(new.conditions, c.STALLED)
    no_progress = stalled is not None and (stalled.status, stalled.reason) == ("True", Reason.NO_PROGRESS)
    ready: _Cond
    stuck: _Cond
    if phase == Phase.SUCCEEDED:
        ready = ("True", Phase.SUCCEEDED, message)
    elif phase == Phase.FAILED:
        ready = ("False", failed.reason if failed else Phase.FAILED, (failed.message if failed else "") or message)
    else:
        ready = ("False", phase, message)
    reconciling: _Cond = ("False", phase, "the run finished") if phase in TERMINAL else ("True", phase, message)
    if phase == Phase.FAILED:
        stuck = ("True", ready[1], ready[2])
    elif phase == Phase.RUNNING and stalled is not None and no_progress:
        stuck = ("True", Reason.NO_PROGRESS, stalled.message)
    else:
        stuck = ("False", phase, "")
    for type_, (value, reason, text) in ((c.READY, ready), (c.RECONCILING, reconciling), (c.STALLED, stuck)):
        st.cond(type_, value, reason, text)


#: A status the API server refused (422) is replaced by this much, which it always accepts.
UNSTORABLE_MESSAGE_LIMIT = 1024


def unstorable_status(old: Mapping[str, Any], detail: str, now: datetime) -> dict[str, Any]:
    """The run fails with InvalidResult when the API server refused (422) a status write.

    Built from scratch rather than from the refused status: only fixed reasons, a short cleaned
    message and the stored fields, so this write cannot be refused for the same cause and the
    run cannot be retried forever while its workers hold their GPUs.
    """
    message = c.clean(f"the operator could not store the run's status (HTTP 422): {detail}")
    message = message[: UNSTORABLE_MESSAGE_LIMIT - 3] + "..." if len(message) > UNSTORABLE_MESSAGE_LIMIT else message
    gen = old.get("observedGeneration")
    gen = gen if isinstance(gen, int) and 0 <= gen <= 2**53 else None
    st = _Status(StoredStatus.parse({}), now, gen)
    st.new.phase = Phase.FAILED
    st.say(message)
    st.new.conditions = []
    st.cond(c.SUCCEEDED, "False", Reason.INVALID_RESULT, message)
    st.cond(c.FAILED, "True", Reason.INVALID_RESULT, message)
    done = StoredStatus.parse({"completionTime": old.get("completionTime")}, report=False).model.completion_time
    st.new.completion_time = done or c.instant(now)
    _kstatus(st)
    return st.dump()


def generation_patch(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{"observedGeneration": g}`` for a finished run whose spec (runPolicy: ttl, cleanup) was edited
    after its daemon stopped, so that kstatus readers do not wait forever; None when current or unfinished
    (an unfinished run's daemon writes it with its next status)."""
    status = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    if status.get("phase") not in TERMINAL or generation is None or status.get("observedGeneration") == generation:
        return None
    return {"observedGeneration": generation}


def _short(err: Exception, limit: int = 2048) -> str:
    text = "; ".join(format_errors(err)) if isinstance(err, ValidationError) else str(err)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_Cond = tuple[c.ConditionStatus, str, str]


# -- the executor's small decisions, between the status it holds and the next one ----------------------------
def kept_after_failure(ours: Mapping[str, Any], live: Mapping[str, Any]) -> Mapping[str, Any]:
    """After a failed pass, the status to plan from: the cluster's (``live``: a write may have landed although
    its answer was an error), except where ``ours`` is provably newer, written by us and not yet echoed by the
    watch: a finished status (re-planning from the older one while the cleanup deletes pods would misread the
    result as a lost launcher), or more restarts (the count only grows; planning from the older one would
    announce and count the same gang restart again)."""
    if ours.get("phase") in TERMINAL:
        return ours
    if int(ours.get("restarts") or 0) > int(live.get("restarts") or 0):
        return ours
    return live


def restarted(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """``new`` records a gang restart that ``old`` does not (counted once, where it is recorded)."""
    return int(new.get("restarts", 0)) > int(old.get("restarts", 0))


def first_ready(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """``new`` is the first status with every worker of the first attempt Ready (the time to it is measured)."""
    was_ready = c.is_true(old.get("conditions"), c.WORKERS_READY)
    ready = c.is_true(new.get("conditions"), c.WORKERS_READY)
    return not was_ready and ready and int(new.get("restarts", 0)) == 0
