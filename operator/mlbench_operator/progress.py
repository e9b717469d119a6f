"""Best-effort live progress: scrape rank 0's Prometheus endpoint into ``status.progress``.

An unreachable endpoint is normal (starting up, network policy, a fake kwok pod) and never an
error; the status simply keeps its last progress.
"""

from __future__ import annotations

import asyncio
import math
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from mlbench_operator.conditions import timestamp

#: runner metric -> status.progress field (see runners/mlbench_runner/metrics.py)
FIELDS = {
    "mlbench_epoch": "epoch",
    "mlbench_steps": "step",
    "mlbench_accuracy": "lastAccuracy",
    "mlbench_samples_per_second": "samplesPerSecond",
}


def parse(text: str, now: datetime) -> dict[str, Any] | None:
    """``status.progress`` from a metrics page; None when it carries none of the fields."""
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(text):
        key = FIELDS.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total") and math.isfinite(sample.value):
                value = max(sample.value, 0.0)
                out[key] = int(value) if key == "step" else round(value, 6)
                break
    if "lastAccuracy" in out:
        out["lastAccuracy"] = min(out["lastAccuracy"], 1.0)
    if not out:
        return None
    out["updatedAt"] = timestamp(now)
    return out


async def fetch(host: str, port: int, timeout: float = 2.0) -> str | None:
    """GET http://host:port/metrics with a hard timeout; None on any failure."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(f"GET /metrics HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(_read_all(reader, limit=4 * 1024 * 1024), timeout)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.") or b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
        return None
    return body.decode(errors="replace")


async def _read_all(reader: asyncio.StreamReader, limit: int) -> bytes:
    """The whole HTTP/1.0 answer (the server closes the connection), at most ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await reader.read(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
