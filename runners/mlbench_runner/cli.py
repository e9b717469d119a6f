"""``mlbench-runner``: ``train`` or ``collectives`` (one rank: :mod:`mlbench_runner.rank`), ``launch`` (the launcher
pod), ``worker`` (the worker pod's sshd), ``fetch-dataset`` (the fetch Job) and ``netem`` (the workers' init
container), all four in :mod:`mlbench_runner.pod`. The one module that assembles the runner's programs."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable

import structlog
from pydantic import ValidationError

from mlbench_api.config import RunConfig
from mlbench_api.contract import ENV_CONFIG
from mlbench_runner import stopping
from mlbench_runner.pod.fetch import add_arguments as add_fetch_arguments
from mlbench_runner.pod.fetch import run as run_fetch
from mlbench_runner.pod.launch import add_launch_arguments, run_launch
from mlbench_runner.pod.netem import add_arguments as add_netem_arguments
from mlbench_runner.pod.netem import run as run_netem
from mlbench_runner.pod.worker import run_worker
from mlbench_runner.stopping import Interrupted, stop_once


def abort_mpi_if_initialised(code: int) -> None:
    """A failing rank under ``backend: mpi`` must take the job down, not sit in MPI_Finalize.

    mpi4py finalizes at exit, and OpenMPI's MPI_Finalize waits for every peer, while the
    peers wait forever in a collective for this rank. ``MPI_Abort`` makes mpirun kill them
    all and exit non-zero at once. A no-op when mpi4py was never initialised (gloo, nccl).
    """
    if mpi_initialised():
        sys.stdout.flush()
        sys.stderr.flush()
        sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(code)


def mpi_initialised() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return False
    try:
        return bool(mpi.Is_initialized() and not mpi.Is_finalized())
    except Exception:  # pragma: no cover - defensive: never mask the real failure
        return False


def _train(args: argparse.Namespace) -> int:
    with stopping.noted_early():  # before torch's import, the rank's longest window without its handlers
        return _guarded(_train_rank, args)


def _collectives(args: argparse.Namespace) -> int:
    with stopping.noted_early():
        return _guarded(_collectives_rank, args)


def _guarded(rank_main: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run one rank's entrypoint; under mpi, a failing rank aborts the job instead of hanging it."""
    try:
        code = rank_main(args)
    except BaseException as exc:
        if mpi_initialised() and not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            traceback.print_exc()  # Abort below ends the process: say why first
            abort_mpi_if_initialised(1)
        raise
    if code not in (0, 3):  # 3 (aborted) is a collective decision: every rank stops together
        abort_mpi_if_initialised(code)
    return code


def _load_config(args: argparse.Namespace) -> RunConfig | None:
    """The RunConfig of ``--config`` or ``$MLBENCH_RUN_CONFIG`` (``--output-dir`` applied); None after saying why."""
    path = args.config or os.environ.get(ENV_CONFIG)
    if not path:
        print(f"error: pass --config or set {ENV_CONFIG}", file=sys.stderr)
        return None
    try:
        config = RunConfig.load(path)
    except (OSError, ValidationError, ValueError) as exc:
        print(f"error: invalid run config {path}: {exc}", file=sys.stderr)
        return None
    if args.output_dir:
        config = config.model_copy(update={"output_dir": args.output_dir})
    return config


def _rank_label() -> str:
    return os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0"))


def _collectives_rank(args: argparse.Namespace) -> int:
    config = _load_config(args)
    if config is None:
        return 2
    return _run_collectives(config)


def _run_collectives(config: RunConfig) -> int:
    # Lazy: torch (seconds to import) only for a rank, after stopping.noted_early() holds the stop signals.
    from mlbench_runner.rank.collectives import CollectiveError, run_collectives  # noqa: PLC0415

    try:
        with stop_once():
            run_collectives(config)
    except Interrupted as exc:  # as a training rank: no summary (a sweep of sizes has no partial result), exit 3
        print(f"rank {_rank_label()}: stopped by {exc.signal}", file=sys.stderr)
        return 3
    except (ValueError, CollectiveError) as exc:  # bad input or a broken transport: one clear line
        print(f"error: rank {_rank_label()}: {exc}", file=sys.stderr)
        return 2
    return 0


def _train_rank(args: argparse.Namespace) -> int:
    # Lazy: torch (seconds to import) only for a rank, after stopping.noted_early() holds the stop signals.
    from mlbench_runner.rank.train import train  # noqa: PLC0415

    config = _load_config(args)
    if config is None:
        return 2
    if not config.task.has_training:  # a collectives task started with the default command: time, do not train
        return _run_collectives(config)
    try:
        with stop_once():
            summary = train(config)
    except Interrupted as exc:  # rank 0 wrote an aborted summary; 3, not an MPI abort that could cut it short
        print(f"rank {_rank_label()}: stopped by {exc.signal}", file=sys.stderr)
        return 3
    except (ValueError, FileNotFoundError) as exc:  # bad input: one clear line, no traceback
        print(f"error: rank {_rank_label()}: {exc}", file=sys.stderr)
        return 2
    return 3 if summary is not None and summary.status == "aborted" else 0


def configure_logging() -> None:
    """Library log lines (e.g. dataset decoding) as JSON too, like the event log."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    parser = argparse.ArgumentParser(prog="mlbench-runner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_train = sub.add_parser("train", help="train this rank from a RunConfig")
    p_train.add_argument("--config", help=f"RunConfig JSON/YAML (default ${ENV_CONFIG})")
    p_train.add_argument("--output-dir", help="override RunConfig.outputDir")
    p_coll = sub.add_parser("collectives", help="time this rank's collectives sweep (task 0a) from a RunConfig")
    p_coll.add_argument("--config", help=f"RunConfig JSON/YAML (default ${ENV_CONFIG})")
    p_coll.add_argument("--output-dir", help="override RunConfig.outputDir")
    p_launch = sub.add_parser("launch", help="launcher pod: mpirun every rank, write the termination log")
    add_launch_arguments(p_launch)
    p_fetch = sub.add_parser("fetch-dataset", help="download a dataset into the dataset volume (the fetch Job)")
    add_fetch_arguments(p_fetch)
    p_worker = sub.add_parser("worker", help="worker pod: run sshd (the command after --), report OOM kills")
    p_worker.add_argument("cmd", nargs=argparse.REMAINDER, help="-- /usr/sbin/sshd ...")
    p_netem = sub.add_parser("netem", help="worker init container: emulate spec.network with tc htb/netem (NET_ADMIN)")
    add_netem_arguments(p_netem)
    args = parser.parse_args(argv)
    if args.command == "netem":
        return run_netem(args)
    if args.command == "worker":
        return run_worker(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    if args.command == "train":
        return _train(args)
    if args.command == "collectives":
        return _collectives(args)
    if args.command == "fetch-dataset":
        return run_fetch(args)
    return run_launch(args)


if __name__ == "__main__":
    sys.exit(main())
