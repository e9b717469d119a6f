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
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from mlbench_api import BenchmarkRun, BenchmarkTask, BenchmarkTaskSpec, RunConfig, RunSummary, catalog
from mlbench_api.badinput import BadInput, bad_input, report
from mlbench_api.common import API_VERSION
from mlbench_api.config import effective_config, local_task
from mlbench_api.contract import ENV_CONFIG, ENV_DATA_DIR
from mlbench_api.errors import InvalidObject
from mlbench_api.run import MAX_WORKERS
from mlbench_api.task import RUNNER_ENTRYPOINT, DatasetFormat
from mlbench_runner import stopping
from mlbench_runner.pod.launch import exit_status, launcher_command, rank_command, strip_tag, summary_from_line
from mlbench_runner.tools import running
from mlbench_runner.world import free_port


class LocalRunError(BadInput):
    """A problem with the user's input (its file, its flags, its data), reported as ``mlbench validate`` reports one."""


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


def _invalid(kind: str, exc: InvalidObject) -> LocalRunError:
    return LocalRunError(exc.problems, exc.source, kind)


def _documents(path: str, kind: str) -> list[dict[str, Any]]:
    """The documents of a YAML file, read as ``kubectl apply`` reads them (go-yaml's types)."""
    try:
        return catalog.load_documents(Path(path))
    except InvalidObject as exc:
        raise LocalRunError(exc.problems, exc.source, kind) from exc


def load_run(path: str) -> BenchmarkRun:
    """The file's BenchmarkRun, checked as strictly as ``mlbench validate`` and the API server check it
    (``workers: "4"`` is a string and refused), so a local run accepts exactly what a cluster accepts."""
    runs = [d for d in _documents(path, "BenchmarkRun") if d.get("kind") == "BenchmarkRun"]
    if not runs:
        raise LocalRunError("kind: expected a BenchmarkRun document", path)
    try:
        return catalog.parse_run(runs[0], path)
    except InvalidObject as exc:
        raise _invalid("BenchmarkRun", exc) from exc


def pick_task(name: str, tasks: Sequence[BenchmarkTask], source: str) -> BenchmarkTask:
    """The task named ``name`` among a task file's tasks.

    The run's results are filed under ``spec.taskRef.name``: running another task under that name
    would file, say, ResNet-20's results as a logistic regression's, so a mismatch is refused.
    """
    for task in tasks:
        if task.metadata.name == name:
            return task
    found = ", ".join(repr(t.metadata.name) for t in tasks) or "none"
    raise LocalRunError(
        f"metadata.name: the file's BenchmarkTask is {found}, but the run's spec.taskRef.name is "
        f"{name!r}; use a task file that defines {name!r} or change spec.taskRef.name",
        source,
        "BenchmarkTask",
    )


def load_task(name: str, task_file: str | None) -> BenchmarkTaskSpec:
    """The task from ``--task-file`` (the BenchmarkTask named ``name``, or a bare spec) or the catalog."""
    if task_file:
        docs = _documents(task_file, "task")
        tasks = [d for d in docs if d.get("kind") == "BenchmarkTask"]
        try:
            if not tasks and len(docs) == 1 and "kind" not in docs[0]:  # a bare BenchmarkTaskSpec: no name
                return catalog.strict_validate(BenchmarkTaskSpec, docs[0], task_file)
            return pick_task(name, [catalog.parse_task(d, task_file) for d in tasks], task_file).spec
        except InvalidObject as exc:
            raise _invalid("BenchmarkTask", exc) from exc

    try:
        task = catalog.get_task(name)
    except KeyError as exc:
        raise LocalRunError(str(exc.args[0])) from exc
    except InvalidObject as exc:
        raise LocalRunError(exc.problems, exc.source, "BenchmarkTask") from exc
    except (OSError, ValueError) as exc:
        raise LocalRunError(f"task catalog: {exc}") from exc
    return task.spec


