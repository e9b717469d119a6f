"""The operator's kopf handlers: its own lifecycle (start, stop, probe), and the registration of both wings."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import kopf
from prometheus_client import start_http_server

from mlbench_api.common import GROUP
from mlbench_operator import __version__, liveness, logs
from mlbench_operator import naming as n
from mlbench_operator.env import SettingsError
from mlbench_operator.fetchjob import FETCH_SELECTOR
from mlbench_operator.kube import PAGE_SIZE, Kube
from mlbench_operator.nsgate import NamespaceGate
from mlbench_operator.podview import PodIndex
from mlbench_operator.podwatch import PodWatch
from mlbench_operator.run import handlers as run_handlers
from mlbench_operator.runtime import Wakeups
from mlbench_operator.settings import OperatorConfig
from mlbench_operator.sweep import handlers as sweep_handlers

log = logs.get_logger()

#: The memo key of the coroutine function that stops leader election's probe endpoint (see leader.run_elected).
STANDBY_PROBE = "stop_standby_probe"


# -- operator lifecycle ------------------------------------------------------------------------------
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Settings for the one active replica (the Lease holder), whose traces on objects are all under mlbench.io."""
    logs.configure()
    if not isinstance(memo.get("config"), OperatorConfig):  # no main.py (a test calling it directly)
        try:
            memo.config = OperatorConfig.from_env(os.environ)
        except SettingsError as err:  # permanent: kopf stops the operator with the variable named
            raise kopf.PermanentError(str(err)) from None
    config: OperatorConfig = memo.config
    settings.peering.standalone = True
    settings.scanning.disabled = True  # no CRD/namespace watching: less RBAC; CRDs exist before we start
    settings.persistence.finalizer = n.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Server-side filtering: watch only the operator's Jobs (and pods: PodWatch), not every one in the cluster.
    settings.watching.label_selectors["batch", "jobs"] = FETCH_SELECTOR
    # Optional: serve only runs matching a label selector (e.g. one test session on a shared cluster).
    run_selector = config.run_selector
    if run_selector:
        settings.watching.label_selectors[GROUP, run_handlers.PLURAL] = run_selector
    settings.posting.level = 100  # only the explicit kopf.event/info/warning calls become Events
    settings.watching.server_timeout = 300
    settings.watching.chunk_size = PAGE_SIZE  # kopf's initial listings (runs, sweeps, Jobs) in pages too
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    memo.kube = memo.get("kube") or Kube(create_slots=config.create_slots)
    memo.wakeups = Wakeups()
    memo.pods = PodIndex()
    loop = asyncio.get_running_loop()
    memo.pod_watches = [
        PodWatch(
            memo.kube,
            memo.pods,
            memo.wakeups,
            loop,
            namespace=ns,
            timeout_seconds=int(settings.watching.server_timeout or 300),
        )
        for ns in (config.namespaces or (None,))
    ]
    for watch in memo.pod_watches:
        watch.start()
    # kopf starts watching runs once the startup handlers are done: their daemons find every pod listed
    if config.namespaces:  # each namespace within a bound; kopf watches only the readable ones (nsgate)
        gate = NamespaceGate(
            memo.kube, memo.pod_watches, memo.get("insights"), memo.get("reporter"), config.namespace_sync_seconds
        )
        await gate.settle()
        memo.namespace_gate = asyncio.create_task(gate.run(), name="namespace gate")
    else:
        await asyncio.gather(*(watch.synced.wait() for watch in memo.pod_watches))
    port = config.metrics_port
    if port and not memo.get("metrics_started"):
        start_http_server(port)
        memo.metrics_started = True
    standby_probe = memo.get(STANDBY_PROBE)
    if standby_probe is not None:  # leader election answered the probe through the sync: kopf serves it next
        await standby_probe()
    log.info("operator_started", metrics_port=port, version=_version(), run_selector=run_selector or None)


async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    gate = memo.get("namespace_gate")
    if gate is not None:
        gate.cancel()
    for watch in memo.get("pod_watches") or ():
        watch.stop()
    kube = memo.get("kube")
    if isinstance(kube, Kube) and memo.get("owns_kube", True):
        kube.close()


async def api_progress(memo: kopf.Memo, **_: Any) -> dict[str, float]:
    """Liveness: the event loop answers (this runs on it) and the API pool makes progress while it has work
    (:func:`.liveness.verdict`; the probe answers at once, whatever the queue's depth).

    A pool whose threads are all stuck (a hung call on every thread) would leave every run waiting while
    kopf's own endpoint stays green; failing the probe makes Kubernetes restart us, and the state lives in
    the resources, so a restart resumes every run. A pool busy with a long fan-out is not stuck.
    """
    kube = memo.get("kube")
    if not isinstance(kube, Kube):
        return {}
    snapshot = kube.progress.snapshot()
    now = kube.progress.now()
    why = liveness.verdict(snapshot, now)
    if why is not None:  # permanent: kopf answers the probe with HTTP 500 at once instead of retrying the handler
        raise kopf.PermanentError(f"the API thread pool: {why}")
    return {"pending": snapshot.pending, "idleSeconds": round(now - snapshot.since, 1)}


def _version() -> str:
    return __version__


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """The operator's own handlers, then each wing's, on ``registry`` (:mod:`.main` gives a fresh one)."""
    kopf.on.login(registry=registry)(kopf.login_via_client)  # what kopf's default registry would have
    kopf.on.startup(registry=registry)(configure)
    kopf.on.cleanup(registry=registry)(shutdown)
    kopf.on.probe(id="api_pool", registry=registry)(api_progress)
    run_handlers.register(registry, config)
    sweep_handlers.register(registry)
