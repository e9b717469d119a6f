"""mpirun-launched runs: the launcher pod's code path and the mpi4py backend."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mlbench_api import bundle
from mlbench_api.results import RunSummary
from mlbench_runner.pod.launch import launcher_command, mpirun_command

from .helpers import env, launch_processes, logreg_task, make_config, read_ranks

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed on this machine"),
]


def launch(config_path: Path, out: Path, ranks: int, **extra: str) -> subprocess.CompletedProcess[str]:
    hostfile = out / "hostfile"
    hostfile.write_text(f"# the launcher reads the first host as rendezvous\nlocalhost slots={ranks}\n")
    from mlbench_runner.world import free_port

    return subprocess.run(
        launcher_command(config_path, hostfile, out / "termination-log", oversubscribe=True),
        env=env(MASTER_PORT=str(free_port()), **extra),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def write_config(tmp: Path, name: str, ranks: int, **spec: str) -> tuple[Path, Path]:
    out = tmp / name
    out.mkdir()
    config = make_config(logreg_task(batch=5, epochs=2, train=200, features=12, alpha=3.0), out, ranks, **spec)
    (out / "config.json").write_text(config.dump())
    return out / "config.json", out


@pytest.mark.multiproc
def test_launch_writes_termination_message(tmp_path: Path) -> None:
    path, out = write_config(tmp_path, "gloo", 2)
    proc = launch(path, out, 2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    message = (out / "termination-log").read_text()
    assert len(message.encode()) < 4096
    summary = RunSummary.from_termination_message(message)
    assert summary.environment.world_size == 2
    assert summary.steps == 2 * 200 // 10
    assert (out / "ranks" / "rank-1.json").exists()
    # the last output line carries rank 0's full results for the operator to keep
    kept = bundle.parse_line(proc.stdout.rstrip("\n").rsplit("\n", 1)[-1])
    assert kept is not None
    assert kept.files[bundle.SUMMARY] == (out / "summary.json").read_bytes()
    assert kept.files[bundle.EVENTS] == (out / "events.jsonl").read_bytes()
    assert kept.files[bundle.CONFIG] == path.read_bytes()
    assert kept.summary is not None
    assert len(kept.summary.history) == summary.epochs


@pytest.mark.multiproc
def test_launch_failure_writes_error(tmp_path: Path) -> None:
    path, out = write_config(tmp_path, "bad", 2)
    (out / "config.json").write_text(path.read_text().replace('"batchSizePerWorker": 5', '"batchSizePerWorker": 500'))
    proc = launch(path, out, 2)
    assert proc.returncode != 0
    text = (out / "termination-log").read_text()
    assert '"error"' in text
    assert '"exitCode"' in text


@pytest.mark.multiproc
def test_mpi_backend_matches_gloo(tmp_path: Path) -> None:
    path, out = write_config(tmp_path, "mpi", 2, backend="mpi")
    proc = launch(path, out, 2, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    mpi = read_ranks(out, 2)
    gloo_cfg = make_config(logreg_task(batch=5, epochs=2, train=200, features=12, alpha=3.0), tmp_path / "g", 2)
    gloo = launch_processes(gloo_cfg, 2, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64")
    assert mpi[0]["param_sha1"] == mpi[1]["param_sha1"]
    a, b = np.asarray(mpi[0]["param_values"]), np.asarray(gloo[0]["param_values"])
    assert a.shape == b.shape
    assert np.abs(a).max() > 0.1
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.environment.backend == "mpi"
    assert summary.communication_seconds > 0


def test_mpirun_command_shape() -> None:
    cmd = mpirun_command(
        world_size=8,
        hostfile="/etc/mlbench/hostfile",
        config_path="/etc/mlbench/config.json",
        ssh_key="/etc/mlbench/ssh/id_ed25519",
        env={"MLBENCH_RUN_CONFIG": "x", "PATH": "/bin"},
    )
    joined = " ".join(cmd)
    assert cmd[cmd.index("-np") + 1] == "8"
    assert "--hostfile /etc/mlbench/hostfile" in joined
    rsh = cmd[cmd.index("plm_rsh_args") + 1]
    assert rsh.startswith("-p 2222 -o StrictHostKeyChecking=no")
    assert "-i /etc/mlbench/ssh/id_ed25519" in rsh
    assert cmd[cmd.index("orte_keep_fqdn_hostnames") + 1] == "1"  # workers' Service names stay whole
    assert cmd[cmd.index("MLBENCH_RUN_CONFIG") - 1 : cmd.index("MLBENCH_RUN_CONFIG") + 1] == [
        "-x",
        "MLBENCH_RUN_CONFIG",
    ]
    assert (
        cmd[-5:] == [sys.executable, "-m", "mlbench_runner.cli", "train", "--config", "/etc/mlbench/config.json"][-5:]
    )


@pytest.mark.multiproc
def test_mpi_rank_failure_aborts_job(tmp_path: Path) -> None:
    """backend mpi: a rank that fails must not sit in MPI_Finalize while its peer waits in a collective."""
    path, out = write_config(tmp_path, "mpi-fail", 2, backend="mpi")
    bad = out / "bad.json"  # only rank 1 sees it: too few samples for one global batch -> ValueError after init
    bad.write_text(path.read_text().replace('"batchSizePerWorker": 5', '"batchSizePerWorker": 500'))
    rank = [sys.executable, "-m", "mlbench_runner.cli", "train", "--config"]
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "1", *rank, str(path)]
    cmd += [":", "-np", "1", *rank, str(bad)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    proc = subprocess.Popen(
        cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    start = time.monotonic()
    try:
        output = proc.communicate(timeout=60)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("mpirun still running 60 s after rank 1 failed: the job hangs")
    assert proc.returncode != 0, output[-3000:]
    assert time.monotonic() - start < 45, output[-3000:]
    assert "batchSizePerWorker" in output or "global batch" in output, output[-3000:]


@pytest.mark.multiproc
def test_launch_keeps_aborted_summary(tmp_path: Path) -> None:
    """A diverged run: every rank exits 3, mpirun too; the termination log still holds the summary."""
    task = logreg_task(batch=5, epochs=2, train=200, features=12, alpha=1e38, l2=1e-3)
    out = tmp_path / "diverge"
    out.mkdir()
    config = make_config(task, out, 2)
    (out / "config.json").write_text(config.dump())
    proc = launch(out / "config.json", out, 2)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = RunSummary.from_termination_message((out / "termination-log").read_text())
    assert summary.status == "aborted"


@pytest.mark.multiproc
def test_launch_error_names_the_cause_and_fits(tmp_path: Path) -> None:
    """ssh's reason is kept from early output; the message fits 4 KiB after JSON escaping; signals -> 128+n."""
    script = tmp_path / "fake-mpirun"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, signal\n"
        "print('Permission denied (publickey).')\n"
        "for _ in range(30):\n"
        "    print('[1,0]<stderr>:' + '\\u00e9\\x01\"' * 300)\n"
        "print('ORTE was unable to reliably start one or more daemons.', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    script.chmod(0o755)
    path, out = write_config(tmp_path, "fake", 2)
    hostfile = out / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    cmd = [*launcher_command(path, hostfile, out / "termination-log", oversubscribe=True), "--mpirun", str(script)]
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 128 + 9, proc.stdout[-2000:] + proc.stderr[-2000:]
    raw = (out / "termination-log").read_bytes()
    assert len(raw) <= 4096
    error = json.loads(raw)
    assert error["exitCode"] == 137
    assert "signal 9" in error["error"]
    assert error["error"].index("Permission denied") < error["error"].index("ORTE was unable")