def task_document(name: str, task_file: str) -> dict[str, Any]:
    """The BenchmarkTask ``name`` of a task file as a document (a bare spec gets that name), checked as
    :func:`load_task` checks it: what a run's own file can carry so that it runs on its own."""
    spec = load_task(name, task_file)
    return {"apiVersion": API_VERSION, "kind": "BenchmarkTask", "metadata": {"name": name}, "spec": spec.to_api()}


def task_file_for(name: str, task_file: str | None, beside: str) -> str | None:
    """Where task ``name`` comes from: ``--task-file``; else the run's (or sweep's) own file ``beside`` when it
    also holds that BenchmarkTask (one file that ``kubectl apply`` takes whole); else None: the catalog."""
    if task_file:
        return task_file
    docs = _documents(beside, "task")
    named = [d for d in docs if d.get("kind") == "BenchmarkTask" and (d.get("metadata") or {}).get("name") == name]
    return beside if named else None


def build_config(args: argparse.Namespace, out: Path) -> RunConfig:
    run = load_run(args.run)
    name = run.spec.task_ref.name
    task = load_task(name, task_file_for(name, args.task_file, args.run))
    try:
        spec = local_task(task, run)
    except ValueError as exc:  # the overrides break the task's own rules
        raise LocalRunError(bad_input(exc).problems, args.run, "BenchmarkRun") from exc
    if args.ranks is not None:
        if not 1 <= args.ranks <= MAX_WORKERS:  # becomes spec.workers, whose bounds model_copy does not check
            raise LocalRunError(f"--ranks: must be from 1 to {MAX_WORKERS} (spec.workers' range), got {args.ranks}")
        if args.ranks != run.spec.workers * run.spec.slots_per_worker:
            run = run.model_copy(
                update={"spec": run.spec.model_copy(update={"workers": args.ranks, "slots_per_worker": 1})}
            )
    try:
        config = effective_config(
            run,
            run.spec.task_ref.name,
            spec,
            output_dir=str(out),
            metrics_port=args.metrics_port,
            checkpoint_dir=str(Path(args.checkpoint).resolve()) if getattr(args, "checkpoint", None) else None,
        )
    except ValueError as exc:  # an override the task refuses or that breaks its rules, an invalid configuration
        raise LocalRunError(bad_input(exc).problems, args.run, "BenchmarkRun") from exc
    if config.metrics_port and config.metrics_port + config.world_size - 1 > MAX_PORT:
        raise LocalRunError(
            f"--metrics-port: rank r serves on {config.metrics_port} + r, beyond {MAX_PORT} for "
            f"{config.world_size} ranks"
        )
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


def model_text(model: Any) -> str:
    """The event's model for a person: ``resnet (version=m1, depth=20)``, not a Python dict."""
    if not isinstance(model, dict):
        return str(model)
    rest = ", ".join(f"{k}={v}" for k, v in model.items() if k != "name")
    name = str(model.get("name", "model"))
    return f"{name} ({rest})" if rest else name


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


class Streams:
    """The merged output lines of ``procs``, each read by a thread of its own: a pipe never fills (and blocks
    its writer) while this command waits, and after a Ctrl-C the lines the processes print as they stop
    (their ``run_stop``, the launcher's results) still reach ``output.log``."""

    def __init__(self, procs: Sequence[subprocess.Popen[str]]) -> None:
        self.open = len(procs)
        self._lines: queue.Queue[tuple[int, str | None]] = queue.Queue()
        for tag, proc in enumerate(procs):
            threading.Thread(target=self._pump, args=(proc, tag), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str], tag: int) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.put((tag, line.rstrip("\n")))
        self._lines.put((tag, None))

    def next(self, timeout: float | None = None) -> tuple[int, str | None]:
        """(process index, line), or (index, None) when that process closed its output; raises ``queue.Empty``
        after ``timeout`` seconds."""
        tag, line = self._lines.get(timeout=timeout)
        if line is None:
            self.open -= 1
        return tag, line

    def drain(self, on_line: Any, seconds: float, cut: threading.Event) -> bool:
        """Hand lines to ``on_line`` until every output is closed, ``seconds`` have passed or ``cut`` is set
        (then it is cleared); whether every output was closed."""
        deadline = time.monotonic() + seconds
        while self.open and (left := deadline - time.monotonic()) > 0 and not _used(cut):
            with contextlib.suppress(queue.Empty):
                if (line := self.next(timeout=min(POLL_SECONDS, left))[1]) is not None:
                    on_line(line)
        return not self.open


