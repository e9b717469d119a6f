"""``mlbench-operator``: run the kopf operator (equivalent to ``kopf run -m mlbench_operator.handlers -A``)."""

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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["MLBENCH_METRICS_PORT"] = str(args.metrics_port)
    os.environ["MLBENCH_RUN_SELECTOR"] = args.selector
    from mlbench_operator import handlers, logs
    from mlbench_operator.settings import DatasetSettings, SettingsError, metrics_linger_seconds, results_wait_seconds

    try:  # a bad MLBENCH_DATASET_* stops the operator here, named, not at the first run's PVC
        DatasetSettings.from_env(os.environ)
        metrics_linger_seconds(os.environ)
        results_wait_seconds(os.environ)
    except SettingsError as err:
        print(f"mlbench-operator: {err}", file=sys.stderr)
        return 2
    logs.configure()
    del handlers  # imported for its kopf registrations
    try:
        asyncio.run(
            kopf.operator(
                standalone=True,
                clusterwide=not args.namespace,
                namespaces=list(args.namespace),
                liveness_endpoint=args.liveness or None,
            )
        )
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
