"""Leader election on a ``coordination.k8s.io/v1`` Lease: of N replicas, exactly one reconciles.

The semantics are client-go's (``k8s.io/client-go/tools/leaderelection``), in rooms:

* pure, clock-injected: :class:`.leadersettings.LeaderSettings` (from the environment) and
  :mod:`.leasedecision` (observe, decide, release_spec);
* thin glue: :mod:`.leaseapi` (the one Lease's GET/POST/PUT), :mod:`.elector` (the acquire and renew loops),
  :mod:`.leaderprobe` (the standby's liveness endpoint) and, here, :func:`run_elected` (wait for the Lease,
  then run kopf beside the renew loop; stop kopf and exit non-zero when renewals fail for the renew
  deadline; release the Lease on a clean stop so that the standby takes over at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Awaitable, Callable

from mlbench_operator import logs
from mlbench_operator import metrics as m
from mlbench_operator.elector import Elector
from mlbench_operator.leaderprobe import serve_liveness
from mlbench_operator.leadersettings import LeaderSettings
from mlbench_operator.leaseapi import LeaseApi, LeaseClient

log = logs.get_logger("mlbench_operator.leader")


def on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (the standby's way out, and kopf's stop flag while leading)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # RuntimeError: not the main thread
            loop.add_signal_handler(sig, stop.set)


class Watchdog:
    """client-go's leaders exit when they lose the Lease: should stopping kopf take longer than what
    is left of the other replicas' wait, end the process anyway (exit status 1)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        def hard_exit() -> None:
            log.error("leader_lost_exit", reason=f"the operator did not stop within {self.seconds:g}s")
            os._exit(1)

        self._timer = threading.Timer(self.seconds, hard_exit)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


async def run_elected(
    run_operator: Callable[[asyncio.Event], Awaitable[None]],
    settings: LeaderSettings,
    liveness: str | None = None,
    client: LeaseClient | None = None,
    stop: asyncio.Event | None = None,
    *,
    handover: Callable[[Callable[[], Awaitable[None]]], None] = lambda _stop: None,
) -> int:
    """Stand by until this replica holds the Lease, then ``run_operator(stop_flag)`` (kopf) while
    renewing it. Once leading, the standby's liveness endpoint keeps answering through kopf's first sync:
    ``handover`` gets the coroutine function that stops it (see :func:`serve_liveness`; called again, for
    sure, at the end). The exit status: 0 after a clean stop (SIGTERM; the Lease released), 1 when the
    Lease was lost (the Deployment restarts the pod, which stands by again)."""
    stop = stop or asyncio.Event()  # SIGTERM sets it while standing by; kopf's stop_flag while leading
    on_signals(stop)
    elector = Elector(client or LeaseApi(settings.namespace, settings.name, settings.renew_deadline / 2), settings)
    m.LEADER.set(0)
    log.info(
        "leader_election_started",
        identity=settings.identity,
        lease=f"{settings.namespace}/{settings.name}",
        lease_duration=settings.lease_duration,
        renew_deadline=settings.renew_deadline,
        retry_period=settings.retry_period,
    )
    stop_liveness: Callable[[], Awaitable[None]] | None = None
    try:
        stop_liveness = await serve_liveness(liveness, elector) if liveness else None
        acquired = await elector.acquire(stop)
        if not acquired:
            log.info("leader_election_stopped", identity=settings.identity, leading=False)
            return 0
        if stop_liveness is not None:
            handover(stop_liveness)  # the startup handler stops it when kopf is about to serve the probe
        grace = max(1.0, settings.lease_duration - settings.renew_deadline - settings.retry_period)
        watchdog = Watchdog(grace)
        renewer = asyncio.create_task(elector.renew(stop, watchdog.arm), name="leader-renew")
        try:
            await run_operator(stop)
        finally:
            watchdog.cancel()  # kopf has stopped
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            on_signals(stop)  # in case run_operator installed its own: a second SIGTERM must not cut the release
            if not elector.lost:
                await elector.release()
    finally:
        if stop_liveness is not None:
            await stop_liveness()
        elector.close()
    if elector.lost:
        return 1
    return 0