def start_child(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """A rank or the launcher: output merged and line by line; a process group of its own, so that a terminal's
    Ctrl-C reaches only this command, which passes it on once; no stdin, which a background group would be
    stopped for reading from the terminal (SIGTTIN; mpirun reads it to forward to rank 0)."""
    return subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",  # a rank's bytes that are not UTF-8 (or a tag inside a character) are no crash
        env=env,
        bufsize=1,
        process_group=0,
    )


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
        procs.append(start_child(argv, penv))
    streams, failed = Streams(procs), 0
    stragglers = threading.Timer(FAILURE_GRACE_SECONDS, _terminate_running, (procs,))
    stragglers.daemon = True
    try:
        with stopped_on_exit(procs, streams, on_line):
            while streams.open:
                tag, line = streams.next()
                if line is None:
                    code = procs[tag].wait()
                    if code != 0 and not failed:
                        failed = code
                        stragglers.start()
                    continue
                on_line(line)
    finally:
        stragglers.cancel()
    return failed or max(p.wait() for p in procs)


#: Seconds the other ranks get to end on their own after one failed, before they are terminated: the failed
#: rank's exit breaks their collectives, so they stop by themselves with stop reason ``error`` (terminated,
#: they would say ``interrupted``).
FAILURE_GRACE_SECONDS = 5.0


