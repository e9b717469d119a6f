"""The operator's kopf handlers: its own lifecycle (start, stop, probe), and the registration of both wings."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import kopf
from prometheus_client import start_http_server

from mlbench_api.common import GROUP
from mlbench_operator import __version__, logs
from mlbench_operator import naming as n
from mlbench_operator.env import SettingsError
from mlbench_operator.kube import Kube
from mlbench_operator.podview import PodIndex
from mlbench_operator.podwatch import PodWatch
from mlbench_operator.run import handlers as run_handlers
from mlbench_operator.runtime import Wakeups
from mlbench_operator.settings import OperatorConfig
from mlbench_operator.sweep import handlers as sweep_handlers

log = logs.get_logger()


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
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Server-side filtering: watch only the operator's Jobs (and pods: PodWatch), not every one in the cluster.
    settings.watching.label_selectors["batch", "jobs"] = f"{n.LABEL_MANAGED_BY}={n.MANAGER},{n.LABEL_DATASET}"
    # Optional: serve only runs matching a label selector (e.g. one test session on a shared cluster).
    run_selector = config.run_selector
    if run_selector:
        settings.watching.label_selectors[GROUP, run_handlers.PLURAL] = run_selector
    settings.posting.level = 100  # only the explicit kopf.event/info/warning calls become Events
    settings.watching.server_timeout = 300
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    memo.kube = memo.get("kube") or Kube()
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
    await asyncio.gather(*(watch.synced.wait() for watch in memo.pod_watches))
    port = config.metrics_port
    if port and not memo.get("metrics_started"):
        start_http_server(port)
        memo.metrics_started = True
    log.info("operator_started", metrics_port=port, version=_version(), run_selector=run_selector or None)


async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    for watch in memo.get("pod_watches") or ():
        watch.stop()
    kube = memo.get("kube")
    if isinstance(kube, Kube) and memo.get("owns_kube", True):
        kube.close()


#: A liveness probe whose no-op call on the API thread pool does not return in this time fails.
PROBE_SECONDS = 10.0


async def api_pool_alive(memo: kopf.Memo, **_: Any) -> bool:
    """Liveness: the event loop answers (this runs on it) and the API pool still runs tasks.

    A pool whose threads are all stuck (a hung API call on every thread) would leave every run
    waiting while kopf's own endpoint stays green; failing the probe makes Kubernetes restart us,
    and the state lives in the resources, so a restart resumes every run.
    """
    kube = memo.get("kube")
    if not isinstance(kube, Kube):
        return True
    try:
        return await asyncio.wait_for(kube.run(bool, 1), PROBE_SECONDS)
    except TimeoutError:
        # permanent: kopf answers the probe with HTTP 500 at once instead of retrying the handler
        raise kopf.PermanentError(f"the API thread pool ran no task in {PROBE_SECONDS:.0f}s: stuck") from None


def _version() -> str:
    return __version__


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """The operator's own handlers, then each wing's, on ``registry`` (:mod:`.main` gives a fresh one)."""
    kopf.on.login(registry=registry)(kopf.login_via_client)  # what kopf's default registry would have
    kopf.on.startup(registry=registry)(configure)
    kopf.on.cleanup(registry=registry)(shutdown)
    kopf.on.probe(id="api_pool", registry=registry)(api_pool_alive)
    run_handlers.register(registry, config)
    sweep_handlers.register(registry)
