"""The run's kopf handlers: thin glue that feeds observations to the executor (:mod:`.executor`), which plans
(:mod:`.policies`) and carries the plan out.

* :class:`~mlbench_operator.podwatch.PodWatch` (started by :func:`mlbench_operator.handlers.configure`) lists
  and watches the operator's pods into a :class:`~mlbench_operator.podview.PodIndex` by run (``memo.pods``)
  and wakes the run's daemon at each change.
* ``run_event`` (and a fetch Job's ``fetch_job_event``) wake the run's reconciler too (no polling:
  events drive status).
* ``reconcile_run`` (daemon, one per unfinished run; resumed on operator start; the loop of
  :func:`mlbench_operator.runtime.daemon`) admits the run once, then loops: plan from (run, pods, now) ->
  execute -> sleep until woken. Bursts of pod events coalesce into one pass, so 1000 workers do not mean
  1000 status writes.
* ``scrape_progress`` (timer) copies rank 0's metrics into ``status.progress`` while Running.

Configuration: an :class:`~mlbench_operator.settings.OperatorConfig` in the operator memo (``memo.config``),
put there by :mod:`mlbench_operator.main`. Registration is explicit: :func:`register` puts these handlers on
the registry that :mod:`mlbench_operator.main` gives kopf (nothing registers at import). Pacing (how soon a
run's daemon may create or delete again) is :class:`~mlbench_operator.pacing.Pacing`, fed ``time.monotonic()``
by the executor.

One active replica: the Deployment runs two pods, and only the holder of the ``mlbench-operator`` Lease runs
kopf (:mod:`mlbench_operator.leader`, started by :mod:`mlbench_operator.main`); kopf itself runs standalone
(no peering). kopf's own bookkeeping lives under ``mlbench.io`` annotations/finalizer.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import kopf

from mlbench_api import contract
from mlbench_api.common import GROUP, VERSION
from mlbench_api.goal import GoalMetric
from mlbench_api.runstatus import TERMINAL
from mlbench_operator import logs, progress, runtime
from mlbench_operator import metrics as m
from mlbench_operator import naming as n
from mlbench_operator.kube import Kube
from mlbench_operator.podview import PodIndex
from mlbench_operator.run import lifecycle, results, suspension
from mlbench_operator.run.executor import RunReconciler
from mlbench_operator.run.status import generation_patch, serves_metrics
from mlbench_operator.runtime import config_of, pods_of
from mlbench_operator.settings import OperatorConfig
from mlbench_operator.sweep import plan

log = logs.get_logger()


def _now() -> datetime:
    return datetime.now(UTC)


PLURAL = "benchmarkruns"


#: A sweep's run whose TTL expired before the sweep wrote down how it ended: look again this often
#: (the run's last phase change wakes the sweep at once, so this is rarely more than one wait).
SWEEP_RECORD_POLL_SECONDS = 1.0


#: Rank 0's metrics port on worker 0 (RunConfig.metricsPort + local rank 0).
PROGRESS_PORT = contract.METRICS_PORT


async def fetch_job_event(namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """A dataset fetch Job progressed: wake the namespace's runs (those waiting for it re-read it)."""
    m.WATCH_EVENTS.labels("jobs").inc()
    memo.wakeups.wake_namespace(namespace or "")


