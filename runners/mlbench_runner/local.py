"""``mlbench run <run.yaml> --local``: run a BenchmarkRun on this machine.

The same YAML a user would ``kubectl apply`` is resolved exactly as the operator does
(catalog task + overrides -> RunConfig), then N local ranks train it: under real
``mpirun`` with a localhost hostfile (through ``mlbench-runner launch``, the launcher
pod's own code path) when OpenMPI is installed, otherwise as plain subprocesses with
``RANK``/``WORLD_SIZE`` set. Progress is shown live; the run ends with a results table
and the result files in ``--output`` (default ``./mlbench-results/<run>``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import ValidationError

from mlbench_api import BenchmarkRun, BenchmarkTask, BenchmarkTaskSpec, RunConfig, RunSummary
from mlbench_api.config import CONFIG_ENV, OverrideNotAllowed, effective_config
from mlbench_api.task import DatasetFormat
from mlbench_runner.launch import RUNNER_ENTRYPOINT, launcher_command, rank_command, strip_tag, summary_from_line
from mlbench_runner.world import free_port


class LocalRunError(Exception):
    """A problem with the user's input, reported as one clear line."""


def importable_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with PYTHONPATH covering where mlbench_runner and mlbench_api were imported from,
    so child ranks find them without an install (a no-op for an installed package)."""
    import mlbench_api
    import mlbench_runner

    roots = [str(Path(m.__file__).resolve().parent.parent) for m in (mlbench_runner, mlbench_api) if m.__file__]
    existing = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots + existing))
    return env


def _validation_message(kind: str, path: str, exc: ValidationError) -> str:
    lines = [f"{path}: invalid {kind}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)


def load_run(path: str) -> BenchmarkRun:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LocalRunError(f"{path}: cannot read the BenchmarkRun: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != "BenchmarkRun":
        raise LocalRunError(f"{path}: kind: expected a BenchmarkRun document")
    try:
        return BenchmarkRun.model_validate(data)
    except ValidationError as exc:
        raise LocalRunError(_validation_message("BenchmarkRun", path, exc)) from exc


def load_task(name: str, task_file: str | None) -> BenchmarkTaskSpec:
    """The task from ``--task-file`` (a BenchmarkTask YAML) or the catalog."""
    if task_file:
        try:
            data = yaml.safe_load(Path(task_file).read_text())
            if isinstance(data, dict) and data.get("kind") == "BenchmarkTask":
                return BenchmarkTask.model_validate(data).spec
            return BenchmarkTaskSpec.model_validate(data)
        except ValidationError as exc:
            raise LocalRunError(_validation_message("BenchmarkTask", task_file, exc)) from exc
        except (OSError, yaml.YAMLError) as exc:
            raise LocalRunError(f"{task_file}: cannot read the task: {exc}") from exc
    from mlbench_api import catalog

    try:
        task = catalog.get_task(name)
    except KeyError as exc:
        raise LocalRunError(str(exc.args[0])) from exc
    except (OSError, ValueError) as exc:
        raise LocalRunError(f"task catalog: {exc}") from exc
    return task.spec


def build_config(args: argparse.Namespace, out: Path) -> RunConfig:
    run = load_run(args.run)
    spec = load_task(run.spec.task_ref.name, args.task_file)
    overrides = run.spec.overrides
    if overrides is not None and overrides.dataset and overrides.dataset_source is None:
        # A local run fetches nothing: an overridden dataset path is where the data already is, so the
        # task's source (the operator's fetch into /data on a cluster) does not apply here.
        spec = spec.model_copy(update={"dataset_spec": spec.dataset.model_copy(update={"source": None})})
    if args.ranks is not None:
        if args.ranks < 1:
            raise LocalRunError("--ranks: must be at least 1")
        if args.ranks != run.spec.workers * run.spec.slots_per_worker:
            run = run.model_copy(
                update={"spec": run.spec.model_copy(update={"workers": args.ranks, "slots_per_worker": 1})}
            )
    try:
        config = effective_config(
            run, run.spec.task_ref.name, spec, output_dir=str(out), metrics_port=args.metrics_port
        )
    except OverrideNotAllowed as exc:
        raise LocalRunError(str(exc)) from exc
    except ValidationError as exc:
        raise LocalRunError(_validation_message("run after overrides", args.run, exc)) from exc
    if config.backend.value == "nccl":
        import torch

        if torch.cuda.device_count() < config.world_size:
            raise LocalRunError(
                f"spec.backend: nccl needs {config.world_size} GPUs here, found {torch.cuda.device_count()}"
            )
    return config


def prepare_data(config: RunConfig, say: Any) -> None:
    """Decode an image archive or LIBSVM files once here, so the ranks start from the cache.

    Either way the one-time decoding is outside the run's wall clock (the trainer leaves
    out any decoding it has to do itself), so both paths report the same kind of time.
    """
    if not config.task.has_training:  # a collectives task (0a) has no data
        return
    ds = config.task.dataset
    if ds.format in (DatasetFormat.IMAGE_TARBALL, DatasetFormat.IMAGE_FOLDER, DatasetFormat.LIBSVM):
        from mlbench_runner.data.cifar import load_image_archive
        from mlbench_runner.data.loader import resolve_path
        from mlbench_runner.data.tabular import load_libsvm_dataset

        t0 = time.perf_counter()
        try:
            path = resolve_path(ds.path)
        except FileNotFoundError as exc:
            raise LocalRunError(str(exc)) from exc
        try:
            if ds.format is DatasetFormat.LIBSVM:
                load_libsvm_dataset(path)
            else:
                load_image_archive(path)
        except (FileNotFoundError, ValueError) as exc:
            raise LocalRunError(str(exc)) from exc
        say(f"dataset ready: {path} ({time.perf_counter() - t0:.1f}s)")


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
        name = ev["event"]
        if ev.get("level") in ("warning", "error"):
            if ev.get("level") == "error" and self.first_error is None:
                self.first_error = f"rank {ev.get('rank')}: {ev.get('error', name)}"
            self._say(f"  ! rank {ev.get('rank')}: {name} {ev.get('error', '')}")
        elif name == "hyperparameters":
            self.spe = int(ev.get("steps_per_epoch", 1))
            ds = ev.get("dataset", {})
            self._say(
                f"task {ev.get('task')}: {ev.get('model')} on {ds.get('train')} train / {ds.get('test')} test samples, "
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


def _pump(proc: subprocess.Popen[str], tag: int, q: queue.Queue[tuple[int, str | None]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        q.put((tag, line.rstrip("\n")))
    q.put((tag, None))


def run_processes(
    config_path: Path,
    ranks: int,
    env: dict[str, str],
    on_line: Any,
    command: Sequence[str] = (RUNNER_ENTRYPOINT, "train"),
) -> int:
    """Start ``ranks`` processes of the task's ``runner.command`` with torch-style env; stop all if one fails."""
    port = str(free_port())
    argv = rank_command(command, str(config_path))
    procs = []
    q: queue.Queue[tuple[int, str | None]] = queue.Queue()
    for r in range(ranks):
        penv = dict(
            env,
            RANK=str(r),
            WORLD_SIZE=str(ranks),
            LOCAL_RANK=str(r),
            LOCAL_WORLD_SIZE=str(ranks),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=penv,
            bufsize=1,
        )
        procs.append(proc)
        threading.Thread(target=_pump, args=(proc, r, q), daemon=True).start()
    open_streams, failed = ranks, 0
    while open_streams:
        tag, line = q.get()
        if line is None:
            open_streams -= 1
            code = procs[tag].wait()
            if code != 0 and not failed:
                failed = code
                for other in procs:
                    if other.poll() is None:
                        other.terminate()
            continue
        on_line(line)
    return failed or max(p.wait() for p in procs)


