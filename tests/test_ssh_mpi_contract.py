"""The operator's pod specs and the runner's launcher, with a real sshd and a real mpirun over ssh.

Without a container runtime the pods cannot run, so this test plays kubelet on one machine: it
builds a 2-worker run with the operator's pure builders, projects the ConfigMap and the Secret
(the per-run key pair) into a temporary directory that stands in for their mount paths, starts
each worker's own command (``WORKER_SCRIPT``: sshd) and then the launcher's own command
(``mlbench-runner launch``: mpirun). Each worker "pod" gets its own loopback address
(127.0.0.2, 127.0.0.3); OpenMPI sees two remote nodes and starts its ``orted`` daemons through
ssh with the run's key, which is what the string asserts in ``tests/operator`` and
``tests/runner/test_mpirun.py`` cannot show. The run's SSH hardening is checked against the same
real sshd: every worker presents the run's host key and the launcher accepts no other (an impostor
worker with a different host key is refused before it sees anything), the run's client key is
``restrict``-ed (no forwarding, no pty), and the non-root Secret modes (root-owned 0440 + fsGroup)
satisfy sshd and ssh. Everything that differs from a cluster is in plain
sight: :func:`localize` (mount paths), :func:`sshd_on_loopback` (port, listen address),
:func:`hostfile_on_loopback` (DNS names), ``metricsPort: 0`` in ``config.json`` (the "pods" share
one network namespace) and the few launcher variables that :func:`launcher_env` documents. The
wait-for-workers init container (DNS) is not run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mlbench_api import contract
from mlbench_api.results import RunSummary
from mlbench_operator import naming as n
from mlbench_operator import runobjects, runpods
from mlbench_operator.run import admission
from mlbench_operator.runcontext import RunContext
from mlbench_operator.sshkeys import RunKeys, generate_keypair
from mlbench_runner.pod.collect import read_remote, ssh_options
from mlbench_runner.pod.launch import private_key
from mlbench_runner.world import free_port
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
    pytest.mark.multiproc,
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
    token = f" -p {contract.SSH_PORT} "
    assert script.count(token) == 1, f"the worker script no longer runs sshd with{token!r}:\n{script}"
    return script.replace(token, f" -p {port} -o ListenAddress={addr} ")


def without_supervisor(script: str) -> str:
    """Run sshd itself instead of ``mlbench-runner worker -- sshd``: for a UID that cannot reach this
    machine's interpreter (e.g. a venv on a pyenv python under /root). The supervisor only watches
    for OOM kills; sshd, its options and the mounted files are unchanged."""
    token = "exec mlbench-runner worker -- /usr/sbin/sshd "
    assert script.count(token) == 1, f"the worker script no longer runs {token!r}:\n{script}"
    return script.replace(token, "exec /usr/sbin/sshd ")


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
def project(volume: Obj, objects: Mapping[str, Obj], dest: Path, fs_group: int | None = None) -> None:
    """Write a configMap/secret volume into ``dest`` as kubelet would (keys as files, ``defaultMode``).

    Files are the caller's (kubelet: root's); with the pod's ``fsGroup`` their group is that group
    and, the volume being read-only, group-readable (kubelet's ``SetVolumeOwnership``).
    """
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
        if fs_group is not None:
            os.chown(dest / key, -1, fs_group)
            mode |= 0o440
        (dest / key).chmod(mode)


def node_of(pod: Obj) -> str:
    """The node this test "schedules" a pod on (the downward API's ``spec.nodeName``)."""
    return f"node-of-{pod['metadata']['name']}"


def container_env(container: Obj, pod: Obj, paths: Mapping[str, Path]) -> dict[str, str]:
    """The container's environment: values localized, the downward API's ``metadata.name`` and ``spec.nodeName``
    resolved."""
    fields = {"metadata.name": pod["metadata"]["name"], "spec.nodeName": node_of(pod)}
    env: dict[str, str] = {}
    for var in container["env"]:
        if "valueFrom" in var:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            assert path in fields, var
            env[var["name"]] = fields[path]
        else:
            env[var["name"]] = localize(var["value"], paths, ())
    return env


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
class Worker:
    rank: int
    addr: str
    proc: subprocess.Popen[bytes]
    log: Path

    def accepted(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if "Accepted" in line]


@dataclass
class Cluster:
    """One run's ConfigMap and Secret projected under ``paths``, with its workers' sshd running.

    ``paths`` are the launcher's mounts; every worker "pod" has its own copy of the Secret volume
    (and its own ``/tmp``) under ``root/<pod>``, the ConfigMap and the output directory are shared.
    """

    ctx: RunContext
    keys: RunKeys
    root: Path
    paths: dict[str, Path]
    objects: dict[str, Obj]
    port: int
    as_user: int | None = None
    workers: list[Worker] = dataclasses.field(default_factory=list)

    @property
    def public_key(self) -> str:
        return self.keys.client_public

    @property
    def sshd_logs(self) -> list[Path]:
        return [w.log for w in self.workers]

    def accepted(self) -> list[str]:
        return [line for w in self.workers for line in w.accepted()]

    def start_worker(self, rank: int, objects: Mapping[str, Obj] | None = None, tag: str = "") -> Worker:
        """Play kubelet for worker ``rank``: project its volumes, run its command (``WORKER_SCRIPT``)."""
        addr = WORKER_ADDRS[rank]
        pod = runpods.worker_pod(self.ctx, rank, attempt=0)
        name = pod["metadata"]["name"] + tag
        (container,) = pod["spec"]["containers"]
        # the ssh scratch (a memory emptyDir) lies under /tmp, which each played pod has of its own (below)
        assert {m["mountPath"] for m in container["volumeMounts"]} == {
            *self.paths,
            "/dev/shm",
            contract.SSH_SCRATCH_DIR,
        }
        # the container's own Secret volume and /tmp; the ConfigMap and the output directory are shared
        pod_paths = {
            **self.paths,
            contract.SSH_DIR: self.root / name / "etc-mlbench-ssh",
            "/tmp": self.root / name / "tmp",
        }
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        fs_group = pod["spec"]["securityContext"].get("fsGroup")
        for mount in container["volumeMounts"]:
            if mount["mountPath"] in pod_paths:
                project(volumes[mount["name"]], objects or self.objects, pod_paths[mount["mountPath"]], fs_group)
        pod_paths["/tmp"].mkdir(parents=True)
        if self.as_user is not None:
            os.chown(pod_paths["/tmp"], self.as_user, self.as_user)
        shell, flag, script = container["command"]
        assert (shell, flag, script) == ("/bin/sh", "-c", runpods.WORKER_SCRIPT)
        script = sshd_on_loopback(localize(script, pod_paths, [contract.SSH_DIR, "/tmp"]), addr, self.port)
        if self.as_user is not None:
            script = without_supervisor(script)
        env = {**container_env(container, pod, pod_paths), "PATH": IMAGE_PATH}
        log_path = self.root / f"{name}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [shell, flag, script],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **user_args(self.as_user),
            )
        worker = Worker(rank, addr, proc, log_path)
        self.workers.append(worker)
        wait_ready(proc, addr, self.port, log_path)
        return worker

    def stop_worker(self, worker: Worker) -> None:
        stop(worker.proc)
        self.workers.remove(worker)

    def launcher_env(self, ssh_dir: Path | None = None) -> dict[str, str]:
        pod = runpods.launcher_pod(self.ctx, attempt=0)
        (container,) = pod["spec"]["containers"]
        return launcher_env(
            self, container, pod, {**self.paths, contract.SSH_DIR: ssh_dir or self.paths[contract.SSH_DIR]}
        )

    def client_options(self, as_user: int | None = None) -> list[str]:
        """The ssh options ``mlbench-runner launch`` derives from the launcher's environment, with its
        private copy of the client key (made as ``as_user``, who runs ssh)."""
        env = self.launcher_env()
        key = Path(private_key(env[contract.ENV_SSH_KEY], tempfile.mkdtemp(dir=self.root)))
        if as_user is not None:  # as if that user had made it (it cannot run this interpreter: see user_args)
            for path in (key.parent, key):
                os.chown(path, as_user, as_user)
        return ssh_options(
            int(env[contract.ENV_SSH_PORT]),
            str(key),
            env[contract.ENV_SSH_KNOWN_HOSTS],
            env[contract.ENV_SSH_HOST_KEY_ALIAS],
        )


def user_args(uid: int | None) -> dict[str, Any]:
    """Popen's arguments that run a child as ``uid`` (its own group only: runAsUser/runAsGroup/fsGroup)."""
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": [uid]}


def run_context(run_as_user: int | None = None) -> RunContext:
    """The run as the operator admits it: a tiny open-division logistic regression, 2 workers.

    run_as_user=None (MLBENCH_RUNNER_UID=image): containers run as the image's user, here whoever
    runs this test (root on CI), with the Secret at 0400. The default non-root UID 1000 (0440 +
    fsGroup) is exercised by :func:`test_non_root_pods_accept_the_secret_modes`.
    """
    task: dict[str, Any] = {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkTask",
        "metadata": {"name": "ssh-logreg"},
        "spec": logreg_task(batch=5, epochs=2, train=200, features=12, alpha=3.0),
    }
    # The project's runner image, which the operator's default admission policy allows (never pulled here).
    task["spec"]["runner"]["image"] = "localhost/mlbench/mlbench-runner:test"
    body = {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkRun",
        "metadata": {"name": RUN, "namespace": NAMESPACE, "uid": "uid-ssh", "generation": 1},
        "spec": {"taskRef": {"name": "ssh-logreg"}, "workers": WORKERS},
    }
    admitted = admission.admit(body, task, run_as_user=run_as_user)
    assert not isinstance(admitted, admission.Rejection), admitted
    return admitted[0]


@contextlib.contextmanager
def started(
    ctx: RunContext, root: Path, ranks: Iterable[int] = range(WORKERS), image_user: int | None = None
) -> Iterator[Cluster]:
    """The run's objects projected under ``root``, worker ``ranks`` started; everything stopped after. The
    containers run as the run's UID, else as ``image_user`` (an image's own non-root USER), else as whoever
    runs this test."""
    keys = generate_keypair(f"mlbench-{ctx.namespace}-{ctx.name}")  # as handlers.py does
    config_map = runobjects.config_map(ctx)
    data = config_map["data"]
    data[contract.HOSTFILE] = hostfile_on_loopback(data[contract.HOSTFILE], ctx, WORKER_ADDRS)
    paths = {
        contract.CONFIG_DIR: root / "etc-mlbench",
        contract.SSH_DIR: root / "etc-mlbench-ssh",
        # The output emptyDir: one directory for every pod here (the ranks read outputDir from the
        # shared config.json), so the test checks below that the summary came through mpirun.
        contract.OUTPUT_DIR: root / "output",
    }
    config = json.loads(localize(data[contract.CONFIG_FILE], paths, [contract.OUTPUT_DIR]))
    # Each rank is local rank 0 of its "node" and would serve metrics on 0.0.0.0:9400 in its own pod;
    # sharing one network namespace, the second would fail to bind: metrics off.
    assert config["metricsPort"] == contract.METRICS_PORT
    config["metricsPort"] = 0
    data[contract.CONFIG_FILE] = json.dumps(config, indent=2)
    secret = runobjects.ssh_secret(ctx, keys)
    objects = {o["metadata"]["name"]: o for o in (config_map, secret)}
    # The launcher's Secret volume (its ConfigMap volume is the one the workers share).
    launcher = runpods.launcher_pod(ctx, attempt=0)
    (volume,) = [v for v in launcher["spec"]["volumes"] if "secret" in v]
    project(volume, objects, paths[contract.SSH_DIR], launcher["spec"]["securityContext"].get("fsGroup"))

    as_user = ctx.run_as_user if ctx.run_as_user is not None else image_user
    cluster = Cluster(ctx, keys, root, paths, objects, free_port(WORKER_ADDRS), as_user=as_user)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # root sshd's privilege-separation directory
    try:
        for rank in ranks:
            cluster.start_worker(rank)
        yield cluster
    finally:
        for worker in cluster.workers:
            stop(worker.proc)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with started(run_context(), tmp_path / "fs") as cluster:
        yield cluster


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
    * ``MLBENCH_SSH_PRIVATE_DIR``: the launcher's ``/tmp/mlbench-sshd`` (its private key copy) in a
      directory of its own.
    Nothing else: no inherited environment, no OMPI_MCA_* variables.
    """
    env = container_env(container, pod, paths)
    assert env[contract.ENV_SSH_PORT] == str(contract.SSH_PORT)
    return {
        **env,
        "PATH": IMAGE_PATH,
        contract.ENV_SSH_PORT: str(cluster.port),
        "MASTER_PORT": str(free_port(["0.0.0.0"])),
        # the launcher "pod"'s own /tmp for its copy of the client key (every worker has its own)
        "MLBENCH_SSH_PRIVATE_DIR": str(cluster.root / "launcher-tmp" / "mlbench-sshd"),
    }


def launch(cluster: Cluster, ssh_dir: Path, termination_log: Path) -> subprocess.CompletedProcess[str]:
    """Run the launcher pod's container command with its (localized) environment."""
    pod = runpods.launcher_pod(cluster.ctx, attempt=0)
    (container,) = pod["spec"]["containers"]
    assert container["terminationMessagePath"] == contract.TERMINATION_LOG
    # and the ssh scratch under /tmp: MLBENCH_SSH_PRIVATE_DIR below gives the played launcher its own
    assert {m["mountPath"] for m in container["volumeMounts"]} == {*cluster.paths, contract.SSH_SCRATCH_DIR}
    paths = {**cluster.paths, contract.SSH_DIR: ssh_dir}
    env = launcher_env(cluster, container, pod, paths)
    for var in (contract.ENV_CONFIG, contract.ENV_HOSTFILE, contract.ENV_SSH_KEY, contract.ENV_SSH_KNOWN_HOSTS):
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


def ssh(options: list[str], addr: str, *command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    cmd = ["ssh", *options, addr, *command]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)


def launch_command(stdout: str) -> list[str]:
    """The mpirun command line from the launcher's ``launch`` event."""
    for line in stdout.splitlines():
        if line.startswith('{"event": "launch"'):
            return list(json.loads(line)["command"])
    raise AssertionError(f"no launch event in:\n{stdout[-2000:]}")


def test_launcher_runs_ranks_through_worker_sshd(cluster: Cluster, tmp_path: Path) -> None:
    run_key = fingerprint(cluster.public_key, tmp_path)

    # The run's own key: mpirun reaches both workers' sshd, the ranks train, the summary comes back.
    log = tmp_path / "termination-log"
    proc = launch(cluster, cluster.paths[contract.SSH_DIR], log)
    assert proc.returncode == 0, proc.stdout[-4000:]
    summary = RunSummary.from_termination_message(log.read_text())
    assert summary.run == RUN
    assert summary.environment.world_size == WORKERS
    # each rank's session got its pod's node name from sshd (SetEnv), not only mpirun's -x variables
    assert summary.environment.nodes == [f"node-of-{n.worker_name(RUN, rank)}" for rank in range(WORKERS)]
    assert summary.steps == 2 * 200 // (5 * WORKERS)
    # Through mpirun's forwarded output (rank 0's tagged stdout), not the shared summary.json.
    assert any(line.startswith("[1,0]<stdout>:") and '"run_summary"' in line for line in proc.stdout.splitlines())
    # ... with the run's host key checked: the builder's environment turned strict checking on.
    cmd = launch_command(proc.stdout)
    rsh = cmd[cmd.index("plm_rsh_args") + 1]
    known_hosts = cluster.paths[contract.SSH_DIR] / contract.SSH_KNOWN_HOSTS
    assert f"-o UserKnownHostsFile={known_hosts}" in rsh
    assert "-o StrictHostKeyChecking=yes" in rsh
    assert f"-o HostKeyAlias={n.ssh_host_key_alias(RUN, NAMESPACE)}" in rsh
    for addr, worker_log in zip(WORKER_ADDRS, cluster.sshd_logs, strict=True):  # loopback only, never *:port
        listening = [line for line in worker_log.read_text().splitlines() if line.startswith("Server listening")]
        assert listening == [f"Server listening on {addr} port {cluster.port}."], listening
    accepted = cluster.accepted()
    assert len(accepted) == WORKERS, "\n".join(accepted) + proc.stdout[-2000:]
    for line, worker_log in zip(accepted, cluster.sshd_logs, strict=True):
        assert f"Accepted publickey for {USER} " in line, (worker_log, line)
        assert run_key in line, (worker_log, line)

    # Another client key pair in the launcher's Secret mount (the run's host key, so the launcher
    # trusts the workers): sshd refuses the key and the launcher reports it.
    wrong_dir = tmp_path / "wrong-ssh"
    other = generate_keypair("mlbench-wrong")
    wrong_keys = dataclasses.replace(
        cluster.keys, client_private=other.client_private, client_public=other.client_public
    )
    wrong_secret = runobjects.ssh_secret(cluster.ctx, wrong_keys)
    launcher_volume = next(v for v in runpods.launcher_pod(cluster.ctx, attempt=0)["spec"]["volumes"] if "secret" in v)
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
    assert fingerprint(other.client_public, tmp_path) not in "".join(log.read_text() for log in cluster.sshd_logs)


def test_a_worker_with_another_host_key_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    """Whoever answers on a worker's name or address without the run's host key gets nothing.

    The impostor here has everything but the run's host private key (it even authorises the run's
    client key), so without host key checking it would receive the training command: the lax
    options (no known_hosts, as every run used before) show that; the run's options refuse it
    before authentication, for mpirun and for reading rank 0's files alike.
    """
    other = generate_keypair("mlbench-impostor")
    impostor_keys = dataclasses.replace(cluster.keys, host_private=other.host_private, host_public=other.host_public)
    objects = {**cluster.objects, n.ssh_secret_name(RUN): runobjects.ssh_secret(cluster.ctx, impostor_keys)}
    cluster.stop_worker(cluster.workers[1])
    impostor = cluster.start_worker(1, objects, tag="-impostor")
    key = private_key(
        str(cluster.paths[contract.SSH_DIR] / contract.SSH_PRIVATE_KEY), str(tmp_path / "copy")
    )  # the launcher's

    lax = ssh(ssh_options(cluster.port, key), impostor.addr, "echo", "impostor-ran-it")
    assert lax.stdout == "impostor-ran-it\n", lax.stderr  # the threat is real: it would have run the command
    assert len(impostor.accepted()) == 1

    strict = ssh(cluster.client_options(), impostor.addr, "echo", "impostor-ran-it")
    assert strict.returncode == 255
    assert strict.stdout == ""
    assert "Host key verification failed" in strict.stderr, strict.stderr
    assert len(impostor.accepted()) == 1, "the client authenticated to a server without the run's host key"
    # The genuine worker 0 passes the same check.
    worker0 = cluster.workers[0]
    assert ssh(cluster.client_options(), worker0.addr, "echo", "genuine").stdout == "genuine\n"

    # Reading rank 0's files (collect.py) uses the same options.
    env = cluster.launcher_env()
    known_hosts, alias, config = (
        env[contract.ENV_SSH_KNOWN_HOSTS],
        env[contract.ENV_SSH_HOST_KEY_ALIAS],
        env[contract.ENV_CONFIG],
    )
    genuine = read_remote(worker0.addr, config, cluster.port, key, known_hosts=known_hosts, host_key_alias=alias)
    assert genuine == Path(config).read_bytes()
    assert read_remote(impostor.addr, config, cluster.port, key, known_hosts=known_hosts, host_key_alias=alias) is None

    # The launcher: mpirun fails, the termination log names the cause, the impostor let nobody in.
    log = tmp_path / "termination-log"
    proc = launch(cluster, cluster.paths[contract.SSH_DIR], log)
    assert proc.returncode != 0, proc.stdout[-4000:]
    error = json.loads(log.read_text())
    assert "Host key verification failed" in error["error"].split("; last output:")[0], error
    assert len(impostor.accepted()) == 1, impostor.log.read_text()
    assert "[1,1]<stdout>" not in proc.stdout  # no rank ever ran on the impostor


def test_the_run_key_runs_commands_only(cluster: Cluster) -> None:
    """``restrict`` on the authorised key: a command (what mpirun's rsh launch and collect.py run,
    without a pty) works; port forwarding either way and a pty are refused."""
    options, worker = cluster.client_options(), cluster.workers[0]
    assert ssh(options, worker.addr, "echo", "ok").stdout == "ok\n"

    forward = f"127.0.0.1:{free_port(['127.0.0.1'])}:127.0.0.1:1"
    remote = ssh([*options, "-o", "ExitOnForwardFailure=yes", "-R", forward], worker.addr, "echo", "forwarded")
    assert remote.returncode == 255
    assert "remote port forwarding failed" in remote.stderr, remote.stderr
    assert "forwarded" not in remote.stdout

    # A local forward to the worker's own sshd: an open channel would carry sshd's banner.
    local = free_port(["127.0.0.1"])
    tunnel = subprocess.Popen(
        ["ssh", *options, "-N", "-L", f"127.0.0.1:{local}:{worker.addr}:{cluster.port}", worker.addr],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", local), timeout=1)
                break
            except OSError:
                assert tunnel.poll() is None, "ssh -L exited"
                assert time.monotonic() < deadline, "ssh -L never listened"
                time.sleep(0.1)
        with conn:
            conn.settimeout(10)
            assert conn.recv(100) == b""
    finally:
        stop(tunnel)
    assert "refused local port forward" in worker.log.read_text()

    pty = ssh([*options, "-tt"], worker.addr, "tty")
    assert "PTY allocation request failed" in pty.stderr, pty.stderr
    assert "/dev/pts" not in pty.stdout


def has_login(uid: int) -> bool:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return False
    return os.path.basename(entry.pw_shell) not in ("nologin", "false")


@pytest.mark.skipif(os.geteuid() != 0, reason="plays kubelet (root-owned files, fsGroup), switches to the runner's UID")
@pytest.mark.skipif(
    not has_login(contract.RUNNER_UID), reason=f"no passwd entry with a shell for UID {contract.RUNNER_UID}"
)
@pytest.mark.parametrize(
    ("run_as_user", "owner_group", "mode"),
    [(contract.RUNNER_UID, contract.RUNNER_UID, 0o440), (None, 0, 0o444)],
    ids=["operator-uid", "image-user"],
)
def test_non_root_pods_accept_the_secret_modes(run_as_user: int | None, owner_group: int, mode: int) -> None:
    """Pods running as UID 1000: the operator's default (runAsUser and fsGroup 1000: the Secret's files are
    root's, 0440, group 1000) and an image whose own USER is 1000 under MLBENCH_RUNNER_UID=image (no
    fsGroup: root's, 0444).

    (sshd runs without its ``mlbench-runner worker`` supervisor here: :func:`without_supervisor`.)

    sshd refuses a host key that others may read, and ssh such a client key, when they own the file: the
    worker's sshd starts as 1000 with its private copy of the mounted host key, and ssh as 1000 with the
    launcher's private copy of the client key and the mounted known_hosts gets in.
    """
    ctx = run_context(run_as_user=run_as_user)
    root = Path(tempfile.mkdtemp(prefix="mlbench-ssh-uid-"))  # pytest's tmp_path is 0700: not for UID 1000
    try:
        root.chmod(0o755)
        with started(ctx, root, ranks=[0], image_user=contract.RUNNER_UID) as cluster:
            ssh_dir = cluster.paths[contract.SSH_DIR]
            for key in (
                contract.SSH_PRIVATE_KEY,
                contract.SSH_HOST_KEY,
                contract.SSH_AUTHORIZED_KEYS,
                contract.SSH_KNOWN_HOSTS,
            ):
                st = (ssh_dir / key).stat()
                assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, owner_group, mode), key
            (worker,) = cluster.workers
            got = subprocess.run(
                ["ssh", *cluster.client_options(as_user=contract.RUNNER_UID), worker.addr, "id", "-u"],
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
                **user_args(contract.RUNNER_UID),
            )
            assert got.stdout == f"{contract.RUNNER_UID}\n", got.stderr + worker.log.read_text()
            assert "Accepted publickey for" in worker.log.read_text()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_mpirun_tree_spawn_goes_through_a_worker(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open MPI's tree spawn (the default; the launcher starts only its children in a radix tree, ``routed_radix``
    64, so past 64 workers): here a chain (radix 1), so worker 0's daemon starts worker 1's over ssh. It does so
    with the launcher's own ssh options, ``-i <the launcher's private copy>`` included: why every worker keeps its
    copy of the client key at that same path (WORKER_SCRIPT; ``test_workers_keep_the_client_key_where_the_launcher
    _does``). The run succeeds through the chain."""
    real_env = launcher_env

    def chained(*args: Any, **kwargs: Any) -> dict[str, str]:
        return {**real_env(*args, **kwargs), "OMPI_MCA_routed_radix": "1", "OMPI_MCA_plm_base_verbose": "10"}

    monkeypatch.setattr(sys.modules[__name__], "launcher_env", chained)
    log = tmp_path / "termination-log"
    proc = launch(cluster, cluster.paths[contract.SSH_DIR], log)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert RunSummary.from_termination_message(log.read_text()).environment.world_size == WORKERS
    key = cluster.launcher_env()["MLBENCH_SSH_PRIVATE_DIR"] + "/" + contract.SSH_PRIVATE_KEY
    by_daemon = [line for line in proc.stdout.splitlines() if ",0],1] plm:rsh: final template argv" in line]
    assert by_daemon, "worker 0's daemon spawned nobody: no tree spawn"
    template = proc.stdout.split(by_daemon[0], 1)[1].splitlines()[1]  # the argv follows on the next line
    assert f"-i {key} " in template, template
    assert "-o HostKeyAlias=" in template