def test_ranks_get_the_config_path_with_its_symlinks_kept(tmp_path: Path) -> None:
    """Like a ConfigMap volume: the resolved target's timestamped name differs in every pod."""
    from mlbench_runner.pod.launch import rank_config_path

    real = tmp_path / "..2026_11_23_11_22_09.3663563106"
    real.mkdir()
    (real / "config.json").write_text("{}")
    (tmp_path / "..data").symlink_to(real.name)
    (tmp_path / "config.json").symlink_to("..data/config.json")
    path = rank_config_path(str(tmp_path / "config.json"))
    assert path == str(tmp_path / "config.json")
    assert "..2026" not in path


def test_the_client_key_is_used_through_a_private_copy(tmp_path: Path) -> None:
    """ssh refuses a key others may read when it owns it (the mounted Secret is root's 0440 or 0444): the
    launcher hands mpirun a copy that is its user's, 0600, in a 0700 directory."""
    from mlbench_runner.pod.launch import private_key

    mounted = tmp_path / "ssh-privatekey"
    mounted.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nkey\n")
    mounted.chmod(0o444)
    pod_tmp = tmp_path / "tmp" / "mlbench-sshd"  # the launcher pod's /tmp/mlbench-sshd
    copy = Path(private_key(str(mounted), str(pod_tmp)))
    assert copy == pod_tmp / "ssh-privatekey"
    assert copy.read_text() == mounted.read_text()
    assert (copy.stat().st_mode & 0o777, copy.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert copy.stat().st_uid == os.geteuid()
    assert private_key(str(mounted), str(pod_tmp)) == str(copy)  # again (a restarted launcher): replaced


@pytest.mark.multiproc
def test_an_unreadable_client_key_is_the_launchers_input_error(tmp_path: Path) -> None:
    path, out = write_config(tmp_path, "nokey", 1)
    proc = launch(path, out, 1, MLBENCH_SSH_KEY=str(tmp_path / "missing"))
    assert proc.returncode == 2, proc.stderr
    assert "missing" in (out / "termination-log").read_text()


@pytest.mark.multiproc
def test_a_key_copy_that_cannot_be_written_is_the_pods_failure_not_the_runs_input(tmp_path: Path) -> None:
    """A full or read-only /tmp in the launcher pod: exit 1 (LauncherFailed, the restart policy decides), not
    2 (InvalidInput: the run would fail at once, though a new pod may well succeed)."""
    path, out = write_config(tmp_path, "tmpfull", 1)
    key = tmp_path / "ssh-privatekey"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nkey\n")
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")  # the copy's directory cannot be made under a file, whoever runs this
    proc = launch(path, out, 1, MLBENCH_SSH_KEY=str(key), MLBENCH_SSH_PRIVATE_DIR=str(blocked / "sshd"))
    assert proc.returncode == 1, proc.stderr
    message = json.loads((out / "termination-log").read_text())
    assert message["exitCode"] == 1
    assert "cannot write the ssh key's private copy" in message["error"]


def test_a_key_copy_that_fails_half_way_leaves_no_partial_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlbench_runner.pod import launch as launch_module

    mounted = tmp_path / "ssh-privatekey"
    mounted.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nkey\n")

    def no_space(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(launch_module.os, "replace", no_space)
    with pytest.raises(launch_module.PodSetupError, match="No space left"):
        launch_module.private_key(str(mounted), str(tmp_path / "sshd"))
    assert list((tmp_path / "sshd").iterdir()) == []
