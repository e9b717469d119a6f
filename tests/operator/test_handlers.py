"""The kopf glue's own pieces that need no cluster: progress scraping, wake-ups."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import CollectorRegistry, Gauge


def test_timer_copies_rank0_metrics_into_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer's scrape against a real HTTP endpoint (a rank 0 stand-in on loopback)."""
    from prometheus_client import start_http_server

    from mlbench_operator import handlers
    from mlbench_operator.podview import PodView

    reg = CollectorRegistry()
    Gauge("mlbench_epoch", "e", registry=reg).set(7.25)
    Gauge("mlbench_accuracy", "a", registry=reg).set(0.61)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server, thread = start_http_server(port, addr="127.0.0.1", registry=reg)
    try:
        monkeypatch.setattr(handlers, "PROGRESS_PORT", port)
        rank0 = PodView(name="r-worker-0", role="worker", rank=0, attempt=0, ip="127.0.0.1")
        index = {("ns", "r"): [rank0]}
        value = asyncio.run(handlers.scrape_rank0("ns", "r", index))
        assert value is not None
        assert value["epoch"] == 7.25
        assert value["lastAccuracy"] == 0.61
        # unreachable (another port) or no rank 0 yet: no progress, nothing raises
        assert asyncio.run(handlers.scrape_rank0("ns", "other", index)) is None
        monkeypatch.setattr(handlers, "PROGRESS_PORT", 1)
        assert asyncio.run(handlers.scrape_rank0("ns", "r", index)) is None
    finally:
        server.shutdown()
        thread.join(timeout=5)


def test_wakeups_survive_a_recreated_run() -> None:
    """Two daemons for one name (old run finishing, new run starting): each keeps its own wake-up."""
    from mlbench_operator.handlers import Wakeups

    async def scenario() -> None:
        w = Wakeups()
        old, new = w.register(("ns", "r")), w.register(("ns", "r"))
        w.unregister(("ns", "r"), old)
        w.wake(("ns", "r"))
        assert new.is_set()
        assert not old.is_set()

    asyncio.run(scenario())
