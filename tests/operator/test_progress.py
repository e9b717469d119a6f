"""Progress scraping: parse a runner-style metrics page; unreachable endpoints are quiet."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from mlbench_operator import progress


def test_parse_runner_metrics() -> None:
    reg = CollectorRegistry()
    Gauge("mlbench_epoch", "e", registry=reg).set(3.5)
    Counter("mlbench_steps", "s", registry=reg).inc(120)
    Gauge("mlbench_accuracy", "a", registry=reg).set(0.42)
    Gauge("mlbench_samples_per_second", "t", registry=reg).set(250.25)
    Gauge("mlbench_loss", "l", registry=reg).set(1.2)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    out = progress.parse(generate_latest(reg).decode(), now)
    assert out == {
        "epoch": 3.5,
        "step": 120,
        "lastAccuracy": 0.42,
        "samplesPerSecond": 250.25,
        "updatedAt": "2026-01-01T00:00:00Z",
    }


def test_parse_nothing_useful() -> None:
    assert progress.parse("# nothing here\nother_metric 1\n", datetime.now(UTC)) is None


def test_unreachable_endpoint_is_none() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connection refused
        assert asyncio.run(progress.fetch("127.0.0.1", port, timeout=1)) is None
