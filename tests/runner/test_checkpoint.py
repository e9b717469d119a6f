"""Epoch-end checkpoints: the file format's refusals (unit), and a 2-rank gloo run killed after a checkpoint that
resumes to the very parameters of an uninterrupted run (multi-process, real torch.distributed)."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

from mlbench_runner.algorithms.powersgd import PowerSGD
from mlbench_runner.comm import LocalCommunicator
from mlbench_runner.rank import checkpoint
from mlbench_runner.rank.checkpoint import CheckpointRefused, Identity
from mlbench_runner.timing import WallClock
from tests.factories import read_summary
from tests.runner.helpers import launch_processes, logreg_task, make_config, read_ranks, start_processes

IDENTITY = Identity(run="r", namespace="ns", uid="u-1", task_sha256="ab" * 32, world_size=2, division="closed")


def _file(identity: Identity = IDENTITY, ranks: int = 2) -> bytes:
    blobs = [checkpoint.to_blob({"model": {"w": torch.full((3,), float(r))}, "step": r}) for r in range(ranks)]
    return checkpoint.encode({"identity": identity.__dict__, "epoch": 1}, blobs)


def test_a_checkpoint_round_trips_each_rank_s_state(tmp_path: Path) -> None:
    path = tmp_path / "c" / checkpoint.FILE
    checkpoint.write(path, _file())
    header, state = checkpoint.open_checkpoint(path.read_bytes(), path, IDENTITY, rank=1)
    assert header["epoch"] == 1
    assert torch.equal(state["model"]["w"], torch.ones(3))
    assert state["step"] == 1
    assert [p.name for p in path.parent.iterdir()] == [checkpoint.FILE]  # no temporary file left


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: d[:-10], "truncated"),
        (lambda d: d[: len(checkpoint.MAGIC) + 5], "truncated or damaged header"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "checksum mismatch"),
        (lambda d: b"PK\x03\x04" + d[4:], "not an MLBench checkpoint"),
        (lambda d: b"", "empty file"),
    ],
)
def test_a_corrupt_checkpoint_is_refused_with_its_reason(tmp_path: Path, damage: Any, reason: str) -> None:
    path = tmp_path / checkpoint.FILE
    with pytest.raises(CheckpointRefused, match=reason) as refused:
        checkpoint.open_checkpoint(damage(_file()), path, IDENTITY, rank=0)
    assert str(path) in str(refused.value)
    assert "not loaded" in str(refused.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("run", "other"), ("uid", "u-2"), ("task_sha256", "cd" * 32), ("world_size", 4), ("division", "open")],
)
def test_a_foreign_checkpoint_is_refused_naming_what_differs(tmp_path: Path, field: str, value: object) -> None:
    foreign = Identity(**{**IDENTITY.__dict__, field: value})
    with pytest.raises(CheckpointRefused, match=f"another run: {field} "):
        checkpoint.open_checkpoint(_file(foreign), tmp_path / checkpoint.FILE, IDENTITY, rank=0)


def test_a_checkpoint_with_another_number_of_ranks_state_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointRefused, match="3 ranks' state for a world of 2"):
        checkpoint.open_checkpoint(_file(ranks=3), tmp_path / checkpoint.FILE, IDENTITY, rank=0)


class Payload:
    """Not a tensor, number or string: ``weights_only`` must refuse to build it."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.getenv, ("HOME",))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    torch.save({"model": Payload()}, buffer)
    data = checkpoint.encode({"identity": IDENTITY.__dict__}, [buffer.getvalue()] * 2)
    with pytest.raises(CheckpointRefused, match="unreadable"):
        checkpoint.open_checkpoint(data, tmp_path / checkpoint.FILE, IDENTITY, rank=0)


def test_the_task_digest_changes_with_the_task(tmp_path: Path) -> None:
    a = make_config(logreg_task(), tmp_path, 2)
    b = make_config(logreg_task(batch=20), tmp_path, 2)
    assert checkpoint.task_digest(a) == checkpoint.task_digest(make_config(logreg_task(), tmp_path, 2))
    assert checkpoint.task_digest(a) != checkpoint.task_digest(b)


def test_a_resumed_clock_counts_the_time_since_its_origin() -> None:
    clock = WallClock()
    origin = clock.origin()
    clock.exclude(10.0)  # an excluded one-time set-up moves the origin with it
    assert 9.9 < clock.origin() - origin < 10.1
    later = WallClock()
    later.resume(origin - 50.0)  # started 50 s before: those 50 s (the lost time, the restart) count
    assert 50.0 <= later.elapsed() < 51.0


def test_ordered_state_dicts_load_safely() -> None:
    blob = checkpoint.to_blob({"model": OrderedDict(w=torch.zeros(2))})
    assert torch.equal(checkpoint.from_blob(blob)["model"]["w"], torch.zeros(2))


