"""The liveness probe of a replica that stands by, or leads and is still in kopf's first sync (kopf serves the
probe itself only after its startup handlers).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from mlbench_operator.elector import Elector
from mlbench_operator.env import SettingsError

SYNC_DEADLINE_SECONDS = 300.0


def syncing_verdict(leading_since: float | None, now: float, limit: float = SYNC_DEADLINE_SECONDS) -> str | None:
    """None: alive (standing by, or leading and in the first sync for no longer than ``limit``); else why not."""
    if leading_since is None or now - leading_since <= limit:
        return None
    return f"leading for {now - leading_since:.0f}s and the first sync is not done (limit {limit:.0f}s)"


async def serve_liveness(endpoint: str, elector: Elector) -> Callable[[], Awaitable[None]]:
    """Answer the liveness probe while standing by and, once this replica leads, during kopf's first sync
    (kopf serves the probe only after its startup handlers, the pod listing among them: the gap would fail a
    slow start). Returns the coroutine function that stops serving (once; before kopf binds the same port)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http":
        raise SettingsError(f"--liveness={endpoint!r}: only http:// is supported")

    async def health(_: web.Request) -> web.Response:
        why = syncing_verdict(elector.leading_since, time.monotonic())
        body = {"leader": elector.leading, "holder": elector.seen_holder, "lease": elector._lease_name()}
        return web.json_response({**body, "error": why} if why else body, status=500 if why else 200)

    app = web.Application()
    app.add_routes([web.get(parts.path or "/", health)])
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, parts.hostname or "localhost", parts.port or 80).start()
    stopped = False

    async def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            await runner.cleanup()

    return stop
