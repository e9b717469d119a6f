"""``mlbench run <run.yaml> --local``: run a BenchmarkRun on this machine.

The same YAML a user would ``kubectl apply`` is resolved as the operator does (catalog task +
overrides -> RunConfig; an overridden dataset path is read as it is: ``local_task``), then N local
ranks train it: under real ``mpirun`` with a localhost hostfile (through ``mlbench-runner launch``,
the launcher pod's own code path) when OpenMPI is installed, otherwise as plain subprocesses with
``RANK``/``WORLD_SIZE`` set. Progress is shown live; the run ends with a results table
and the result files in ``--output-dir`` (default ``./mlbench-results/<run>``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from mlbench_api import RunConfig, RunSummary
from mlbench_api.badinput import report
from mlbench_api.contract import ENV_CONFIG, ENV_DATA_DIR
from mlbench_api.results import CollectiveResult
from mlbench_runner import stopping
from mlbench_runner.pod.launch import exit_status, strip_tag, summary_from_line
from mlbench_runner.tools import running
from mlbench_runner.tools.collective_table import format_table as format_sweep
from mlbench_runner.tools.inputs import MAX_PORT, LocalRunError, build_config, load_run, model_text, prepare_data
from mlbench_runner.tools.processes import importable_env, run_mpirun, run_processes
from mlbench_runner.tools.report import write_plots
from mlbench_runner.tools.tables import format_table

#: What formatting an event whose fields are missing or of other types raises.
MALFORMED = (AttributeError, KeyError, TypeError, ValueError, ArithmeticError)


class Progress:
    """Turns the rank-0 event stream into human progress lines."""

    def __init__(self, out: TextIO, max_epochs: int, quiet: bool) -> None:
        self.out, self.max_epochs, self.quiet = out, max_epochs, quiet
        self.summary: RunSummary | None = None
        self.first_error: str | None = None
        self.spe = 1

    def _say(self, text: str) -> None:
        if not self.quiet:
            print(text, file=self.out, flush=True)

    def line(self, raw: str) -> None:
        text = strip_tag(raw).strip()
        summary = summary_from_line(text)
        if summary is not None:
            self.summary = summary
            return
        try:
            ev = json.loads(text) if text.startswith("{") else None
        except json.JSONDecodeError:
            ev = None
        if not isinstance(ev, dict) or "event" not in ev:
            if text and not text.startswith('{"event": "launch"'):
                self._say(f"  | {text}")
            return
        try:
            self._event(ev)
        except MALFORMED:  # another runner's event, unlike ours: shown as it came (output.log has it), no crash
            self._say(f"  | {text}")

    def _event(self, ev: dict[str, Any]) -> None:
        """One event as a progress line (the reference runner's fields; a custom runner may differ)."""
        name = ev["event"]
        if ev.get("level") in ("warning", "error"):
            if ev.get("level") == "error" and self.first_error is None:
                self.first_error = f"rank {ev.get('rank')}: {ev.get('error', name)}"
            self._say(f"  ! rank {ev.get('rank')}: {name} {ev.get('error', '')}")
        elif name == "hyperparameters":
            self.spe = max(1, int(ev.get("steps_per_epoch", 1)))
            ds = ev.get("dataset", {})
            self._say(
                f"task {ev.get('task')}: {model_text(ev.get('model'))} on {ds.get('train')} train / "
                f"{ds.get('test')} test samples, "
                f"global batch {ev.get('global_batch_size')}, {self.spe} steps/epoch, precision {ev.get('precision')}"
            )
        elif name == "train_progress":
            done = (ev["epoch"] - 1) + (ev["step"] - (ev["epoch"] - 1) * self.spe) / self.spe
            eta = ev["elapsed_s"] / done * (self.max_epochs - done) if done > 0 else float("nan")
            self._say(
                f"  epoch {ev['epoch']}/{self.max_epochs} step {ev['step']}  {ev['samples_per_second']:.0f} samples/s  "
                f"elapsed {ev['elapsed_s']:.0f}s  ETA <= {eta:.0f}s"
            )
        elif name == "eval_accuracy":
            self._say(
                f"epoch {ev['epoch']}/{self.max_epochs}: test accuracy {100 * ev['accuracy']:.2f}% "
                f"(target {100 * ev['target']:.1f}%)  at {ev['elapsed_s']:.0f}s"
            )
        elif name == "collective":
            self._say(
                f"  {ev.get('op')} {ev.get('bytes')} B: bus bandwidth {ev.get('busBandwidth', 0) / 1e9:.3f} GB/s, "
                f"p50 {1e6 * ev.get('latencyP50Seconds', 0):.1f} us"
            )
        elif name == "run_stop":
            self._say(f"run stopped: {ev.get('status')} ({ev.get('stop_reason')})")


#: Exit code of an interrupted command (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130


def final_summary(out: Path, streamed: RunSummary | None) -> RunSummary | None:
    """Rank 0's ``summary.json`` in ``out`` when it reads as one, else the summary streamed on its
    ``run_summary`` line. The file comes first: the line is the termination message, which leaves out the
    per-epoch history (the kubelet keeps 4 KiB) that the run's plot and table are drawn from."""
    with contextlib.suppress(OSError, ValueError):  # absent (a custom runner may only print it), or cut short
        return RunSummary.model_validate_json((out / "summary.json").read_bytes())
    return streamed


def _report(config: RunConfig, summary: RunSummary, out: Path) -> list[Path]:
    """Print the run's table (a collectives sweep's own table for task 0a); return the plots written."""
    if not config.task.has_training:
        print(format_sweep(CollectiveResult.model_validate_json((out / "collectives.json").read_text())))
        return []
    plots = write_plots([(out, summary)], out)
    print(format_table([summary]))
    return plots


def port(text: str) -> int:
    """A TCP port for ``--metrics-port``: 0 (off) to 65535; argparse names the option on error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}") from None
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {value}")
    return value


def no_format(text: str) -> str:
    """``-o/--output`` on ``mlbench run``: refused, saying where the result directory goes."""
    raise argparse.ArgumentTypeError(
        f"mlbench run prints no other format; for the result directory use --output-dir {text}"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mlbench run", description="Run a BenchmarkRun YAML on this machine.")
    p.add_argument("run", help="BenchmarkRun YAML (as for kubectl apply)")
    p.add_argument("--local", action="store_true", help="run here (the only mode this command implements)")
    p.add_argument("--ranks", type=int, help="local ranks (default spec.workers x spec.slotsPerWorker)")
    p.add_argument(
        "--output-dir", dest="output", metavar="DIR", help="result directory (default ./mlbench-results/<run>)"
    )
    # -o/--output is the output format in every command; this one prints only its table, and its directory is
    # --output-dir (--output DIR was its name before: said as such, not taken for an abbreviation of --output-dir).
    p.add_argument("-o", "--output", dest="format", type=no_format, help=argparse.SUPPRESS)
    p.add_argument("--task-file", help="BenchmarkTask YAML to use instead of the catalog")
    p.add_argument("--launcher", choices=("auto", "mpirun", "process"), default="auto")
    p.add_argument("--metrics-port", type=port, default=0, help="Prometheus base port (0: off)")
    p.add_argument("--data-dir", help="where to look for datasets whose path does not exist here")
    p.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="keep an epoch-end checkpoint in DIR and resume from it (this run's own only; spec.checkpoint's local "
        "equivalent)",
    )
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


#: What a run in ``out`` leaves that a new run replaces (a stale summary would pass for the new one's).
STALE = ("summary.json", "events.jsonl", "termination-log")


def clear_previous(out: Path) -> None:
    """Remove the previous run's result files from ``out``.

    Called only once every check has passed and the ranks are about to start: a run refused for its
    input (or its data, or its launcher) must leave the previous run's results as they were.
    """
    for stale in STALE:
        (out / stale).unlink(missing_ok=True)


def output_dir(args: argparse.Namespace, run_name: str) -> Path:
    """``--output-dir`` (default ``./mlbench-results/<run>``), created; a file there is refused."""
    out = Path(args.output or Path("mlbench-results") / run_name).resolve()
    if out.exists() and not out.is_dir():
        raise LocalRunError(f"--output-dir: {out} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LocalRunError(f"--output-dir: cannot create {out}: {exc.strerror or exc}") from exc
    return out


def pick_launcher(choice: str, backend: str, mpirun_found: bool) -> str:
    """The launcher to use (``auto``: mpirun when installed), or the reason the run cannot start."""
    launcher = ("mpirun" if mpirun_found else "process") if choice == "auto" else choice
    if backend == "mpi" and launcher != "mpirun":
        raise LocalRunError("spec.backend: mpi needs mpirun (install OpenMPI or pick gloo)")
    if launcher == "mpirun" and not mpirun_found:
        raise LocalRunError("--launcher mpirun: mpirun is not on PATH")
    return launcher


def _prepare(args: argparse.Namespace, say: Any) -> tuple[RunConfig, Path, str]:
    """Every check before the ranks start: the input, the output folder, the data, the launcher."""
    run_name = load_run(args.run).metadata.name
    out = output_dir(args, run_name)
    config = build_config(args, out)
    if config.network is not None:
        raise LocalRunError(
            "spec.network: emulated network conditions need the cluster's netem init container "
            "(docs/network.md); remove it for a local run"
        )
    launcher = pick_launcher(args.launcher, config.backend.value, shutil.which("mpirun") is not None)
    prepare_data(config, say)
    return config, out, launcher


def main(argv: list[str] | None = None, on_start: Callable[[], None] | None = None) -> int:
    """Entry point of ``mlbench run``; returns the exit code. ``on_start`` is called once every check has
    passed and the previous run's results are gone, just before the ranks start (``mlbench sweep`` records
    the run's ``run.yaml`` then, so that a refused run leaves the folder's record as it was)."""
    with stopping.interrupt_on():  # `timeout`'s SIGTERM, a closed terminal's SIGHUP: the Ctrl-C path
        return _main(argv, on_start)


def _main(argv: list[str] | None, on_start: Callable[[], None] | None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    say = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    if not args.local:
        print("error: only --local is implemented here; use kubectl apply for a cluster run", file=sys.stderr)
        return 2
    env = importable_env(dict(os.environ))
    if args.data_dir:
        env[ENV_DATA_DIR] = os.environ[ENV_DATA_DIR] = str(Path(args.data_dir).resolve())
    try:
        config, out, launcher = _prepare(args, say)
    except LocalRunError as exc:
        return report(exc, sys.stderr)
    except KeyboardInterrupt:
        print("interrupted before the run started", file=sys.stderr)
        return INTERRUPTED
    try:
        with running.marked(out):  # `mlbench results` must not score this folder as a crashed run meanwhile
            return _run(args, config, out, launcher, env, say=say, on_start=on_start)
    except running.AlreadyRunning as exc:  # raised before the block runs: nothing of the other run was touched
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(
    args: argparse.Namespace,
    config: RunConfig,
    out: Path,
    launcher: str,
    env: dict[str, str],
    *,
    say: Any,
    on_start: Callable[[], None] | None,
) -> int:
    """The ranks, their progress and the report: every check has passed."""
    clear_previous(out)
    if on_start is not None:
        on_start()
    config_path = out / "config.json"
    config_path.write_text(config.dump())
    env[ENV_CONFIG] = str(config_path)
    say(
        f"run {config.run_name}: task {config.task_name}, {config.world_size} rank(s) via {launcher}, "
        f"backend {config.backend.value}, algorithm {config.algorithm.value}/{config.bucketing.value}; output {out}"
    )
    progress = Progress(sys.stdout, config.task.training.max_epochs if config.task.has_training else 0, args.quiet)
    t0 = time.perf_counter()
    try:
        with (out / "output.log").open("w", buffering=1) as log:  # line by line: `tail -f` shows the run

            def on_line(line: str) -> None:
                log.write(line + "\n")
                progress.line(line)

            if launcher == "mpirun":
                code = run_mpirun(config_path, out, config.world_size, env, on_line)
            else:
                code = run_processes(config_path, config.world_size, env, on_line, config.task.runner.command)
    except KeyboardInterrupt:  # the ranks are stopped by now (run_processes / run_mpirun)
        print(f"interrupted: the ranks were stopped; partial output in {out / 'output.log'}", file=sys.stderr)
        return INTERRUPTED
    summary = final_summary(out, progress.summary)
    if code != 0 or summary is None:
        cause = f": {progress.first_error}" if progress.first_error else ""
        print(f"error: the run failed (exit {code}){cause}; see {out / 'output.log'}", file=sys.stderr)
        return exit_status(code) or 1  # killed by signal n: 128 + n, as a shell reports it (not 256 - n)
    print()
    plots = _report(config, summary, out)
    print(f"\nfinished in {time.perf_counter() - t0:.0f}s; files in {out}:")
    kept = ("summary.json", "collectives.json", "events.jsonl", "config.json", "output.log")
    for name in (*kept, *[p.name for p in plots]):
        if (out / name).exists():
            print(f"  {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