async def run_event(
    *,
    type: str,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    spec: kopf.Spec,
    status: kopf.Status,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    m.WATCH_EVENTS.labels(PLURAL).inc()
    key = (namespace or "", name)
    task = (spec.get("taskRef") or {}).get("name", "")
    serves = serves_metrics(status)
    m.track_phase(key, status.get("phase"), deleted=type == "DELETED", task=task, serves_metrics=serves)
    memo.wakeups.wake(key)
    if type != "DELETED":
        stale = generation_patch(body)
        if stale is not None:  # a finished run's runPolicy was edited: its daemon has stopped
            await memo.kube.run(memo.kube.patch_run_status, namespace or "", name, stale)


# -- the reconciler ----------------------------------------------------------------------------------------
def _needs_daemon(body: kopf.Body, namespace: str | None, name: str, **kwargs: Any) -> bool:
    """Runs this operator manages (spec.managedBy): unfinished runs, and finished ones whose results are not yet
    kept or whose cleanPodPolicy still wants pods deleted (e.g. the operator died between writing the final
    status and deleting the pods), or whose cleanup is not recorded yet (it died between deleting the pods and
    saying so)."""
    status = body.get("status") or {}
    if not suspension.managed_here(body.get("spec") or {}):
        return False  # spec.managedBy names another controller
    if status.get("phase") not in TERMINAL:
        return True
    pods = pods_of(kwargs.get("memo"), (namespace or "", name))
    if lifecycle.cleanup_unrecorded(body, pods):
        return True
    if not pods:
        return False
    uid = body.get("metadata", {}).get("uid", "")
    launcher = results.launcher(pods, uid, status)  # results are only worth a daemon while the launcher is there
    wait = results.wait_for(config_of(kwargs.get("memo")).results_wait_seconds, (body.get("spec") or {}).get("network"))
    pending = launcher is not None and results.decide(status, launcher, _now(), wait).action is not results.Action.NONE
    return pending or bool(lifecycle.cleanup_pending(body, pods))


def _waits_for_ttl(status: kopf.Status, spec: kopf.Spec, **_: Any) -> bool:
    """Finished runs with ttlSecondsAfterFinished (also when it was set after the run finished)."""
    return status.get("phase") in TERMINAL and (spec.get("runPolicy") or {}).get("ttlSecondsAfterFinished") is not None


async def reconcile_run(
    *,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: kopf.Memo,
    logger: Any,
    stopped: kopf.DaemonStopped,
    **kwargs: Any,
) -> None:
    """The run's reconcile loop; event-driven (woken by pod/run events), resumed after operator restarts.

    A pass with nothing left to do (a finished run, cleaned up, results kept) does not end the loop: it
    waits to be woken. kopf never spawns again a daemon that returned on its own, so a cleanPodPolicy
    edited after the run finished would go unheeded until the operator restarts. kopf stops the daemon
    when :func:`_needs_daemon` no longer holds, and spawns it again when it does."""
    key = (namespace or "", name)
    config = config_of(memo)
    rec = RunReconciler(body, memo.kube, logger, config)
    rec.index = getattr(memo, "pods", None)
    await runtime.daemon(
        memo.wakeups,
        key,
        stopped,
        kind=m.RUN_KIND,
        step=lambda: rec.step(pods_of(memo, key)),
        recover=lambda: rec.recover(body.get("status") or {}),
        log=rec.log,
        debounce=config.debounce_seconds,
        done_when_idle=False,
    )


async def expire_run(
    *, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    """ttlSecondsAfterFinished: delete the finished run when it expires. A daemon of its own, spawned
    whenever the filter starts to match, so a TTL added (or changed) after the run finished counts."""
    kube: Kube = memo.kube
    resync = config_of(memo).resync_seconds
    polls = 0  # looks at the sweep so far: a sweep that never records (invalid since) is asked less and less often
    while not stopped:
        ttl = (body.get("spec", {}).get("runPolicy") or {}).get("ttlSecondsAfterFinished")
        left = lifecycle.ttl_expired(body.get("status") or {}, ttl, _now())
        if left is None:  # not finished / no TTL any more: kopf stops us on the next event
            await stopped.wait(resync)
            continue
        if left > 0:
            await stopped.wait(min(left, 60.0))  # the live body may change the TTL meanwhile
            continue
        if not await _sweep_recorded(kube, namespace or "", body):
            if not polls:
                log.info("run_ttl_waits_for_sweep", run=name, namespace=namespace, ttl=ttl)
            await stopped.wait(sweep_poll_seconds(polls, resync))
            polls += 1
            continue
        log.info("run_ttl_expired", run=name, namespace=namespace, ttl=ttl)
        await kube.run(kube.delete_run, namespace or "", name)
        return


def sweep_poll_seconds(polls: int, resync: float) -> float:
    """The wait before looking at a sweep again after ``polls`` looks found the run's outcome unrecorded: 1 s, then
    doubling up to ``resync``. The sweep records at once on the run's last phase change, so the first wait is
    the usual one; a sweep that does not (made invalid by an upgrade: it stops writing) is not asked every second
    by each of its expired runs for as long as it stays so."""
    return min(SWEEP_RECORD_POLL_SECONDS * 2.0 ** min(polls, 30), max(resync, SWEEP_RECORD_POLL_SECONDS))


async def _sweep_recorded(kube: Kube, namespace: str, body: kopf.Body) -> bool:
    """A sweep's run: whether its sweep has written down how it ended (:func:`.sweep.plan.outcome_recorded`)."""
    sweep_name = plan.sweep_of(body)
    if not sweep_name:
        return True
    return plan.outcome_recorded(await kube.run(kube.get, "BenchmarkSweep", namespace, sweep_name), body)


# -- progress ------------------------------------------------------------------------------------------------
def _is_running(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") == "Running"


async def scrape_rank0(
    namespace: str, name: str, pods: PodIndex, uid: str, attempt: int, *, metric: GoalMetric | None = None
) -> dict[str, Any] | None:
    """``status.progress`` from rank 0 (worker 0 of the run's current attempt, :func:`lifecycle.rank0`); None
    when unreachable (kwok, start-up) or empty."""
    rank0 = lifecycle.rank0(pods.get((namespace, name)), uid, attempt)
    if rank0 is None or rank0.ip is None:
        return None
    return await progress.scrape(rank0.ip, PROGRESS_PORT, _now(), metric)


async def scrape_progress(
    *,
    namespace: str | None,
    name: str,
    uid: str | None,
    status: kopf.Status,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Live progress while Running; an unreachable endpoint just means no update. Written only if the run
    is still Running in the same attempt when the scrape returns (:meth:`Kube.patch_running_progress`)."""
    restarts = status.get("restarts")
    ns = namespace or ""
    metric = progress.goal_metric(status)
    value = await scrape_rank0(ns, name, memo.get("pods") or PodIndex(), uid or "", int(restarts or 0), metric=metric)
    if value is None:
        return
    kube: Kube = memo.kube
    new = progress.advance(status.get("progress"), value, _now())
    if not await kube.run(kube.patch_running_progress, ns, name, new, restarts):
        log.info("progress_dropped", run=name, namespace=ns, reason="the run is no longer Running in that attempt")


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """The run's handlers on ``registry`` (:func:`mlbench_operator.handlers.register` calls it)."""
    kopf.on.event(
        "batch", "v1", "jobs", labels={n.LABEL_DATASET: kopf.PRESENT, n.LABEL_MANAGED_BY: n.MANAGER}, registry=registry
    )(fetch_job_event)
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(run_event)
    kopf.daemon(
        GROUP, VERSION, PLURAL, when=_needs_daemon, cancellation_backoff=5, cancellation_timeout=5, registry=registry
    )(reconcile_run)
    kopf.daemon(GROUP, VERSION, PLURAL, when=_waits_for_ttl, cancellation_timeout=5, registry=registry)(expire_run)
    kopf.timer(
        GROUP,
        VERSION,
        PLURAL,
        interval=config.progress_seconds,
        initial_delay=min(15.0, config.progress_seconds),
        when=_is_running,
        registry=registry,
    )(scrape_progress)
