"""Keeping a finished run's full results: when to read the launcher's log, when to wait, when to give up.

The launcher prints rank 0's results as its last log line (:mod:`mlbench_api.bundle`); the operator
copies them into the ConfigMap ``<run>-results`` before the cleanup may delete the launcher. These
are the pure decisions; :meth:`mlbench_operator.handlers.RunReconciler.keep_results` executes them.
The outcome is recorded once in ``status.results`` (the ConfigMap's name, or why there is none), so a
restarted operator neither collects twice nor forgets to collect. Until then ``status.results`` may hold
only ``failingSince``: when reading the log (or keeping the files) first failed, so that the retry window
counts from the first failure even across an operator restart, not from the launcher's end (an operator
that was down for longer than the window would otherwise give up at its first transient error).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import ValidationError

from mlbench_api import bundle, hardware
from mlbench_api.network import NetworkConditions
from mlbench_api.runstatus import MAX_COLLECT_ATTEMPTS, TERMINAL
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import parse_time, timestamp
from mlbench_operator.podview import PodView
from mlbench_operator.run import ownership
from mlbench_operator.run.status import StoredStatus
from mlbench_operator.settings import RESULTS_WAIT_SECONDS


def wait_for(base: float, network: Mapping[str, Any] | None) -> float:
    """How long a run's launcher may take to print its results: ``base`` (:data:`RESULTS_WAIT_SECONDS` unless
    configured), plus, under ``spec.network``, what its delay adds to each of the launcher's two ssh reads of
    rank 0's files (:meth:`NetworkConditions.ssh_handshake_delay`): 5 s of latency adds 80 s, which the fixed
    wait would have cut short, deleting the launcher while it still read a failed run's events."""
    if not network:
        return base
    try:
        conditions = NetworkConditions.model_validate(network)
    except ValidationError:  # the spec was checked at admission; an unreadable one changes nothing here
        return base
    return base + 2 * conditions.ssh_handshake_delay()


#: Log lines read from the end: the results line comes last, split by the runtime into 16 KiB parts.
TAIL_LINES = 500
#: At most this much of them: the results line (at most :data:`bundle.MAX_LINE_CHARS`) and ordinary lines
#: before it fit; a launcher that printed more (a giant line among the last ones) loses its results, not
#: the operator its memory.
LOG_BYTES = 4 * 1024 * 1024


#: Collections (a log read, its results decoded and decompressed) the whole operator runs at once: each may
#: hold a results line and its files in memory, so a hundred runs ending together do not hold a hundred.
MAX_CONCURRENT_COLLECTIONS = 2


class Action(Enum):
    NONE = "none"  #: recorded already, or nothing ran that could have results
    WAIT = "wait"  #: the launcher is still finishing, or its log was unreadable: look again soon
    COLLECT = "collect"  #: read the launcher's log now
    GIVE_UP = "give-up"  #: record why there are no results


@dataclass(frozen=True)
class Decision:
    action: Action
    message: str = ""
    retry_after: float | None = None
    #: The launcher is still running and may be reading worker 0's files: spare that pod too.
    spares_worker0: bool = False

    @property
    def holds_launcher(self) -> bool:
        """The cleanup must spare the launcher: its log is still to be read."""
        return self.action in (Action.WAIT, Action.COLLECT)


def launcher(pods: Iterable[PodView], uid: str, status: Mapping[str, Any] | None = None) -> PodView | None:
    """The run's launcher pod whose log holds the run's results: of the current attempt, of the run's UID, and
    the one the operator recorded creating (``status.launcher``), or without a record one created while the
    attempt's workers were Ready and before the run ended (:func:`.ownership.accepted_launcher`). A pod of the
    launcher's name put there by anyone else, with whatever marks, gives no results."""
    return ownership.accepted_launcher(pods, uid, StoredStatus.parse(status, report=False).model)


def _seconds_since(value: str | None, now: datetime) -> float:
    when = parse_time(value)
    return 0.0 if when is None else max((now - when).total_seconds(), 0.0)


