"""The operator's pod specs and the runner's launcher, with a real sshd and a real mpirun over ssh.

Without a container runtime the pods cannot run, so this test plays kubelet on one machine: it
builds a 2-worker run with the operator's pure builders, projects the ConfigMap and the Secret
(the per-run key pair) into a temporary directory that stands in for their mount paths, starts
each worker's own command (``WORKER_SCRIPT``: sshd) and then the launcher's own command
(``mlbench-runner launch``: mpirun). Each worker "pod" gets its own loopback address
(127.0.0.2, 127.0.0.3); OpenMPI sees two remote nodes and starts its ``orted`` daemons through
ssh with the run's key, which is what the string asserts in ``tests/operator`` and
``tests/runner/test_mpirun.py`` cannot show. Everything that differs from a cluster is in plain
sight: :func:`localize` (mount paths), :func:`sshd_on_loopback` (port, listen address),
:func:`hostfile_on_loopback` (DNS names), ``metricsPort: 0`` in ``config.json`` (the "pods" share
one network namespace) and the few launcher variables that :func:`launcher_env` documents. The
wait-for-workers init container (DNS) is not run.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mlbench_api.results import RunSummary
from mlbench_operator import builders, reconcile
from mlbench_operator import naming as n
from mlbench_operator.builders import RunContext
from mlbench_operator.sshkeys import generate_keypair
from mlbench_runner.launch import DEFAULT_TERMINATION_LOG
from tests.runner.helpers import logreg_task

SSHD = "/usr/sbin/sshd"
MPIRUN = shutil.which("mpirun")
RUN, NAMESPACE, WORKERS = "sshrun", "team-ssh", 2
#: One loopback address per worker pod: distinct from 127.0.0.1 and from each other, so OpenMPI
#: treats them as remote nodes and launches through ssh (checked by the sshd logs below).
WORKER_ADDRS = ("127.0.0.2", "127.0.0.3")
#: The runner image's PATH, here: the venv (``mlbench-runner``, python) before the system (mpirun, ssh).
IMAGE_PATH = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/sbin", "/usr/bin", "/bin"])
USER = pwd.getpwuid(os.geteuid()).pw_name

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not os.path.exists(SSHD), reason=f"OpenSSH server ({SSHD}) is not installed"),
    pytest.mark.skipif(MPIRUN is None, reason="OpenMPI's mpirun is not installed on this machine"),
]

Obj = dict[str, Any]


# -- the rewrites: the only places where this machine differs from a cluster -----------------------------------
def localize(text: str, paths: Mapping[str, Path], expect: Iterable[str]) -> str:
    """Rewrite container paths in ``text`` to the directories that stand in for them here.

    ``paths`` maps a container path (a mount path, or ``/tmp`` for a container's own scratch) to a
    host directory; the longest path wins and only whole path components match, so ``/etc/mlbench``
    does not touch ``/etc/mlbench-ssh`` and ``/tmp`` does not touch ``/var/tmp``. Every path in
    ``expect`` must occur: if a builder stops using a path, this test fails instead of silently
    running something else.
    """
    ordered = sorted(paths, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w./-])(" + "|".join(map(re.escape, ordered)) + r")(?![\w.-])")
    seen: set[str] = set()

    def sub(m: re.Match[str]) -> str:
        seen.add(m.group(1))
        return str(paths[m.group(1)])

    out = pattern.sub(sub, text)
    missing = set(expect) - seen
    assert not missing, f"expected container paths {sorted(missing)} in {text!r}"
    return out


def sshd_on_loopback(script: str, addr: str, port: int) -> str:
    """Give the worker's sshd its own loopback address (its pod IP) and a free port.

    Pods have their own network namespace; here both workers share one, so each sshd listens on
    its own address only (never on all interfaces) and on a port that is free on this machine.
    """
    token = f" -p {n.SSH_PORT} "
    assert script.count(token) == 1, f"the worker script no longer runs sshd with{token!r}:\n{script}"
    return script.replace(token, f" -p {port} -o ListenAddress={addr} ")


def hostfile_on_loopback(hostfile: str, ctx: RunContext, addrs: Iterable[str]) -> str:
    """Replace the workers' DNS names (``<run>-worker-<i>.<run>.<ns>.svc``) by their loopback addresses."""
    addrs = list(addrs)
    lines = hostfile.splitlines()
    assert len(lines) == len(addrs), hostfile
    out = []
    for i, (line, addr) in enumerate(zip(lines, addrs, strict=True)):
        host, *options = line.split()
        assert host == n.worker_fqdn(ctx.name, ctx.namespace, i), f"line {i} of the hostfile: {line!r}"
        out.append(" ".join([addr, *options]) + "\n")
    return "".join(out)


# -- playing kubelet ------------------------------------------------------------------------------------------
def project(volume: Obj, objects: Mapping[str, Obj], dest: Path) -> None:
    """Write a configMap/secret volume into ``dest`` as kubelet would (keys as files, ``defaultMode``)."""
    dest.mkdir(parents=True, exist_ok=True)
    if "configMap" in volume:
        files, mode = objects[volume["configMap"]["name"]]["data"], volume["configMap"].get("defaultMode", 0o644)
    elif "secret" in volume:
        files, mode = objects[volume["secret"]["secretName"]]["stringData"], volume["secret"]["defaultMode"]
    else:
        assert set(volume) == {"name", "emptyDir"}, volume
        return
    for key, text in files.items():
        (dest / key).write_text(text)
        (dest / key).chmod(mode)


def container_env(container: Obj, pod: Obj, paths: Mapping[str, Path]) -> dict[str, str]:
    """The container's environment: values localized, the downward API's ``metadata.name`` resolved."""
    env: dict[str, str] = {}
    for var in container["env"]:
        if "valueFrom" in var:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, var
            env[var["name"]] = pod["metadata"]["name"]
        else:
            env[var["name"]] = localize(var["value"], paths, ())
    return env


def free_port(addrs: Iterable[str]) -> int:
    """A TCP port that is free on every one of ``addrs``."""
    addrs = list(addrs)
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addrs[0], 0))
            port = int(s.getsockname()[1])
            try:
                for addr in addrs[1:]:
                    with socket.socket() as t:
                        t.bind((addr, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no common free port on {addrs}")


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc), so teardown ends only what this test started."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc``'s process group and whatever it started (ssh sessions, orted, ranks)."""
    for pid in descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@dataclass
class Cluster:
    """One run's ConfigMap and Secret projected under ``paths``, with both workers' sshd running."""

    ctx: RunContext
    paths: dict[str, Path]
    port: int
    public_key: str
    sshd_logs: list[Path]

    def accepted(self) -> list[str]:
        return [line for log in self.sshd_logs for line in log.read_text().splitlines() if "Accepted" in line]


def run_context() -> RunContext:
    """The run as the operator admits it: a tiny open-division logistic regression, 2 workers, root containers."""
    task = {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkTask",
        "metadata": {"name": "ssh-logreg"},
        "spec": logreg_task(batch=5, epochs=2, train=200, features=12, alpha=3.0),
    }
    body = {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkRun",
        "metadata": {"name": RUN, "namespace": NAMESPACE, "uid": "uid-ssh", "generation": 1},
        "spec": {"taskRef": {"name": "ssh-logreg"}, "workers": WORKERS},
    }
    # run_as_user=None (MLBENCH_RUNNER_UID=image): containers run as the image's user, here whoever runs
    # this test (root on CI), with the Secret at 0400. The default non-root UID 1000 is not exercised.
    admitted = reconcile.admit(body, task, run_as_user=None)
    assert not isinstance(admitted, reconcile.Rejection), admitted
    return admitted[0]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    ctx = run_context()
    private, public = generate_keypair(f"mlbench-{ctx.namespace}-{ctx.name}")  # as handlers.py does
    config_map = builders.config_map(ctx)
    data = config_map["data"]
    data[n.HOSTFILE] = hostfile_on_loopback(data[n.HOSTFILE], ctx, WORKER_ADDRS)
    root = tmp_path / "fs"
    paths = {
        n.CONFIG_DIR: root / "etc-mlbench",
        n.SSH_DIR: root / "etc-mlbench-ssh",
        # The output emptyDir: one directory for every pod here (the ranks read outputDir from the
        # shared config.json), so the test checks below that the summary came through mpirun.
        n.OUTPUT_DIR: root / "output",
    }
    config = json.loads(localize(data[n.CONFIG_FILE], paths, [n.OUTPUT_DIR]))
    # Each rank is local rank 0 of its "node" and would serve metrics on 0.0.0.0:9400 in its own pod;
    # sharing one network namespace, the second would fail to bind: metrics off.
    assert config["metricsPort"] == n.METRICS_PORT
    config["metricsPort"] = 0
    data[n.CONFIG_FILE] = json.dumps(config, indent=2)
    secret = builders.ssh_secret(ctx, private, public)
    objects = {o["metadata"]["name"]: o for o in (config_map, secret)}

    port = free_port(WORKER_ADDRS)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # root sshd's privilege-separation directory
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for rank, addr in enumerate(WORKER_ADDRS):
            pod = builders.worker_pod(ctx, rank, attempt=0)
            (container,) = pod["spec"]["containers"]
            assert {m["mountPath"] for m in container["volumeMounts"]} == {*paths, "/dev/shm"}
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            for mount in container["volumeMounts"]:
                if mount["mountPath"] in paths:
                    project(volumes[mount["name"]], objects, paths[mount["mountPath"]])
            pod_paths = {**paths, "/tmp": root / pod["metadata"]["name"] / "tmp"}  # the container's own /tmp
            pod_paths["/tmp"].mkdir(parents=True)
            shell, flag, script = container["command"]
            assert (shell, flag, script) == ("/bin/sh", "-c", builders.WORKER_SCRIPT)
            script = sshd_on_loopback(localize(script, pod_paths, [n.SSH_DIR, "/tmp"]), addr, port)
            env = {**container_env(container, pod, pod_paths), "PATH": IMAGE_PATH}
            logs.append(root / f"{pod['metadata']['name']}.log")
            with open(logs[-1], "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [shell, flag, script], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )
            wait_ready(procs[-1], addr, port, logs[-1])
        yield Cluster(ctx, paths, port, public, logs)
    finally:
        for proc in procs:
            stop(proc)


def wait_ready(proc: subprocess.Popen[bytes], addr: str, port: int, log: Path, timeout: float = 15) -> None:
    """The worker's readinessProbe (tcpSocket on the ssh port)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"sshd exited with {proc.returncode}:\n{log.read_text()}")
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"sshd on {addr}:{port} not ready after {timeout}s:\n{log.read_text()}")


def launcher_env(cluster: Cluster, container: Obj, pod: Obj, paths: Mapping[str, Path]) -> dict[str, str]:
    """The launcher container's environment from the builder, plus what this machine needs.

    * ``PATH``: the image's PATH (``mlbench-runner`` and its python from the venv; mpirun, ssh);
      ``-x PATH`` forwards it to the ranks.
    * ``MLBENCH_SSH_PORT``: the builder's 2222 was replaced by a free port in the workers' sshd.
    * ``MASTER_PORT``: a free port for the rendezvous instead of the launcher's default 29500,
      which another test or process on this shared machine may hold.
    Nothing else: no inherited environment, no OMPI_MCA_* variables.
    """
    env = container_env(container, pod, paths)
    assert env[n.ENV_SSH_PORT] == str(n.SSH_PORT)
    return {**env, "PATH": IMAGE_PATH, n.ENV_SSH_PORT: str(cluster.port), "MASTER_PORT": str(free_port(["0.0.0.0"]))}


def launch(cluster: Cluster, ssh_dir: Path, termination_log: Path) -> subprocess.CompletedProcess[str]:
    """Run the launcher pod's container command with its (localized) environment."""
    pod = builders.launcher_pod(cluster.ctx, attempt=0)
    (container,) = pod["spec"]["containers"]
    assert container["terminationMessagePath"] == DEFAULT_TERMINATION_LOG
    assert {m["mountPath"] for m in container["volumeMounts"]} == set(cluster.paths)
    paths = {**cluster.paths, n.SSH_DIR: ssh_dir}
    env = launcher_env(cluster, container, pod, paths)
    for var in (n.ENV_CONFIG, n.ENV_HOSTFILE, n.ENV_SSH_KEY):
        assert Path(env[var]).is_file(), f"{var}={env[var]} is not projected"
    cmd = [*container["command"], *container.get("args", []), "--termination-log", str(termination_log)]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        for pid in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the launcher did not finish in 90 s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def fingerprint(public_key: str, tmp: Path) -> str:
    """``SHA256:...`` of a public key, as sshd logs it on ``Accepted publickey``."""
    path = tmp / "key.pub"
    path.write_text(public_key)
    out = subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def test_launcher_runs_ranks_through_worker_sshd(cluster: Cluster, tmp_path: Path) -> None:
    run_key = fingerprint(cluster.public_key, tmp_path)

    # The run's own key: mpirun reaches both workers' sshd, the ranks train, the summary comes back.
    log = tmp_path / "termination-log"
    proc = launch(cluster, cluster.paths[n.SSH_DIR], log)
    assert proc.returncode == 0, proc.stdout[-4000:]
    summary = RunSummary.from_termination_message(log.read_text())
    assert summary.run == RUN
    assert summary.environment.world_size == WORKERS
    assert summary.steps == 2 * 200 // (5 * WORKERS)
    # Through mpirun's forwarded output (rank 0's tagged stdout), not the shared summary.json.
    assert any(line.startswith("[1,0]<stdout>:") and '"run_summary"' in line for line in proc.stdout.splitlines())
    for addr, worker_log in zip(WORKER_ADDRS, cluster.sshd_logs, strict=True):  # loopback only, never *:port
        listening = [line for line in worker_log.read_text().splitlines() if line.startswith("Server listening")]
        assert listening == [f"Server listening on {addr} port {cluster.port}."], listening
    accepted = cluster.accepted()
    assert len(accepted) == WORKERS, "\n".join(accepted) + proc.stdout[-2000:]
    for line, worker_log in zip(accepted, cluster.sshd_logs, strict=True):
        assert f"Accepted publickey for {USER} " in line, (worker_log, line)
        assert run_key in line, (worker_log, line)

    # Another key pair in the launcher's Secret mount: sshd refuses it and the launcher reports it.
    wrong_dir = tmp_path / "wrong-ssh"
    private, public = generate_keypair("mlbench-wrong")
    wrong_secret = builders.ssh_secret(cluster.ctx, private, public)
    launcher_volume = next(v for v in builders.launcher_pod(cluster.ctx, attempt=0)["spec"]["volumes"] if "secret" in v)
    project(launcher_volume, {wrong_secret["metadata"]["name"]: wrong_secret}, wrong_dir)
    wrong_log = tmp_path / "termination-log-wrong"
    proc = launch(cluster, wrong_dir, wrong_log)
    assert proc.returncode != 0, proc.stdout[-4000:]
    error = json.loads(wrong_log.read_text())
    assert set(error) == {"error", "exitCode"}, error
    assert error["exitCode"] == proc.returncode
    assert "mpirun exited with" in error["error"]
    # The termination log itself names ssh's reason first, not only mpirun's generic tail.
    assert "Permission denied" in error["error"].split("; last output:")[0].split("; cause: ")[1], error
    assert len(wrong_log.read_bytes()) <= 4096
    assert "Permission denied (publickey)" in proc.stdout, proc.stdout[-4000:]  # the launcher's log: ssh said why
    assert cluster.accepted() == accepted, "sshd accepted a key that is not the run's"
    assert fingerprint(public, tmp_path) not in "".join(log.read_text() for log in cluster.sshd_logs)