def _terminate_running(procs: Sequence[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()


#: Exit code of an interrupted command (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130
#: Seconds the ranks get to end on their own after a Ctrl-C before they are terminated: each takes the one
#: SIGINT this command passes on (:mod:`mlbench_runner.stopping`), writes its ``aborted`` summary and leaves.
SETTLE_SECONDS = 10.0


#: How often a stop looks at its processes and at a further Ctrl-C.
POLL_SECONDS = 0.05


def _used(cut: threading.Event) -> bool:
    """Whether a stop signal was noted since the last look (and clear it: one signal cuts one wait)."""
    if cut.is_set():
        cut.clear()
        return True
    return False


def _wait_all(procs: Sequence[subprocess.Popen[str]], seconds: float, cut: threading.Event) -> None:
    """Until every process has ended, ``seconds`` have passed, or a further stop signal is noted in ``cut``."""
    deadline = time.monotonic() + seconds
    while any(p.poll() is None for p in procs) and (left := deadline - time.monotonic()) > 0 and not _used(cut):
        time.sleep(min(POLL_SECONDS, left))


#: A process as found in /proc: (pid, start time in clock ticks), so that a pid reused since is never signalled.
ProcessId = tuple[int, int]


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces and parentheses): state, ppid, ..."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def process_tree(procs: Sequence[subprocess.Popen[str]]) -> set[ProcessId]:
    """Every live descendant of the running ``procs`` (Linux /proc; a reaped one's pid may be another process's
    by now). Neither the process group nor the parent reaches them all: mpirun gives each rank a group of its
    own, and a child whose parent died is re-parented to init, so the tree is taken while the parents live."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(entry.name)) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            started[int(entry.name)] = int(fields[19])
    found: set[ProcessId] = set()
    todo = [p.pid for p in procs if p.returncode is None]  # unreaped (a zombie keeps its pid): still ours
    while todo:
        for child in children.get(todo.pop(), []):
            if (child, started[child]) not in found:
                found.add((child, started[child]))
                todo.append(child)
    return found


def kill_tree(tree: set[ProcessId]) -> None:
    """SIGKILL each process of ``tree`` that still runs as the same process (its start time unchanged)."""
    for pid, start in tree:
        fields = _stat_fields(pid)
        if fields is not None and int(fields[19]) == start:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def stop_processes(
    procs: Sequence[subprocess.Popen[str]],
    settle: float = 0.0,
    grace: float = 5.0,
    tree: set[ProcessId] | frozenset[ProcessId] = frozenset(),
) -> None:
    """Let the processes end on their own for ``settle`` seconds, then terminate those still running (the
    process itself: a rank, or the launcher, which takes a second stop as "now" and passes mpirun its
    SIGTERM), and after ``grace`` seconds more kill them and every descendant (``tree``: taken earlier,
    plus those found now). Another Ctrl-C cuts a wait short, never the stop: no rank may outlive the command."""
    with stopping.noted() as cut:
        tree = set(tree) | process_tree(procs)  # before the wait reaps any: an orphan's parent is then unknown
        _wait_all(procs, settle, cut)
        tree |= process_tree(procs)
        _terminate_running(procs)
        _wait_all(procs, grace, cut)
        tree |= process_tree(procs)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        kill_tree(tree)
        for proc in procs:
            proc.wait()


@contextlib.contextmanager
def stopped_on_exit(procs: Sequence[subprocess.Popen[str]], streams: Streams, on_line: Any) -> Iterator[None]:
    """No process of ``procs`` (nor any of theirs) outlives a block that raises: after a Ctrl-C each gets one
    SIGINT and :data:`SETTLE_SECONDS` to write its summary and end, its output still handed to ``on_line``
    (another Ctrl-C cuts that short); after any other error they are stopped at once."""
    try:
        yield
    except KeyboardInterrupt:
        with stopping.noted() as cut:
            tree, started, settle = process_tree(procs), time.monotonic(), 0.0
            for proc in procs:  # the process itself: the pod launcher passes it on to mpirun as one SIGUSR1
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGINT)
            try:
                if streams.drain(on_line, SETTLE_SECONDS, cut):  # outputs closed: wait for the exits
                    settle = max(0.0, SETTLE_SECONDS - (time.monotonic() - started))
            finally:  # also when on_line fails (a closed terminal, a full disk)
                stop_processes(procs, settle=settle, tree=tree)
        raise
    except BaseException:
        stop_processes(procs)
        raise


def run_mpirun(config_path: Path, out: Path, ranks: int, env: dict[str, str], on_line: Any) -> int:
    """Through ``mlbench-runner launch`` with a localhost hostfile, as the launcher pod does."""
    hostfile = out / "hostfile"
    hostfile.write_text(f"localhost slots={ranks}\n")
    env = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), MLBENCH_HOSTFILE=str(hostfile))
    cmd = launcher_command(config_path, hostfile, out / "termination-log", oversubscribe=True)
    proc = start_child(cmd, env)
    streams = Streams([proc])
    with stopped_on_exit([proc], streams, on_line):  # the launcher passes a SIGINT on to mpirun as SIGUSR1
        while streams.open:
            if (line := streams.next()[1]) is not None:
                on_line(line)
    return proc.wait()


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
        from mlbench_api.results import CollectiveResult
        from mlbench_runner.tools.collective_table import format_table as format_sweep

        print(format_sweep(CollectiveResult.model_validate_json((out / "collectives.json").read_text())))
        return []
    from mlbench_runner.tools.report import format_table, write_plots

    plots = write_plots([(out, summary)], out)
    print(format_table([summary]))
    return plots


#: The highest TCP port.
MAX_PORT = 65535


def port(text: str) -> int:
    """A TCP port for ``--metrics-port``: 0 (off) to 65535; argparse names the option on error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}") from None
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {value}")
    return value


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mlbench run", description="Run a BenchmarkRun YAML on this machine.")
    p.add_argument("run", help="BenchmarkRun YAML (as for kubectl apply)")
    p.add_argument("--local", action="store_true", help="run here (the only mode this command implements)")
    p.add_argument("--ranks", type=int, help="local ranks (default spec.workers x spec.slotsPerWorker)")
    p.add_argument("--output-dir", dest="output", help="result directory (default ./mlbench-results/<run>)")
    p.add_argument("--output", dest="output", help=argparse.SUPPRESS)  # deprecated alias of --output-dir
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