def run_mpirun(config_path: Path, out: Path, ranks: int, env: dict[str, str], on_line: Any) -> int:
    """Through ``mlbench-runner launch`` with a localhost hostfile, as the launcher pod does."""
    hostfile = out / "hostfile"
    hostfile.write_text(f"localhost slots={ranks}\n")
    env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), MLBENCH_HOSTFILE=str(hostfile))
    cmd = launcher_command(config_path, hostfile, out / "termination-log", oversubscribe=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        on_line(line.rstrip("\n"))
    return proc.wait()


def _report(config: RunConfig, summary: RunSummary, out: Path) -> list[Path]:
    """Print the run's table (a collectives sweep's own table for task 0a); return the plots written."""
    if not config.task.has_training:
        from mlbench_api.results import CollectiveResult
        from mlbench_runner.collectives import format_table as format_sweep

        print(format_sweep(CollectiveResult.model_validate_json((out / "collectives.json").read_text())))
        return []
    from mlbench_runner.report import format_table, write_plots

    plots = write_plots([(out, summary)], out)
    print(format_table([summary]))
    return plots


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mlbench run", description="Run a BenchmarkRun YAML on this machine.")
    p.add_argument("run", help="BenchmarkRun YAML (as for kubectl apply)")
    p.add_argument("--local", action="store_true", help="run here (the only mode this command implements)")
    p.add_argument("--ranks", type=int, help="local ranks (default spec.workers x spec.slotsPerWorker)")
    p.add_argument("--output", help="result directory (default ./mlbench-results/<run>)")
    p.add_argument("--task-file", help="BenchmarkTask YAML to use instead of the catalog")
    p.add_argument("--launcher", choices=("auto", "mpirun", "process"), default="auto")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus base port (0: off)")
    p.add_argument("--data-dir", help="where to look for datasets whose path does not exist here")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``mlbench run``; returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    say = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    if not args.local:
        print("error: only --local is implemented here; use kubectl apply for a cluster run", file=sys.stderr)
        return 2
    env = importable_env(dict(os.environ))
    if args.data_dir:
        env["MLBENCH_DATA_DIR"] = os.environ["MLBENCH_DATA_DIR"] = str(Path(args.data_dir).resolve())
    try:
        run_name = load_run(args.run).metadata.name
        out = Path(args.output or Path("mlbench-results") / run_name).resolve()
        config = build_config(args, out)
        out.mkdir(parents=True, exist_ok=True)
        for stale in ("summary.json", "events.jsonl", "termination-log"):
            (out / stale).unlink(missing_ok=True)
        prepare_data(config, say)
    except LocalRunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if config.network is not None:
        print(
            "error: spec.network: emulated network conditions need the cluster's netem init container "
            "(docs/network.md); remove it for a local run",
            file=sys.stderr,
        )
        return 2
    config_path = out / "config.json"
    config_path.write_text(config.dump())
    env[CONFIG_ENV] = str(config_path)
    launcher = args.launcher
    if launcher == "auto":
        launcher = "mpirun" if shutil.which("mpirun") else "process"
    if config.backend.value == "mpi" and launcher != "mpirun":
        print("error: spec.backend: mpi needs mpirun (install OpenMPI or pick gloo)", file=sys.stderr)
        return 2
    if launcher == "mpirun" and not shutil.which("mpirun"):
        print("error: --launcher mpirun: mpirun is not on PATH", file=sys.stderr)
        return 2
    say(
        f"run {config.run_name}: task {config.task_name}, {config.world_size} rank(s) via {launcher}, "
        f"backend {config.backend.value}, algorithm {config.algorithm.value}/{config.bucketing.value}; output {out}"
    )
    progress = Progress(sys.stdout, config.task.training.max_epochs if config.task.has_training else 0, args.quiet)
    with (out / "output.log").open("w") as log:

        def on_line(line: str) -> None:
            log.write(line + "\n")
            progress.line(line)

        t0 = time.perf_counter()
        if launcher == "mpirun":
            code = run_mpirun(config_path, out, config.world_size, env, on_line)
        else:
            code = run_processes(config_path, config.world_size, env, on_line, config.task.runner.command)
    summary = progress.summary
    if summary is None and (out / "summary.json").exists():
        summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    if code != 0 or summary is None:
        cause = f": {progress.first_error}" if progress.first_error else ""
        print(f"error: the run failed (exit {code}){cause}; see {out / 'output.log'}", file=sys.stderr)
        return code or 1
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
