"""The launcher pod's entrypoint: mpirun over the hostfile, then report the result.

``mlbench-runner launch`` runs ``mpirun --hostfile H -np <worldSize> ... <rank command>``
and forwards its output. The rank command is the task's ``runner.command`` (default
``mlbench-runner train``, run as ``python -m mlbench_runner.cli train --config C``; see
:func:`rank_command`). Rank 0 prints a
``run_summary`` event line carrying the compact summary; the launcher writes that (the
:meth:`RunSummary.termination_message`) to the termination log and exits 0, or writes
``{"error": ..., "exitCode": n}`` and exits non-zero when no summary came back or mpirun
failed. An aborted run (status ``aborted``: every rank exits 3) still gets its summary
written, and the launcher exits 3. Whatever the outcome, once mpirun has run the launcher's last
output line carries rank 0's full results for the operator to keep (:mod:`mlbench_runner.pod.collect`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from mlbench_api.bundle import SUMMARY as SUMMARY_FILE
from mlbench_api.config import RunConfig
from mlbench_api.contract import (
    ENV_CONFIG,
    ENV_DATA_DIR,
    ENV_FORWARD_ENV,
    ENV_HOSTFILE,
    ENV_SSH_HOST_KEY_ALIAS,
    ENV_SSH_KEY,
    ENV_SSH_KNOWN_HOSTS,
    ENV_SSH_PORT,
    ENV_TERMINATION_LOG,
    HOSTFILE_PATH,
    SSH_PORT,
    SSH_SCRATCH_DIR,
    TERMINATION_LOG,
)
from mlbench_api.results import RunSummary
from mlbench_api.task import RUNNER_ENTRYPOINT
from mlbench_runner import stopping
from mlbench_runner.options import knob_names
from mlbench_runner.pod.collect import (
    CONNECT_TIMEOUT_SECONDS,
    gather,
    handshake_delay,
    rank0_event,
    results_line,
    ssh_options,
)
from mlbench_runner.world import parse_hostfile

#: Kubernetes reads at most 4096 bytes of a termination message.
TERMINATION_LIMIT = 4096
#: Output lines that name the real cause of a failed launch (ssh, name resolution, a
#: Python error); they go first in the error message, before mpirun's generic tail.
CAUSE = re.compile(
    r"Permission denied|ssh: |Could not resolve|Connection refused|Host key verification failed"
    r"|^\w*(Error|Exception)\b|\b\w+(Error|Exception): |^error: "
)
MAX_CAUSES = 10
#: Rank 0's event lines kept from mpirun's output, the fallback when worker 0's events.jsonl is gone.
MAX_SEEN_EVENTS = 100_000
#: Seconds the ranks of a stopped launcher get to end on their own (SIGUSR1, passed on by mpirun) before
#: mpirun is SIGTERMed: within the local command's settle time (10 s) and the kubelet's grace period (30 s).
RANK_STOP_SECONDS = 8
#: The launcher's own variables that every rank needs (not execution knobs): the run configuration, the
#: rendezvous, the hostfile, the dataset cache and the fallback dataset directory.
LAUNCHER_ENV = (ENV_CONFIG, "MASTER_ADDR", "MASTER_PORT", ENV_HOSTFILE, "MLBENCH_CACHE", ENV_DATA_DIR)
#: The runtime's: the interpreter's path, the libraries, the collectives' interfaces and threads.
RUNTIME_ENV = (
    "PYTHONPATH",
    "PATH",
    "LD_LIBRARY_PATH",
    "NCCL_DEBUG",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "OMP_NUM_THREADS",
)
#: Environment forwarded to every rank with ``-x`` (when set on the launcher): the launcher's variables,
#: every execution knob (declared once, in :mod:`mlbench_runner.options`) and the runtime's.
FORWARD_ENV = (*LAUNCHER_ENV, *knob_names(), *RUNTIME_ENV)
#: A variable's name as ``mpirun -x`` takes it (a C identifier).
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def forwarded_env(env: dict[str, str]) -> list[str]:
    """The names ``mpirun -x`` forwards: :data:`FORWARD_ENV` and the run's own (``spec.pod.env``, named by the
    operator in ``MLBENCH_FORWARD_ENV``), those set in ``env`` only, each once. A name that is no identifier
    (the variable edited by hand) is skipped: ``-x`` would read ``A=B`` as an assignment."""
    given = [x.strip() for x in env.get(ENV_FORWARD_ENV, "").split(",")]
    run = [x for x in given if ENV_NAME.fullmatch(x)]
    return [name for name in dict.fromkeys((*FORWARD_ENV, *run)) if name in env]


def launcher_command(config_path: Path, hostfile: Path, termination_log: Path, *, oversubscribe: bool) -> list[str]:
    """``mlbench-runner launch`` as this interpreter runs it (local runs and tests)."""
    cmd = [sys.executable, "-m", "mlbench_runner.cli", "launch", "--config", str(config_path)]
    cmd += ["--hostfile", str(hostfile), "--termination-log", str(termination_log)]
    return [*cmd, "--oversubscribe"] if oversubscribe else cmd


def rank_config_path(path: str) -> str:
    """The config path every rank opens: absolute, but with its symlinks kept.

    A ConfigMap volume is a symlink farm (``config.json -> ..data/config.json``, ``..data ->
    ..2026_11_23_11_22_09.3663563106``) whose timestamped target differs in every pod: the
    launcher's resolved path does not exist on the workers.
    """
    return os.path.abspath(path)


def rank_command(command: Sequence[str], config_path: str, python: str = sys.executable) -> list[str]:
    """What every rank executes for a task's ``runner.command``.

    ``mlbench-runner <subcommand> ...`` (the default ``train``, or ``collectives``) becomes
    ``python -m mlbench_runner.cli <subcommand> ... --config C``: the same program as the console
    script, on the interpreter that has the project. Any other command (an open-division image's
    own trainer) runs as given; it finds the run configuration at ``$MLBENCH_RUN_CONFIG`` (exported
    to every rank) and reports through the result contract of docs/runner.md.
    """
    if not command:
        raise ValueError("runner.command: empty")
    if command[0] == RUNNER_ENTRYPOINT:
        return [python, "-m", "mlbench_runner.cli", *command[1:], "--config", config_path]
    return list(command)


def mpirun_command(
    *,
    world_size: int,
    hostfile: str,
    config_path: str,
    ssh_port: int = SSH_PORT,
    ssh_key: str | None = None,
    ssh_known_hosts: str | None = None,
    ssh_host_key_alias: str | None = None,
    oversubscribe: bool = False,
    mpirun: str = "mpirun",
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    extra_mpi_args: Sequence[str] = (),
    command: Sequence[str] = (RUNNER_ENTRYPOINT, "train"),
    ssh_delay: int = 0,
) -> list[str]:
    """The full mpirun command line (the operator's launcher runs exactly this); ``command`` is the
    task's ``runner.command``; ``ssh_delay`` the seconds an emulated network adds to ssh's connect
    (:func:`.collect.handshake_delay`)."""
    env = dict(os.environ if env is None else env)
    timeout = CONNECT_TIMEOUT_SECONDS + ssh_delay
    rsh = shlex.join(ssh_options(ssh_port, ssh_key, ssh_known_hosts, ssh_host_key_alias, connect_timeout=timeout))
    cmd = [
        mpirun,
        "--hostfile",
        hostfile,
        "-np",
        str(world_size),
        "--bind-to",
        "none",
        "--map-by",
        "slot",
        "--tag-output",
        "-mca",
        "plm_rsh_args",
        rsh,
        # Workers are reached by their Service names (<pod>.<run>.<ns>.svc): Open MPI would shorten
        # them to <pod>, which only the pod itself resolves, and a daemon launching its tree-spawn
        # children over ssh would fail with "Could not resolve hostname" (as Kubeflow's mpi-operator does).
        "-mca",
        "orte_keep_fqdn_hostnames",
        "1",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if oversubscribe:
        cmd.append("--oversubscribe")
    for name in forwarded_env(env):
        cmd += ["-x", name]
    cmd += list(extra_mpi_args)
    cmd += rank_command(command, config_path, python)
    return cmd


#: The tag ``--tag-output`` puts before each piece of a rank's output: ``[<job>,<rank>]<stdout>:``.
MPI_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err|diag)>:")


def strip_tag(line: str) -> str:
    """The line without mpirun's ``[1,0]<stdout>:`` tags (from ``--tag-output``).

    mpirun tags each piece it reads, not each line: a line the rank wrote in two pieces (a long
    summary, a write cut by a signal) arrives as ``[1,0]<stdout>:{... "eval[1,0]<stdout>:uation": ...}``,
    so the same tag is dropped inside the line too.
    """
    tag = MPI_TAG.match(line)
    return line[tag.end() :].replace(tag.group(), "") if tag else line


def summary_from_line(line: str) -> RunSummary | None:
    """The RunSummary carried by a ``run_summary`` event line, else None."""
    text = strip_tag(line).strip()
    if not text.startswith("{") or '"run_summary"' not in text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("event") != "run_summary":
        return None
    try:
        return RunSummary.model_validate(data.get("summary"))
    except ValidationError:  # mangled on its way (another rank's output inside it): summary.json stands instead
        return None


class Streamed(NamedTuple):
    code: int
    #: A SIGINT or SIGTERM to the launcher was passed on to the command.
    stopped: bool = False


def stream(cmd: list[str], on_line: Callable[[str], None], env: dict[str, str] | None = None) -> Streamed:
    """Run ``cmd``, handing each output line (stdout and stderr merged) to ``on_line``.

    A SIGINT or SIGTERM to the launcher (a Ctrl-C, a deleted pod) reaches ``cmd`` (mpirun) as one SIGUSR1,
    which it passes on to every rank, and as a SIGTERM :data:`RANK_STOP_SECONDS` later if it still runs;
    the output is still read to its end: the ranks' ``aborted`` summary is what the launcher then reports.
    """
    # errors="replace": mpirun tags each piece of output it reads, not each line, so a tag can land inside a
    # multi-byte character (a progress bar's block), and a rank may print any bytes; a strict decode would end
    # the launcher with a traceback and no termination message.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env, bufsize=1
    )
    assert proc.stdout is not None
    with stopping.forwarded_once(proc, escalate_after=RANK_STOP_SECONDS) as stopped:
        for line in proc.stdout:
            on_line(line.rstrip("\n"))
        return Streamed(proc.wait(), stopped.is_set())


def write_termination(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        print(json.dumps({"event": "termination_log_unwritable", "path": path, "error": str(exc)}), file=sys.stderr)


def exit_status(code: int) -> int:
    """Popen's return code as a shell would report it: killed by signal n -> 128 + n."""
    return 128 - code if code < 0 else code


def error_message(error: str, code: int) -> str:
    """``{"error": ..., "exitCode": n}``, cut so that its UTF-8 encoding fits in 4 KiB."""
    cut = len(error)
    while True:
        msg = json.dumps({"error": error[:cut], "exitCode": code}, separators=(",", ":"))
        size = len(msg.encode())
        if size <= TERMINATION_LIMIT:
            return msg
        # escaping makes a character 1-12 bytes: scale the cut by the overshoot, always shrink
        cut = max(0, min(cut - 1, cut * (TERMINATION_LIMIT - 64) // size))


def is_cause(line: str) -> bool:
    return bool(CAUSE.search(strip_tag(line).strip()))


def _encoded(text: str) -> int:
    return len(json.dumps(text)) - 2  # bytes once escaped in the termination message


def failure_text(reason: str, causes: Sequence[str], tail: Sequence[str], budget: int = 3500) -> str:
    """The reason, then the lines that say why (as they came), then the newest output lines.

    Each line is cut to 400 characters and the tail is taken from the newest line backwards
    while the escaped text stays within ``budget`` bytes, so the last line always survives.
    """
    picked: list[str] = []
    for line in causes:
        text = strip_tag(line).strip()[:400]
        if text and text not in picked:
            picked.append(text)
    parts = [reason]
    if picked:
        parts.append("cause: " + " | ".join(picked))
    used = sum(_encoded(p) for p in parts)
    rest: list[str] = []
    for line in reversed(tail[-8:]):
        text = strip_tag(line).strip()[:400]
        if not text or text in picked:
            continue
        if used + _encoded(text) + 3 > budget:
            break
        rest.insert(0, text)
        used += _encoded(text) + 3
    if rest:
        parts.append("last output: " + " | ".join(rest))
    return "; ".join(parts)


#: Where the pods keep their private copies of the run's private keys: the worker script (the operator's
#: ``runpods.WORKER_SCRIPT``) copies the host key and the client key here, the launcher the client key.
#: One path in every pod, because mpirun's tree spawn hands the launcher's ssh options (``-i <copy>``) to
#: the daemons on the workers, which start the next workers with them. ``MLBENCH_SSH_PRIVATE_DIR``
#: moves it for tests that run several "pods" on one machine.
PRIVATE_SSH_DIR = SSH_SCRATCH_DIR  # a memory-backed emptyDir in the pods


class PodSetupError(RuntimeError):
    """The launcher's own pod could not do its part (a full or read-only ``/tmp``): not the run's input, so not
    exit code 2 (a failed run at once); a new launcher pod may well succeed, as the restart policy decides."""


def private_key(path: str, directory: str | None = None) -> str:
    """A copy of the run's ssh client key that ssh accepts whoever runs the launcher: this user's, 0600.
    ssh refuses a key others may read when it owns the file, and the mounted one is root's (0440 + fsGroup
    for the operator's UID; 0444 under the image's own user, which may be root).

    Raises OSError when the mounted key cannot be read (the run's input) and :class:`PodSetupError` when the
    copy cannot be written (this pod's file system)."""
    data = Path(path).read_bytes()
    target = Path(directory or os.environ.get("MLBENCH_SSH_PRIVATE_DIR") or PRIVATE_SSH_DIR)
    tmp = None
    try:
        target.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target, prefix=".key-")  # 0600, this user's
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        copy = target / Path(path).name
        os.replace(tmp, copy)
    except OSError as exc:
        if tmp is not None:  # no partial copy of a private key is left behind
            Path(tmp).unlink(missing_ok=True)
        raise PodSetupError(f"cannot write the ssh key's private copy under {target}: {exc}") from exc
    return str(copy)


def run_launch(args: argparse.Namespace) -> int:
    """``mlbench-runner launch``: mpirun every rank and write the run's result to the termination log."""
    with stopping.noted_early(stopping.STOP_SIGNALS):  # from its first line: PID 1 ignores what it cannot handle
        return _launch(args)


class LaunchFailed(Exception):
    """The launcher ends before a run could give its result: ``str(exc)`` goes to the termination log with exit
    ``code``; ``said`` (default: the same text) to stderr, unless None."""

    def __init__(self, message: str, code: int, said: str | None = "") -> None:
        super().__init__(message)
        self.code = code
        self.said = message if said == "" else said


@dataclass(frozen=True)
class Launch:
    """What the launcher read and will run: the rank's config path, the config, the hostfile's hosts, the ssh
    key's private copy, the ranks' environment and the mpirun command."""

    config: RunConfig
    hosts: list[tuple[str, int]]
    ssh_key: str | None
    env: dict[str, str]
    cmd: list[str]


@dataclass
class RankOutput:
    """What the launcher keeps of the ranks' output as it streams: rank 0's summary lines, its events, the
    lines that look like a failure's cause, and the last lines."""

    found: list[RunSummary] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def on_line(self, line: str) -> None:
        print(line, flush=True)
        event = rank0_event(strip_tag(line))
        if event is not None and len(self.events) < MAX_SEEN_EVENTS:
            self.events.append(event)
        summary = summary_from_line(line)
        if summary is not None:
            self.found.append(summary)
            return
        if len(self.causes) < MAX_CAUSES and is_cause(line):
            self.causes.append(line)
        self.tail.append(line)
        del self.tail[:-20]


def _launch(args: argparse.Namespace) -> int:
    try:
        launch = prepare_launch(args)
        print(json.dumps({"event": "launch", "command": launch.cmd}), flush=True)
        if args.dry_run:
            return 0
        out = RankOutput()
        code, stopped = _run_ranks(launch, out)
    except LaunchFailed as exc:
        write_termination(args.termination_log, error_message(str(exc), exc.code))
        if exc.said is not None:
            print(f"error: {exc.said}", file=sys.stderr)
        return exc.code
    _collect(args, launch, out)
    message, status = verdict(out, code, stopped)
    write_termination(args.termination_log, message)
    return status


def prepare_launch(args: argparse.Namespace) -> Launch:
    """The config, the hosts and the ssh key read and checked, and the mpirun command; raises
    :class:`LaunchFailed` (2: the run's input; 1: this pod's file system)."""
    config_path = args.config or os.environ.get(ENV_CONFIG)
    if not config_path:
        raise LaunchFailed(f"no --config and no ${ENV_CONFIG}", 2, said=f"pass --config or set {ENV_CONFIG}")
    try:
        config = RunConfig.load(config_path)
        hosts = parse_hostfile(args.hostfile)
        ssh_key = private_key(args.ssh_key) if args.ssh_key else None
    except PodSetupError as exc:
        raise LaunchFailed(str(exc), 1) from exc
    except (OSError, ValueError) as exc:
        raise LaunchFailed(str(exc), 2) from exc
    if args.ssh_known_hosts and not Path(args.ssh_known_hosts).is_file():  # ssh would refuse every worker
        raise LaunchFailed(f"ssh known_hosts file {args.ssh_known_hosts} does not exist", 2)
    slots = sum(s for _, s in hosts)
    if slots < config.world_size and not args.oversubscribe:
        raise LaunchFailed(f"hostfile {args.hostfile} has {slots} slots for worldSize {config.world_size}", 2)
    env = dict(os.environ)
    env[ENV_CONFIG] = rank_config_path(config_path)
    env.setdefault(ENV_HOSTFILE, args.hostfile)
    env.setdefault("MASTER_ADDR", hosts[0][0])
    env.setdefault("MASTER_PORT", str(args.master_port))
    cmd = mpirun_command(
        world_size=config.world_size,
        hostfile=args.hostfile,
        config_path=env[ENV_CONFIG],
        ssh_port=args.ssh_port,
        ssh_key=ssh_key,
        ssh_known_hosts=args.ssh_known_hosts,
        ssh_host_key_alias=args.ssh_host_key_alias,
        oversubscribe=args.oversubscribe,
        mpirun=args.mpirun,
        env=env,
        extra_mpi_args=shlex.split(args.mpi_args or ""),
        command=config.task.runner.command,
        ssh_delay=handshake_delay(config.network),
    )
    return Launch(config, hosts, ssh_key, env, cmd)


def _run_ranks(launch: Launch, out: RankOutput) -> Streamed:
    """mpirun, its output handed to ``out``; raises :class:`LaunchFailed` when it was stopped before it started
    (nothing to stop, no results to gather) or cannot be started."""
    early = stopping.pending()
    if early is not None:
        raise LaunchFailed(f"stopped by {early.name} before mpirun started", 128 + early)
    try:
        return stream(launch.cmd, out.on_line, launch.env)
    except FileNotFoundError as exc:
        raise LaunchFailed(f"cannot start mpirun: {exc}", 127, said=None) from exc


def _collect(args: argparse.Namespace, launch: Launch, out: RankOutput) -> None:
    """Rank 0's results gathered and printed as the log's last line (the operator keeps it:
    mlbench_api.bundle); its summary read from its file where no line carried it."""
    summary_file = Path(launch.config.output_dir, "summary.json")
    if not out.found and summary_file.exists():
        # an open-division program's broken file (not JSON, not UTF-8, unreadable): the error message below
        with contextlib.suppress(ValidationError, OSError):
            out.found.append(RunSummary.model_validate_json(summary_file.read_bytes()))
    files, line = _gathered(args, launch, out)
    if not out.found and files.get(SUMMARY_FILE):  # the summary line was lost or mangled: worker 0's summary.json
        with contextlib.suppress(ValidationError):
            out.found.append(RunSummary.model_validate_json(files[SUMMARY_FILE]))
    if line is not None:
        print(line, flush=True)


def _gathered(args: argparse.Namespace, launch: Launch, out: RankOutput) -> tuple[dict[str, bytes], str | None]:
    """Rank 0's result files and their ``run_results`` line; best effort: a problem here must not turn a
    finished run into a failed one."""
    try:
        files = gather(
            launch.config.output_dir,
            launch.env[ENV_CONFIG],
            launch.hosts[0][0] if launch.hosts else None,
            ssh_port=args.ssh_port,
            ssh_key=launch.ssh_key,
            seen_events=out.events,
            seen_summary=out.found[-1] if out.found else None,
            ssh_known_hosts=args.ssh_known_hosts,
            ssh_host_key_alias=args.ssh_host_key_alias,
            delay=handshake_delay(launch.config.network),
        )
        return files, results_line(files)
    except Exception as exc:
        print(json.dumps({"event": "results_not_collected", "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return {}, None


def verdict(out: RankOutput, code: int, stopped: bool) -> tuple[str, int]:
    """The termination message and the launcher's exit status, from mpirun's exit ``code``, whether the launcher
    passed on a stop signal, and what the ranks printed."""
    if out.found and out.found[-1].status == "aborted" and (code in (0, 3) or stopped):
        # Every rank exits 3 on an aborted run (a collective decision), so mpirun does too: keep the
        # summary; also when the launcher passed on a stop signal, whatever mpirun's own code then is.
        # Another code means a rank crashed: report that error instead.
        summary = out.found[-1]
        if stopped and summary.stop_reason == "error":
            # rank 0's collective broke when a peer took the stop first: the stop, not the peer, ended the run
            # (and the operator restarts an interrupted run like any lost pod)
            summary = summary.model_copy(update={"stop_reason": "interrupted"})
        return summary.termination_message(), 3
    if code != 0 or not out.found:
        status = exit_status(code) or 1
        return error_message(failure_text(failure_reason(code), out.causes, out.tail), status), status
    return out.found[-1].termination_message(), 0


def failure_reason(code: int) -> str:
    """Why a run without a summary failed, from mpirun's exit code."""
    if code < 0:
        return f"mpirun was killed by signal {-code}"
    if code != 0:
        return f"mpirun exited with {code}"
    return "no run summary from rank 0"


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help=f"RunConfig JSON/YAML (default ${ENV_CONFIG})")
    parser.add_argument("--hostfile", default=os.environ.get(ENV_HOSTFILE, HOSTFILE_PATH))
    parser.add_argument("--termination-log", default=os.environ.get(ENV_TERMINATION_LOG, TERMINATION_LOG))
    parser.add_argument("--ssh-port", type=int, default=int(os.environ.get(ENV_SSH_PORT, SSH_PORT)))
    parser.add_argument("--ssh-key", default=os.environ.get(ENV_SSH_KEY))
    parser.add_argument(
        "--ssh-known-hosts",
        default=os.environ.get(ENV_SSH_KNOWN_HOSTS),
        help="known_hosts with the workers' host key: strict host key checking (without it: not checked)",
    )
    parser.add_argument(
        "--ssh-host-key-alias",
        default=os.environ.get(ENV_SSH_HOST_KEY_ALIAS),
        help="check every worker's host key under this name in --ssh-known-hosts (ssh HostKeyAlias)",
    )
    parser.add_argument("--master-port", type=int, default=int(os.environ.get("MASTER_PORT", "29500")))
    parser.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    parser.add_argument("--mpi-args", default=os.environ.get("MLBENCH_MPI_ARGS"), help="extra mpirun arguments")
    parser.add_argument(
        "--oversubscribe", action="store_true", default=os.environ.get("MLBENCH_OVERSUBSCRIBE", "0") == "1"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the mpirun command and exit")
