"""``mlbench-operator``: the kopf operator (the handlers of :func:`.handlers.register`) behind a leader Lease."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import os
import re
import sys

import kopf
from kopf._cogs.structs import references  # Insights: the namespaces kopf watches (no public name for it)
from prometheus_client import start_http_server

from mlbench_operator import handlers, leader, leadersettings, leaseapi, logs, nsready
from mlbench_operator import metrics as m
from mlbench_operator.env import SettingsError
from mlbench_operator.settings import OperatorConfig


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
        default=None,
        help="Prometheus metrics port (0 disables; default 8080 or $MLBENCH_METRICS_PORT)",
    )
    parser.add_argument(
        "--selector",
        default=None,
        help="serve only BenchmarkRuns and BenchmarkSweeps matching this label selector "
        "(default: all; $MLBENCH_RUN_SELECTOR)",
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


log = logs.get_logger()

#: kopf's namespaces in the namespaced install: a pattern no namespace matches, so that kopf itself watches none
#: (with scanning off, it lists no namespaces to match it against); the gate (:mod:`.nsgate`) hands it the
#: readable ones through ``memo.insights``.
NO_NAMESPACE = re.compile(r"(?!)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # a bad MLBENCH_* stops the operator here, named, not at the first run's PVC
        config = OperatorConfig.from_env(os.environ)
        election = leadersettings.LeaderSettings.from_env(os.environ, enabled=args.leader_elect)
    except SettingsError as err:
        print(f"mlbench-operator: {err}", file=sys.stderr)
        return 2
    # The flags win over their environment variables.
    if args.metrics_port is not None:
        config = dataclasses.replace(config, metrics_port=args.metrics_port)
    if args.selector is not None:
        config = dataclasses.replace(config, run_selector=args.selector.strip())
    config = dataclasses.replace(config, namespaces=tuple(args.namespace))
    logs.configure()
    registry = kopf.OperatorRegistry()  # ours alone, filled here: nothing registers at import
    handlers.register(registry, config)
    # Metrics from the start, also while standing by (handlers.configure sees memo.metrics_started).
    if config.metrics_port:
        start_http_server(config.metrics_port)
    # The handlers read their configuration from here (memo.config), not from os.environ; kopf gives
    # every resource's memo a shallow copy of this one.
    lease = (election.namespace, election.name) if election.enabled else None
    pod = (os.environ.get("POD_NAMESPACE", ""), os.environ.get("POD_NAME", ""))
    memo = kopf.Memo(metrics_started=bool(config.metrics_port), config=config, reporter=nsready.reporter(lease, pod))

    async def run_operator(stop_flag: asyncio.Event | None = None) -> None:
        """kopf.operator(), spelled out: with a stop flag, SIGTERM raises the flag instead of going to
        kopf's own handler, which would leave kopf's waiter for the flag hanging (5 s) at the exit."""
        current = asyncio.current_task()
        existing = {t for t in asyncio.all_tasks() if t is not current}
        memo.insights = references.Insights()  # what kopf watches: with --namespace, the gate's to fill
        tasks = await kopf.spawn_tasks(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=[NO_NAMESPACE] if args.namespace else [],
            insights=memo.insights,
            liveness_endpoint=args.liveness or None,
            stop_flag=stop_flag,
            memo=memo,
            registry=registry,
        )
        if stop_flag is not None:
            leader.on_signals(stop_flag)  # replaces the handlers kopf.spawn_tasks installed
        await kopf.run_tasks(tasks, ignored=existing)

    try:
        if election.enabled:
            # handlers.configure stops the standby's probe endpoint once the first sync is in (kopf then serves it)
            handover = functools.partial(setattr, memo, handlers.STANDBY_PROBE)
            return asyncio.run(
                leader.run_elected(run_operator, election, liveness=args.liveness or None, handover=handover)
            )
        m.LEADER.set(1)  # the only replica, by the user's word
        asyncio.run(run_operator())
    except KeyboardInterrupt:
        return 130
    except leaseapi.LeaseNamespaceMissing as err:  # no replica could ever lead: said, not stood by in silence
        log.error("leader_election_failed", error=str(err), namespace=err.namespace)
        print(f"mlbench-operator: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
