"""Best-effort live progress: scrape rank 0's Prometheus endpoint into ``status.progress``.

An unreachable endpoint is normal (starting up, network policy, a fake kwok pod) and never an
error; the status simply keeps its last progress. The endpoint is served by the user's image, so
the page is untrusted: at most :data:`MAX_RESPONSE_BYTES` are read within one timeout, the page is
parsed off the event loop by a parser that never raises, and every number is clamped to the bounds
of ``status.progress`` (``mlbench_api.runstatus.Progress``) so that the status patch is always accepted.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from mlbench_api.common import MAX_SAFE_INT
from mlbench_api.display import epoch, percent, score
from mlbench_api.goal import GoalMetric, known_metric
from mlbench_operator import logs
from mlbench_operator.conditions import timestamp

log = logs.get_logger()

#: At most this many bytes of rank 0's answer (status line, headers and page) are read; a runner's
#: page is a few KiB, and whatever follows the cap is ignored.
MAX_RESPONSE_BYTES = 256 * 1024
#: Seconds for the whole exchange: connect, request and the answer.
FETCH_TIMEOUT = 2.0

#: runner metric -> status.progress field (see runners/mlbench_runner/metrics.py)
FIELDS = {
    "mlbench_epoch": "epoch",
    "mlbench_steps": "step",
    "mlbench_accuracy": "lastAccuracy",
    "mlbench_score": "lastScore",
    "mlbench_samples_per_second": "samplesPerSecond",
}
#: status.progress field -> (minimum, maximum): the schema's bounds (``Progress`` in mlbench_api.runstatus).
BOUNDS: dict[str, tuple[float, float]] = {
    "epoch": (0.0, math.inf),
    "step": (0.0, float(MAX_SAFE_INT)),
    "lastAccuracy": (0.0, 1.0),
    "lastScore": (0.0, math.inf),
    "samplesPerSecond": (0.0, math.inf),
}
#: A sample line of the text exposition format: name, optional {labels} (values may hold '}'), value,
#: optional timestamp. Each character has one way to match, so a hostile line cannot make it backtrack.
_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*$',
)
#: Longest line looked at; longer ones (never a runner's) are skipped unparsed.
_MAX_LINE = 4096


def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def _clamp(key: str, value: float) -> float | int | None:
    """The value as ``status.progress`` can hold it; None for NaN and +-Infinity (not storable)."""
    if not math.isfinite(value):
        return None
    low, high = BOUNDS[key]
    value = min(max(value, low), high)
    return int(value) if key == "step" else round(value, 6)


def parse(text: str, now: datetime, metric: GoalMetric | None = None) -> dict[str, Any] | None:
    """``status.progress`` from a metrics page; None when it carries none of the fields. ``metric`` (the task's
    goal.metric) says how ``score``, the column's string, writes ``lastScore``.

    Never raises: lines that do not parse, other metrics and values that cannot be stored (NaN,
    Infinity, ``1e400``) are skipped; the first usable sample of each metric counts.
    """
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if len(out) == len(FIELDS):
            break
        if not line or line[0] == "#" or len(line) > _MAX_LINE:
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, token = match.groups()
        key = FIELDS.get(name.removesuffix("_total"))
        if key is None or key in out:
            continue
        number = _number(token)
        value = _clamp(key, number) if number is not None else None
        if value is not None:
            out[key] = value
    if not out:
        return None
    if "epoch" in out:
        out["epochRounded"] = epoch(out["epoch"])
    if "lastAccuracy" in out:
        out["accuracy"] = percent(out["lastAccuracy"])
    if "lastScore" in out and metric is not None:
        out["score"] = score(metric, out["lastScore"])
    out["updatedAt"] = timestamp(now)
    return out


async def fetch(host: str, port: int, timeout: float = FETCH_TIMEOUT) -> str | None:
    """GET http://host:port/metrics within ``timeout`` seconds in all; None on any failure.

    At most :data:`MAX_RESPONSE_BYTES` are read; a page cut there loses its last, partial line.
    """
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(f"GET /metrics HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain\r\n\r\n".encode())
                await writer.drain()
                raw = await _read_at_most(reader, MAX_RESPONSE_BYTES)
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return None
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
        return None
    if len(raw) >= MAX_RESPONSE_BYTES:
        body = body[: body.rfind(b"\n") + 1]  # cut at the cap: drop the partial last line
    return body.decode(errors="replace")


async def _read_at_most(reader: asyncio.StreamReader, limit: int) -> bytes:
    """The HTTP/1.0 answer (the server closes the connection), cut at ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await reader.read(min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def scrape(host: str, port: int, now: datetime, metric: GoalMetric | None = None) -> dict[str, Any] | None:
    """``status.progress`` from rank 0's metrics endpoint, or None; never raises (but lets a cancellation through).

    The page is parsed in a worker thread so that a large or pathological page never stalls the event loop.
    """
    try:
        text = await fetch(host, port)
        if not text:
            return None
        return await asyncio.to_thread(parse, text, now, metric)
    except Exception as err:  # best effort by design: no scrape problem may reach the handler
        log.debug("progress_scrape_failed", host=host, port=port, error=repr(err)[:200])
        return None


def goal_metric(status: Mapping[str, Any]) -> GoalMetric | None:
    """The goal metric of the run's task, from the snapshot its status keeps; None before admission took one."""
    snapshot = status.get("taskSnapshot")
    goal = snapshot.get("goal") if isinstance(snapshot, Mapping) else None
    value = goal.get("metric") if isinstance(goal, Mapping) else None
    return known_metric(value)


def advance(old: dict[str, Any] | None, new: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The scraped progress with ``stepChangedAt``: when the step counter last moved.

    Kept across scrapes while the counter stands still, so the reconciler can tell a run that is
    slow from one that is stuck (Stalled/NoProgress after ``runPolicy.progressDeadlineSeconds``).
    """
    out = dict(new)
    if "step" not in out:
        return out
    same = old is not None and old.get("step") == out["step"] and old.get("stepChangedAt")
    out["stepChangedAt"] = old["stepChangedAt"] if same and old is not None else timestamp(now)
    return out
