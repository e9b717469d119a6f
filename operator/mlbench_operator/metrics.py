"""The operator's own Prometheus metrics (served on ``--metrics-port``, default 8080)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

from mlbench_api.runstatus import Phase

PHASES = tuple(p.value for p in Phase)  #: the run phases, in lifecycle order

RUNS = Gauge("mlbench_operator_runs", "BenchmarkRuns known to the operator, by phase.", ["phase"])
#: ``kind`` of the reconcile counters: whose pass it was (a sweep's failing passes are no run's).
RUN_KIND, SWEEP_KIND = "benchmarkrun", "benchmarksweep"
RECONCILES = Counter(
    "mlbench_operator_reconciles_total", "Reconcile passes over a BenchmarkRun or a BenchmarkSweep.", ["kind"]
)
RECONCILE_ERRORS = Counter(
    "mlbench_operator_reconcile_errors_total",
    "Reconcile passes that raised (retried with backoff), by the kind of object and the error's type.",
    ["kind", "error"],
)
WORKERS_READY_SECONDS = Histogram(
    "mlbench_operator_workers_ready_seconds",
    "Seconds from a run's creation until all its workers were Ready (first attempt).",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600),
)
API_REQUESTS = Counter(
    "mlbench_operator_api_requests_total",
    "Kubernetes API requests made by the reconciler (kopf's own watches excluded).",
    ["verb", "resource", "code"],
)
WATCH_EVENTS = Counter(
    "mlbench_operator_watch_events_total",
    "Watch events kopf handed to the operator's handlers, by resource (pods: about 3 per worker started).",
    ["resource"],
)
RUN_PHASE = Gauge(
    "mlbench_operator_run_status_phase",
    "1 for a run's current phase, 0 for the others (like kube_pod_status_phase); gone with the run.",
    ["namespace", "run", "task", "phase"],
)
RUN_SERVES_METRICS = Gauge(
    "mlbench_operator_run_serves_metrics",
    "1 when a run's ranks serve Prometheus metrics (the reference runner), 0 when its task runs its own program "
    "(no metrics asked of it: the rank alerts leave it alone); set once the run is admitted, gone with the run.",
    ["namespace", "run"],
)
NAMESPACE_READY = Gauge(
    "mlbench_operator_namespace_ready",
    "With --namespace (the namespaced install): 1 while the operator serves a watched namespace, 0 while it cannot "
    "read it (its RoleBinding deleted, the namespace missing, or no listing within MLBENCH_NAMESPACE_SYNC_SECONDS).",
    ["namespace"],
)
RESTARTS = Counter("mlbench_operator_gang_restarts_total", "Gang restarts of a run's world after a failure.")
LEADER = Gauge(
    "mlbench_operator_leader",
    "1 while this replica holds the leader-election Lease and reconciles, 0 while it stands by.",
)
LEADER_WAITING_FOR = Gauge(
    "mlbench_operator_leader_waiting_for",
    "While this replica stands by: the Lease's renewTime (Unix seconds, the holder's clock; 0 when it has none), "
    "labelled with the holder it waits for. No series while it leads or no one holds the Lease.",
    ["holder"],
)

_phases: dict[tuple[str, str], str] = {}
_tasks: dict[tuple[str, str], str] = {}


def track_phase(
    key: tuple[str, str], phase: str | None, deleted: bool = False, task: str = "", serves_metrics: bool | None = None
) -> None:
    """Record a run's phase (from its watch events) and refresh the by-phase gauges; ``serves_metrics``
    (None: not admitted yet, unknown) feeds :data:`RUN_SERVES_METRICS`."""
    namespace, run = key
    if deleted:
        with contextlib.suppress(KeyError):  # never set: not admitted
            RUN_SERVES_METRICS.remove(namespace, run)
    elif serves_metrics is not None:
        RUN_SERVES_METRICS.labels(namespace, run).set(1 if serves_metrics else 0)
    old_task = _tasks.pop(key, None)
    if old_task is not None and (deleted or old_task != task):
        for p in PHASES:
            RUN_PHASE.remove(namespace, run, old_task, p)
    if deleted:
        _phases.pop(key, None)
    else:
        current = phase or "Pending"
        _phases[key] = current
        _tasks[key] = task
        for p in PHASES:
            RUN_PHASE.labels(namespace, run, task, p).set(1 if p == current else 0)
    for p in PHASES:
        RUNS.labels(p).set(sum(1 for v in _phases.values() if v == p))
