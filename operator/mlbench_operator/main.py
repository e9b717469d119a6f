"""``mlbench-operator``: the kopf operator (as ``kopf run -m mlbench_operator.handlers -A``) behind a leader Lease."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import kopf


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mlbench-operator", description=__doc__)
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("MLBENCH_METRICS_PORT", "8080")),
        help="Prometheus metrics port (0 disables; default 8080 or $MLBENCH_METRICS_PORT)",
    )
    parser.add_argument(
        "--selector",
        default=os.environ.get("MLBENCH_RUN_SELECTOR", ""),
        help="serve only BenchmarkRuns matching this label selector (default: all; $MLBENCH_RUN_SELECTOR)",
    )
    parser.add_argument(
        "--liveness",
        default=os.environ.get("MLBENCH_LIVENESS", "http://0.0.0.0:8081/healthz"),
        help="kopf liveness endpoint URL ('' disables)",
    )
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="hold a coordination.k8s.io Lease before reconciling, so that of several replicas exactly one "
        "is active (default on; $MLBENCH_LEADER_ELECT; Lease $MLBENCH_LEADER_ELECTION_ID in "
        "$MLBENCH_LEADER_ELECTION_NAMESPACE or $POD_NAMESPACE, see docs/operator.md)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["MLBENCH_METRICS_PORT"] = str(args.metrics_port)
    os.environ["MLBENCH_RUN_SELECTOR"] = args.selector
    from mlbench_operator import handlers, leader, logs
    from mlbench_operator import metrics as m
    from mlbench_operator.netpol import scraper_namespaces
    from mlbench_operator.policy import AdmissionPolicy
    from mlbench_operator.settings import DatasetSettings, SettingsError, metrics_linger_seconds, results_wait_seconds

    try:  # a bad MLBENCH_DATASET_* stops the operator here, named, not at the first run's PVC
        DatasetSettings.from_env(os.environ)
        metrics_linger_seconds(os.environ)
        results_wait_seconds(os.environ)
        AdmissionPolicy.from_env(os.environ)
        scraper_namespaces(os.environ)
        election = leader.LeaderSettings.from_env(os.environ, enabled=args.leader_elect)
    except SettingsError as err:
        print(f"mlbench-operator: {err}", file=sys.stderr)
        return 2
    logs.configure()
    del handlers  # imported for its kopf registrations
    # Metrics from the start, also while standing by (handlers.configure sees memo.metrics_started).
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    memo = kopf.Memo(metrics_started=bool(args.metrics_port))

    async def run_operator(stop_flag: asyncio.Event | None = None) -> None:
        """kopf.operator(), spelled out: with a stop flag, SIGTERM raises the flag instead of going to
        kopf's own handler, which would leave kopf's waiter for the flag hanging (5 s) at the exit."""
        current = asyncio.current_task()
        existing = {t for t in asyncio.all_tasks() if t is not current}
        tasks = await kopf.spawn_tasks(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=list(args.namespace),
            liveness_endpoint=args.liveness or None,
            stop_flag=stop_flag,
            memo=memo,
        )
        if stop_flag is not None:
            leader.on_signals(stop_flag)  # replaces the handlers kopf.spawn_tasks installed
        await kopf.run_tasks(tasks, ignored=existing)

    try:
        if election.enabled:
            return asyncio.run(leader.run_elected(run_operator, election, liveness=args.liveness or None))
        m.LEADER.set(1)  # the only replica, by the user's word
        asyncio.run(run_operator())
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