def recorded(status: Mapping[str, Any]) -> bool:
    """Whether the outcome is recorded for good: the ConfigMap, or why there is none (``failingSince``
    alone is a retry in progress)."""
    ref = status.get("results") or {}
    return bool(ref.get("configMap") or ref.get("message"))


def decide(
    status: Mapping[str, Any], pod: PodView | None, now: datetime, wait: float = RESULTS_WAIT_SECONDS
) -> Decision:
    """What to do about a run's results in this pass (``wait``: :data:`RESULTS_WAIT_SECONDS`, a setting)."""
    if recorded(status) or status.get("phase") not in TERMINAL:
        return Decision(Action.NONE)
    if pod is None:
        return Decision(Action.GIVE_UP, "no launcher ran (the run ended before it started): nothing to keep")
    if pod.finished:
        return Decision(Action.COLLECT)
    if pod.phase == "Pending":
        return Decision(Action.GIVE_UP, "the launcher never started: no results were kept")
    waited = _seconds_since(status.get("completionTime"), now)
    if waited < wait and not pod.terminating:
        return Decision(Action.WAIT, retry_after=wait - waited + 0.1, spares_worker0=True)
    return Decision(
        Action.GIVE_UP, f"the launcher had not finished {waited:.0f}s after the run ended: no results were kept"
    )


#: What failed, as the give-up message says it.
READING_LOG = "read the launcher's log"


def failing_since(status: Mapping[str, Any], now: datetime) -> str:
    """``status.results.failingSince`` to record at a failed attempt: the first failure's time, kept."""
    since = (status.get("results") or {}).get("failingSince")
    return since if isinstance(since, str) and since else timestamp(now)  # the CRD checks its format


def after_error(
    status: Mapping[str, Any],
    error: str,
    gone: bool,
    now: datetime,
    *,
    doing: str = READING_LOG,
    wait: float = RESULTS_WAIT_SECONDS,
) -> Decision:
    """Reading the launcher's log (or keeping its files: ``doing``) failed: retry for ``wait`` seconds
    from the *first* failure (``status.results.failingSince``; none yet: this one), unless the log is gone.

    Not from the launcher's end: after an operator outage longer than the window, a single transient
    error (a timeout) would otherwise lose the results for good.
    """
    if gone:
        return Decision(Action.GIVE_UP, f"the launcher's log is gone: {error}")
    waited = _seconds_since(failing_since(status, now), now)
    if waited < wait:
        return Decision(Action.WAIT, retry_after=min(5.0, wait - waited + 0.1))
    return Decision(Action.GIVE_UP, f"cannot {doing} (retried for {waited:.0f}s): {error}")