def test_powersgd_s_generator_survives_a_checkpoint_s_safe_load() -> None:
    """Its numpy generator goes through tensors (weights_only reads no numpy objects) and back, mid-stream."""
    first = PowerSGD(LocalCommunicator("gloo"), seed=3)
    first._rng.randint(1_000_000_000, size=7)
    state = checkpoint.from_blob(checkpoint.to_blob({"algorithm": first.state()}))["algorithm"]
    second = PowerSGD(LocalCommunicator("gloo"), seed=99)
    second.load_state(state)
    assert second._rng.randint(1_000_000_000, size=5).tolist() == first._rng.randint(1_000_000_000, size=5).tolist()


# -- 2 ranks, gloo: killed after an epoch's checkpoint, resumed ------------------------------------------------
TRACE = {"MLBENCH_TRACE_PARAMS": "1", "MLBENCH_DTYPE": "float64"}
EPOCHS = 40


def _config(tmp_path: Path, name: str, algorithm: str) -> Any:
    task = logreg_task(batch=10, epochs=EPOCHS, train=400, features=12, target=1.0)
    params: dict[str, Any] = {"algorithmParameters": {"density": 0.25}} if algorithm == "sparsified-sgd" else {}
    config = make_config(task, tmp_path / name, 2, algorithm=algorithm, **params)
    return config.model_copy(update={"checkpoint_dir": str(tmp_path / "checkpoints" / name)})


def _launch(config: Any) -> list[dict[str, Any]]:
    return launch_processes(config, 2, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64")


def _kill_after_first_checkpoint(config: Any, logs: Path) -> float:
    """Start the run, SIGKILL both ranks once a checkpoint exists (they are still training); return when."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = start_processes(config, 2, logs=logs, extra=TRACE)
    path = Path(config.checkpoint_dir) / checkpoint.FILE
    deadline = time.monotonic() + 180
    while not path.exists() and time.monotonic() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.005)
    alive = [p.poll() is None for p in procs]
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert path.exists(), "no checkpoint was written:\n" + (logs / "rank-0.log").read_text()[-3000:]
    assert all(alive), "the run ended before it could be killed"
    return time.time()


@pytest.mark.multiproc
@pytest.mark.parametrize("algorithm", ["allreduce-sgd", "sparsified-sgd"])
def test_a_killed_run_resumes_to_the_same_parameters_bit_for_bit(tmp_path: Path, algorithm: str) -> None:
    """allreduce-sgd: the flat step; sparsified-sgd: torch.optim and the ranks' own error-feedback memory."""
    whole = _launch(_config(tmp_path, "whole", algorithm))
    config = _config(tmp_path, "cut", algorithm)
    _kill_after_first_checkpoint(config, tmp_path / "logs")
    header, _ = checkpoint.decode((Path(config.checkpoint_dir) / checkpoint.FILE).read_bytes())
    time.sleep(1.0)  # the restart's delay: lost time the clock must count
    relaunched = time.time()
    resumed = _launch(config)
    done = header["step"]
    assert 0 < done < whole[0]["steps"]
    for r in range(2):
        assert resumed[r]["steps"] == whole[r]["steps"]
        assert resumed[r]["param_sha1"] == whole[r]["param_sha1"][done:], f"rank {r} differs after the resume"
    summary, reference = read_summary(Path(config.output_dir)), read_summary(tmp_path / "whole")
    assert (summary.resumes, reference.resumes) == (1, 0)
    assert [h.accuracy for h in summary.history] == [h.accuracy for h in reference.history]
    assert summary.steps == reference.steps
    assert summary.wall_clock_seconds >= relaunched - header["clockOrigin"]  # the lost time and the restart count


@pytest.mark.multiproc
def test_a_checkpoint_of_another_run_fails_the_run_and_is_kept(tmp_path: Path) -> None:
    other = _config(tmp_path, "other", "allreduce-sgd").model_copy(update={"run_name": "someone-else"})
    _kill_after_first_checkpoint(other, tmp_path / "logs")
    mine = _config(tmp_path, "mine", "allreduce-sgd").model_copy(update={"checkpoint_dir": other.checkpoint_dir})
    before = (Path(other.checkpoint_dir) / checkpoint.FILE).read_bytes()
    with pytest.raises(AssertionError, match="refused, not loaded: it belongs to another run: run 'someone-else'"):
        launch_processes(mine, 2)
    assert (Path(other.checkpoint_dir) / checkpoint.FILE).read_bytes() == before
    records = read_ranks(Path(mine.output_dir), 2)
    assert [r["steps"] for r in records] == [0, 0]
    assert json.loads((Path(mine.output_dir) / "ranks" / "rank-0.json").read_text())["stop_reason"] == "error"


@pytest.mark.multiproc
def test_a_checkpoint_that_cannot_be_written_is_a_warning_not_the_run_s_end(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the checkpoint folder should be")
    config = make_config(logreg_task(epochs=2), tmp_path / "out", 1).model_copy(
        update={"checkpoint_dir": str(blocked / "run")}
    )
    (record,) = launch_processes(config, 1)
    assert record["epochs_completed"] == 2
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["event"] == "checkpoint_failed"]
    assert [e["epoch"] for e in failed] == [1]  # after epoch 1; epoch 2 ended the run
    assert read_summary(tmp_path / "out").resumes == 0
