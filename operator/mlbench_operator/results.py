"""Keeping a finished run's full results: when to read the launcher's log, when to wait, when to give up.

The launcher prints rank 0's results as its last log line (:mod:`mlbench_api.bundle`); the operator
copies them into the ConfigMap ``<run>-results`` before the cleanup may delete the launcher. These
are the pure decisions; :meth:`mlbench_operator.handlers.RunReconciler.keep_results` executes them.
The outcome is recorded once in ``status.results`` (the ConfigMap's name, or why there is none), so a
restarted operator neither collects twice nor forgets to collect.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from mlbench_api import bundle
from mlbench_operator import conditions as c
from mlbench_operator import naming as n
from mlbench_operator.conditions import parse_time, timestamp
from mlbench_operator.podview import PodView
from mlbench_operator.reconcile import TERMINAL

#: How long after the run ended a launcher that is still running may take to print its results (a
#: failed worker makes mpirun abort within seconds; reading worker 0 takes up to 2 x 15 s), and how
#: long a log that cannot be read (kubelet restarting) is retried. The launcher and worker 0 are kept
#: that long at most, even under cleanPodPolicy All.
WAIT_SECONDS = 60.0
#: Log lines read from the end: the results line comes last, split by the runtime into 16 KiB parts.
TAIL_LINES = 500


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


def launcher(pods: Iterable[PodView], uid: str) -> PodView | None:
    """The run's launcher pod (there is one name per run; a foreign pod of that name is not ours)."""
    return next((p for p in pods if p.role == n.ROLE_LAUNCHER and (not uid or p.owner_uid == uid)), None)


def _seconds_since(value: str | None, now: datetime) -> float:
    when = parse_time(value)
    return 0.0 if when is None else max((now - when).total_seconds(), 0.0)


def decide(status: Mapping[str, Any], pod: PodView | None, now: datetime, wait: float = WAIT_SECONDS) -> Decision:
    """What to do about a run's results in this pass (``wait``: :data:`WAIT_SECONDS`, a setting)."""
    if status.get("results") or status.get("phase") not in TERMINAL:
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


def after_read_error(
    status: Mapping[str, Any], pod: PodView, error: str, gone: bool, now: datetime, *, wait: float = WAIT_SECONDS
) -> Decision:
    """The launcher's log could not be read: retry for a while (a kubelet restarting), unless it is gone."""
    if gone:
        return Decision(Action.GIVE_UP, f"the launcher's log is gone: {error}")
    waited = _seconds_since(pod.finished_at or status.get("completionTime"), now)
    if waited < wait:
        return Decision(Action.WAIT, retry_after=min(5.0, wait - waited + 0.1))
    return Decision(Action.GIVE_UP, f"cannot read the launcher's log: {error}")


def from_log(text: str) -> tuple[bundle.Bundle | None, str]:
    """The bundle in a launcher's log, or None and why not."""
    try:
        found = bundle.from_log(text)
    except bundle.BundleError as err:
        return None, f"the launcher's results line is unreadable: {err}"
    if found is None:
        return None, "the launcher's log has no results line (mpirun never ran, or the launcher was killed)"
    return found, ""


def kept_status(run: str, found: bundle.Bundle, now: datetime) -> dict[str, Any]:
    """``status.results`` once the ConfigMap exists."""
    out: dict[str, Any] = {
        "configMap": n.results_config_map_name(run),
        "files": sorted(found.files),
        "compressedBytes": found.compressed_size(),
        "collectedAt": timestamp(now),
    }
    if found.truncated:
        out["truncated"] = list(found.truncated)
    return out


def missing_status(message: str, now: datetime) -> dict[str, Any]:
    """``status.results`` when nothing could be kept: said once, never retried."""
    return {"message": message[:4096], "collectedAt": timestamp(now)}


def log_tail(text: str, limit: int) -> str:
    """The end of a launcher's log for an Event: without the ``run_results`` line (kilobytes of base64)
    and control characters, at most ``limit`` characters, whole lines where they fit."""
    lines = [line for line in text.splitlines() if f'"{bundle.EVENT}"' not in line[:40]]
    out = c.clean("\n".join(lines)).strip()
    if len(out) <= limit:
        return out
    cut = out[-limit:]
    return cut[cut.find("\n") + 1 :] if "\n" in cut[:-1] else cut
