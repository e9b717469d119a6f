"""The operator's own Prometheus metrics (served on ``--metrics-port``, default 8080)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PHASES = ("Pending", "Starting", "Running", "Succeeded", "Failed")

RUNS = Gauge("mlbench_operator_runs", "BenchmarkRuns known to the operator, by phase.", ["phase"])
RECONCILES = Counter("mlbench_operator_reconciles_total", "Reconcile passes over a BenchmarkRun.")
RECONCILE_ERRORS = Counter(
    "mlbench_operator_reconcile_errors_total", "Reconcile passes that raised (retried with backoff).", ["error"]
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
RESTARTS = Counter("mlbench_operator_gang_restarts_total", "Gang restarts of a run's world after a failure.")

_phases: dict[tuple[str, str], str] = {}


def track_phase(key: tuple[str, str], phase: str | None, deleted: bool = False) -> None:
    """Record a run's phase (from its watch events) and refresh the by-phase gauge."""
    if deleted:
        _phases.pop(key, None)
    else:
        _phases[key] = phase or "Pending"
    for p in PHASES:
        RUNS.labels(p).set(sum(1 for v in _phases.values() if v == p))