def retrying_status(status: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """``status.results`` while a failed attempt is retried: when the first one failed (see :func:`after_error`);
    the attempt ended (:func:`ended`)."""
    return ended(status, {"failingSince": failing_since(status, now)})


def attempts(status: Mapping[str, Any]) -> int:
    """Collections started and not ended (``status.results.attempts``)."""
    value = (status.get("results") or {}).get("attempts")
    return value if isinstance(value, int) and value > 0 else 0


def interrupted(status: Mapping[str, Any]) -> Decision | None:
    """GIVE_UP once :data:`MAX_COLLECT_ATTEMPTS` collections were started and never ended (the operator
    restarted, or was killed, while reading or decompressing the launcher's log): the same log is not read
    again after every restart. None: another attempt may start."""
    n = attempts(status)
    if n < MAX_COLLECT_ATTEMPTS:
        return None
    return Decision(
        Action.GIVE_UP,
        f"collecting the results was started {n} times and never ended (the operator restarted while reading "
        "the launcher's log): not read again",
    )


def attempt_status(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status.results`` written *before* the launcher's log is read: one more attempt started."""
    return {**(status.get("results") or {}), "attempts": attempts(status) + 1}


def ended(status: Mapping[str, Any], outcome: Mapping[str, Any]) -> dict[str, Any]:
    """``outcome`` as ``status.results`` once an attempt ended (kept, given up, or a retry scheduled): the
    count of unfinished attempts cleared (null: the status is a merge patch)."""
    started = "attempts" in (status.get("results") or {})
    return {**outcome, "attempts": None} if started else dict(outcome)


def from_log(text: str, limit: int = bundle.MAX_TOTAL_BYTES) -> tuple[bundle.Bundle | None, str]:
    """The bundle in a launcher's log (as read: at most :data:`LOG_BYTES`), its files at most ``limit`` bytes
    decompressed (``MLBENCH_RESULTS_MAX_BYTES``), or None and why not."""
    cut = len(text.encode(errors="replace")) >= LOG_BYTES
    too_long = (
        f"; the launcher's last {TAIL_LINES} log lines are over {LOG_BYTES} bytes, of which only the first "
        f"{LOG_BYTES} are read (lines that long are not the runner's)"
        if cut
        else ""
    )
    try:
        found = bundle.from_log(text, limit)
    except bundle.BundleError as err:
        return None, f"the launcher's results line is unreadable: {err}{too_long}"
    if found is None:
        return None, f"the launcher's log has no results line (mpirun never ran, or the launcher was killed){too_long}"
    return found, ""


def kept_status(run: str, found: bundle.Bundle, now: datetime) -> dict[str, Any]:
    """``status.results`` once the ConfigMap exists."""
    out: dict[str, Any] = {
        "configMap": n.results_config_map_name(run),
        "files": sorted(found.files),
        "compressedBytes": found.compressed_size(),
        "sha256": bundle.digests(found),
        "collectedAt": timestamp(now),
    }
    if found.truncated:
        out["truncated"] = list(found.truncated)
    return out


def missing_status(message: str, now: datetime) -> dict[str, Any]:
    """``status.results`` when nothing could be kept: said once, never retried."""
    return {"message": message[:4096], "collectedAt": timestamp(now)}


def refused_write(changes: Mapping[str, Any], detail: str, now: datetime) -> dict[str, Any]:
    """What to write instead of a status write the API server refused (422) once the run has finished.

    The run's outcome is stored already and stands: a refused recount or message after it is dropped,
    never turned into Failed/InvalidResult (that is for a refused *final* write, see
    :func:`mlbench_operator.run.status.unstorable_status`). A refused ``status.results`` becomes a short
    message saying so, which ends the collection: it is not retried with the same refused value.
    """
    if "results" not in changes:
        return {}
    why = c.clean(f"the API server refused status.results (HTTP 422): {detail}")
    return {"results": missing_status(why[:1024], now)}


def log_tail(text: str, limit: int) -> str:
    """The end of a launcher's log for an Event: without the ``run_results`` line (kilobytes of base64)
    and control characters, at most ``limit`` characters, whole lines where they fit."""
    lines = [line for line in text.splitlines() if f'"{bundle.EVENT}"' not in line[:40]]
    out = c.clean("\n".join(lines)).strip()
    if len(out) <= limit:
        return out
    cut = out[-limit:]
    return cut[cut.find("\n") + 1 :] if "\n" in cut[:-1] else cut


def with_hardware(found: bundle.Bundle, labels_by_node: Mapping[str, Mapping[str, str]]) -> bundle.Bundle:
    """The bundle with its summary's per-rank hardware completed from the nodes' labels
    (:func:`mlbench_api.hardware.with_node_labels`); as it was when it has no readable summary."""
    try:
        summary = found.summary
    except ValidationError:
        return found
    if summary is None:
        return found
    joined = hardware.with_node_labels(summary, labels_by_node)
    files = {**found.files, bundle.SUMMARY: joined.model_dump_json(by_alias=True, indent=2).encode()}
    return bundle.Bundle(files, found.truncated)


def nodes_to_read(found: bundle.Bundle) -> list[str]:
    """The nodes whose labels the bundle's summary wants (none without a readable summary)."""
    try:
        summary = found.summary
    except ValidationError:
        return []
    return hardware.hardware_nodes(summary) if summary is not None else []
