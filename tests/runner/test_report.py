"""``mlbench results`` on hand-made result directories (no training): grouping, formats, folders."""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mlbench_api.config import RunConfig
from mlbench_api.results import RunSummary
from mlbench_runner.tools import report, running
from mlbench_runner.tools.runs import find_results
from tests.factories import summary_for

from .helpers import logreg_task, make_config, resnet_task

T0 = 1_790_000_000_000  # time_ms of the fake runs' start


def events_for(summary: RunSummary, config: RunConfig, ingest_ms: int = 0) -> list[dict[str, Any]]:
    """events.jsonl lines as the runner writes them (rank 0)."""
    train = config.task.dataset.synthetic.train_samples if config.task.dataset.synthetic else 64
    test = config.task.dataset.synthetic.test_samples if config.task.dataset.synthetic else 40
    clock0 = T0 + ingest_ms  # the run's clock leaves the one-time ingest out

    def ev(name: str, t: int, **values: Any) -> dict[str, Any]:
        return {"rank": 0, **values, "event": name, "time_ms": t, "level": "info"}

    out = [
        ev("run_start", T0, run=config.run_name, task=config.task_name, rank_count=config.world_size),
        ev("init_start", T0 + 300, world_size=config.world_size, launcher="env", device="cpu"),
        ev(
            "hyperparameters",
            T0 + 400 + ingest_ms,
            task=config.task_name,
            dataset={"name": config.task.dataset.name, "train": train, "test": test},
            global_batch_size=config.task.training.batch_size_per_worker * config.world_size,
        ),
        ev("init_stop", T0 + 500 + ingest_ms),
    ]
    previous = 0.5
    for h in summary.history:
        t = clock0 + round(h.wall_seconds * 1000)
        out.append(ev("epoch_start", clock0 + round(previous * 1000), epoch=h.epoch))
        out.append(ev("train_progress", clock0 + round(previous * 1000) + 1, epoch=h.epoch, step=1))
        out.append(ev("eval_accuracy", t, epoch=h.epoch, accuracy=h.accuracy, elapsed_s=h.wall_seconds))
        out.append(ev("epoch_stop", t, epoch=h.epoch, loss=h.loss, elapsed_s=h.wall_seconds))
        previous = h.wall_seconds
    stop = clock0 + round(summary.wall_clock_seconds * 1000) + 2
    out.append(ev("run_stop", stop, status=summary.status, wall_clock_s=summary.wall_clock_seconds))
    out.append(ev("run_summary", stop, summary=json.loads(summary.termination_message())))
    return out


def fake_run(
    root: Path,
    name: str,
    *,
    ttg: float | None,
    ranks: int = 1,
    seed: int = 1,
    task: dict[str, Any] | None = None,
    with_config: bool = True,
    with_events: bool = True,
    ingest_ms: int = 0,
    **summary: Any,
) -> Path:
    """A result directory as ``mlbench run --local`` leaves it: summary.json, config.json, events.jsonl."""
    out = root / name
    out.mkdir(parents=True)
    config = make_config(task or logreg_task(), out, ranks, name=name, seed=seed)
    s = summary_for(config, ttg=ttg, **summary)
    (out / "summary.json").write_text(s.model_dump_json(by_alias=True, indent=2))
    if with_config:
        (out / "config.json").write_text(config.dump())
    if with_events:
        (out / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events_for(s, config, ingest_ms)))
    return out


def sweep(root: Path) -> Path:
    """5 seeds on 1 rank, 3 (one missing the goal) on 2 ranks, in nested folders."""
    for seed, t in enumerate([100.0, 90.0, 110.0, 95.0, 105.0], 1):
        fake_run(root / "one-rank", f"r1-s{seed}", ttg=t, ranks=1, seed=seed)
    times: list[float | None] = [55.0, 50.0, None]
    for seed, ttg in enumerate(times, 1):
        fake_run(root / "two-ranks", f"r2-s{seed}", ttg=ttg, ranks=2, seed=seed, wall=60.0 if ttg is None else None)
    return root


def test_a_sweep_folder_is_scored_per_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = sweep(tmp_path / "sweep")
    assert report.main([str(root), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert out.count("r1-s") == 5
    assert out.count("r2-s") == 3
    assert "olympic mean" in out
    assert "test-task 1x1 gloo allreduce-sgd/by-model" in out
    assert "100.0s" in out  # (95 + 100 + 105) / 3
    assert "52.5s*" in out  # 2 successes: plain mean of 50 and 55, flagged
    assert "only 2 successful runs: plain mean" in out
    assert "3 runs; MLPerf-style scoring wants 5 seeds" in out
    assert "olympic of 3/5" in out
    assert "1.90x" in out  # 100 / 52.5
    assert "2/3" in out
    assert not (root / "accuracy-vs-time.svg").exists()


def test_json_csv_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = sweep(tmp_path / "sweep")
    assert report.main([str(root), "--no-plots", "--output", "json", "--price-per-worker-hour", "3.6"]) == 0
    doc = json.loads(capsys.readouterr().out)
    one, two = doc["configurations"]
    assert len(doc["runs"]) == 8
    assert one["timeToGoalSeconds"] == pytest.approx(100.0)
    assert one["timeToGoalMethod"] == "olympic"
    assert one["timeToGoalDropped"] == [90.0, 110.0]
    assert one["costToGoal"] == pytest.approx(0.1)  # 1 worker x 100 s x 3.6 / 3600
    assert two["successRate"] == pytest.approx(2 / 3)
    assert two["speedup"] == pytest.approx(100 / 52.5)
    assert two["costPerRun"] == pytest.approx(2 * (55 + 50 + 60) / 3 / 3600 * 3.6)
    assert two["communicationShare"] == pytest.approx(0.25)
    assert two["seeds"] == [1, 2, 3]

    assert report.main([str(root), "--no-plots", "--output", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["worldSize"] for r in rows] == ["1", "2"]
    assert float(rows[0]["timeToGoalSeconds"]) == pytest.approx(100.0)
    assert "plain mean" in rows[1]["flags"]
    assert rows[0]["costToGoal"] == ""

    assert report.main([str(root), "--no-plots", "--output", "markdown"]) == 0
    md = capsys.readouterr().out
    assert "## Configurations" in md
    assert "| test-task 2x1 gloo allreduce-sgd/by-model | open |" in md
    assert "* test-task 2x1 gloo allreduce-sgd/by-model: only 2 successful runs" in md


def test_overrides_make_separate_configurations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = logreg_task()
    fake_run(tmp_path, "a", ttg=10.0, task=task)
    fake_run(tmp_path, "b", ttg=20.0, task={**task, "training": {**task["training"], "batchSizePerWorker": 40}})
    assert report.main([str(tmp_path / "a"), str(tmp_path / "b"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "batchSizePerWorker=10" in out
    assert "batchSizePerWorker=40" in out


def test_the_same_run_twice_is_scored_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = fake_run(tmp_path, "solo", ttg=5.0)
    assert report.main([str(run), str(run / "summary.json"), "--no-plots", "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["runs"]) == 1
    assert doc["configurations"][0]["runs"] == 1


def test_a_summary_without_config_is_still_scored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = fake_run(tmp_path, "bare", ttg=5.0, with_config=False, with_events=False)
    assert report.main([str(run), "--plots", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "unknown" in out
    assert (tmp_path / "p" / "accuracy-vs-time.svg").exists()


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such file or directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert report.main([str(tmp_path / "empty")]) == 2
    assert "no summary.json in it or below" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text("{}")
    assert report.main([str(tmp_path / "bad")]) == 2
    assert "not a RunSummary" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report.main([str(tmp_path), "--price-per-worker-hour", "-1"])


def test_the_cli_hands_results_to_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mlbench_api import cli

    run = fake_run(tmp_path, "via-cli", ttg=3.0, task=resnet_task(tmp_path / "data"))
    assert cli.main(["results", str(run), "--no-plots"]) == 0
    assert "via-cli" in capsys.readouterr().out


# -- runs that left no readable summary, collectives in machine-readable output, where files go --------------------


def crashed_run(root: Path, name: str, *, ranks: int = 1, seed: int = 1, summary: str | None = None) -> Path:
    """A run folder as a crash or Ctrl-C leaves it: config.json and output.log, no (or a broken) summary."""
    out = root / name
    out.mkdir(parents=True)
    (out / "config.json").write_text(make_config(logreg_task(), out, ranks, name=name, seed=seed).dump())
    (out / "output.log").write_text("Traceback ...\n")
    if summary is not None:
        (out / "summary.json").write_text(summary)
    return out


@pytest.mark.parametrize(
    ("marker", "live"),
    [
        (None, False),  # crashed: nothing says it runs
        ({"host": socket.gethostname(), "pid": os.getpid()}, True),  # `mlbench run` is at it (this process here)
        ({"host": socket.gethostname(), "pid": 2**22 + 12345}, False),  # a killed command's marker: a dead pid
        ({"host": "elsewhere", "pid": os.getpid()}, False),  # copied from another machine: not checkable here
        ("not json", False),
    ],
)
def test_a_run_still_going_on_is_named_not_scored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], marker: object, live: bool
) -> None:
    """A study scored while its sweep goes on: the run in progress is no failed seed (yet); a crashed one is."""
    root = tmp_path / "study"
    for seed, t in enumerate([100.0, 90.0, 110.0], 1):
        fake_run(root, f"r-s{seed}", ttg=t, seed=seed)
    out = crashed_run(root, "r-s4", seed=4)
    if marker is not None:
        (out / running.MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
    assert report.main([str(root), "--no-plots", "--output", "json"]) == 0
    captured = capsys.readouterr()
    warning = next(line for line in captured.err.splitlines() if str(out) in line)
    (config,) = json.loads(captured.out)["configurations"]
    if live:
        assert f"no summary.json yet: `mlbench run` (pid {os.getpid()}) is running there" in warning
        assert config["seeds"] == [1, 2, 3]
    else:
        assert "counted as a run that missed the goal" in warning
        assert config["seeds"] == [1, 2, 3, 4]


def test_the_marker_is_there_while_the_block_runs_and_gone_after(tmp_path: Path) -> None:
    seen: list[int | None] = []

    def interrupted_run() -> None:
        with running.marked(tmp_path):
            seen.append(running.running_pid(tmp_path))
            raise KeyboardInterrupt  # however the command ends

    with pytest.raises(KeyboardInterrupt):
        interrupted_run()
    assert seen == [os.getpid()]
    assert not (tmp_path / running.MARKER).exists()
    assert running.running_pid(tmp_path) is None


def test_no_lock_file_is_left_in_the_result_folder(tmp_path: Path) -> None:
    with running.marked(tmp_path):
        assert sorted(p.name for p in tmp_path.iterdir()) == [running.MARKER]
    assert list(tmp_path.iterdir()) == []


def test_a_lock_taken_on_a_removed_lock_file_is_taken_again_on_the_new_one(tmp_path: Path) -> None:
    """Removing a lock file is safe only with a check: a command that had opened the old file gets its lock
    once the holder removes it, while a third may hold the new file's; it must not enter beside that one."""
    path = tmp_path / running.LOCK
    entered = threading.Event()

    def second_command() -> None:
        with running.locked(path):
            entered.set()

    with path.open("a") as first:
        fcntl.flock(first, fcntl.LOCK_EX)
        waiter = threading.Thread(target=second_command, daemon=True)
        waiter.start()
        time.sleep(0.3)  # the second command has opened the old file and waits for its lock
        path.unlink()
        with path.open("a") as third:
            fcntl.flock(third, fcntl.LOCK_EX)
            fcntl.flock(first, fcntl.LOCK_UN)  # the first is done: the second gets the old file's lock
            assert not entered.wait(0.5), "entered while the third command held the lock"
        # the third is done (its file closed, so unlocked)
        assert entered.wait(10)
    waiter.join(10)
    assert not path.exists()


@pytest.mark.parametrize(
    ("summary", "reason"),
    [
        (None, "no summary.json"),
        ('{"run": "trunc', "unreadable summary.json"),  # cut short while written
        ("{}", "unreadable summary.json"),
    ],
)
def test_a_run_without_a_readable_summary_counts_as_missing_the_goal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], summary: str | None, reason: str
) -> None:
    """4 seeds reached the goal, 2 crashed: MLPerf's result is invalid (more than one non-converging run)."""
    root = tmp_path / "study"
    for seed, t in enumerate([100.0, 90.0, 110.0, 95.0], 1):
        fake_run(root, f"r-s{seed}", ttg=t, seed=seed)
    crashed_run(root, "r-s5", seed=5, summary=summary)
    crashed_run(root, "r-s6", seed=6)
    assert report.main([str(root), "--no-plots", "--output", "json"]) == 0
    captured = capsys.readouterr()
    assert f"{root / 'r-s5'}: {reason}" in captured.err
    assert "counted as a run that missed the goal" in captured.err
    (config,) = json.loads(captured.out)["configurations"]
    assert config["runs"] == 6
    assert config["successRate"] == pytest.approx(4 / 6)
    assert config["seeds"] == [1, 2, 3, 4, 5, 6]
    assert any("2 runs missed the goal: invalid under MLPerf" in f for f in config["flags"])
    assert config["wallClockSeconds"] == pytest.approx((100 + 90 + 110 + 95) / 4)  # the crashed ones: not measured


def test_a_run_without_summary_or_config_is_named_not_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_run(tmp_path / "study", "ok", ttg=5.0)
    (tmp_path / "study" / "bare").mkdir()
    (tmp_path / "study" / "bare" / "run.yaml").write_text("kind: BenchmarkRun\n")
    assert report.main([str(tmp_path / "study"), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert f"{tmp_path / 'study' / 'bare'}: no summary.json" in err
    assert "not counted (no readable config.json" in err


def test_an_unreadable_config_is_named_not_passed_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config.json from a newer runner (an unknown field) leaves the run's configuration unknown: say so."""
    run = fake_run(tmp_path / "study", "newer", ttg=5.0)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "someNewField": 1}))
    assert report.main([str(tmp_path / "study"), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {run / 'config.json'}: not a RunConfig (someNewField: Extra inputs are not permitted)" in err


def test_an_mllog_write_error_is_named_as_mllog_for_a_relative_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``./x.log`` fails as ``x.log`` (here: a full disk): the error still names --mllog, not --plots."""
    fake_run(tmp_path / "study", "ok", ttg=5.0)
    monkeypatch.chdir(tmp_path)

    def full_disk(*_: Any) -> list[Path]:
        raise OSError(errno.ENOSPC, "No space left on device", "x.log")

    monkeypatch.setattr(report, "write_mllog", full_disk)
    assert report.main(["study", "--no-plots", "--mllog", "./x.log"]) == 2
    assert capsys.readouterr().err == "error: --mllog: cannot write x.log: No space left on device\n"


@pytest.mark.parametrize(
    ("option", "path"),
    [("--mllog", "x" * 300 + ".log"), ("--mllog", "x" * 300 + "/run.log"), ("--plots", "x" * 300 + "/plots")],
)
def test_an_output_path_the_system_refuses_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, path: str
) -> None:
    """A name too long for the file system: the option is named, with the system's words."""
    fake_run(tmp_path / "study", "ok", ttg=5.0)
    assert report.main([str(tmp_path / "study"), option, str(tmp_path / path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {option}: cannot "), err
    assert err.endswith(": File name too long\n"), err


def collectives_run(root: Path, name: str) -> Path:
    from mlbench_api.results import CollectiveMeasurement, CollectiveResult

    out = fake_run(root, name, ttg=1.0, with_events=False)
    row = CollectiveMeasurement(
        op="all-reduce",
        bytes=4,
        elements=1,
        iterations=10,
        time_seconds=0.001,
        algorithm_bandwidth=4e3,
        bus_bandwidth=4e3,
        bus_factor=1.0,
        latency_mean_seconds=1e-4,
        latency_min_seconds=1e-4,
        latency_p50_seconds=1e-4,
        latency_p90_seconds=1e-4,
        latency_p99_seconds=1e-4,
        latency_max_seconds=1e-4,
    )
    table = CollectiveResult(backend="gloo", world_size=1, device="cpu", warmup_iterations=1, rows=[row])
    s = RunSummary.model_validate_json((out / "summary.json").read_text())
    (out / "summary.json").write_text(s.model_copy(update={"collectives": table}).model_dump_json(by_alias=True))
    return out


def test_collectives_runs_are_in_the_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    collectives_run(tmp_path / "only", "sweep-0a")
    assert report.main([str(tmp_path / "only"), "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["run"] for r in doc["runs"]] == ["sweep-0a"]
    assert doc["runs"][0]["collectives"]["rows"][0]["op"] == "all-reduce"
    assert doc["configurations"] == []

    collectives_run(tmp_path / "mixed", "sweep-0a")
    fake_run(tmp_path / "mixed", "trained", ttg=5.0)
    assert report.main([str(tmp_path / "mixed"), "--output", "json", "--no-plots"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(r["run"] for r in doc["runs"]) == ["sweep-0a", "trained"]
    assert [c["runNames"] for c in doc["configurations"]] == [["trained"]]


def test_mllog_refuses_collectives_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = collectives_run(tmp_path, "sweep-0a")
    assert report.main([str(run), "--mllog", str(tmp_path / "x.log")]) == 2
    assert "--mllog: sweep-0a: a collectives run" in capsys.readouterr().err
    assert not (tmp_path / "x.log").exists()


def test_comparing_runs_leaves_their_own_plots_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = fake_run(tmp_path, "a", ttg=10.0), fake_run(tmp_path, "b", ttg=20.0)
    assert report.main([str(a)]) == 0
    own = (a / "accuracy-vs-time.svg").read_text()
    assert report.main([str(a), str(b)]) == 0
    assert "--plots DIR" in capsys.readouterr().out
    assert (a / "accuracy-vs-time.svg").read_text() == own
    assert report.main([str(a), str(b), "--plots", str(tmp_path / "cmp")]) == 0
    assert (tmp_path / "cmp" / "accuracy-vs-time.svg").exists()
    assert (a / "accuracy-vs-time.svg").read_text() == own


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--plots", "afile", "--plots: {tmp}/afile is a file, not a folder"),
        ("--plots", "afile/sub", "--plots: {tmp}/afile is a file, not a folder"),
        ("--mllog", "afile/x.log", "--mllog: {tmp}/afile is a file, not a folder"),
    ],
)
def test_an_output_path_through_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    run = fake_run(tmp_path, "solo", ttg=5.0)
    (tmp_path / "afile").write_text("")
    assert report.main([str(run), option, str(tmp_path / value)]) == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


def test_a_mistyped_local_path_is_not_asked_of_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mlbench-results").mkdir()
    monkeypatch.chdir(tmp_path)
    assert report.main(["mlbench-results/local-quikc"]) == 2
    assert "mlbench-results/local-quikc: no such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize("stray", ["config.json", "summary.json"])
def test_a_run_at_the_top_of_a_study_folder_does_not_hide_the_runs_below(tmp_path: Path, stray: str) -> None:
    """``mlbench run --output study`` (the study's folder taken for a parent) leaves a run's files at its top:
    that run and the study's runs below are all found, none silently dropped."""
    root = tmp_path / "study"
    runs = [fake_run(root, f"r-s{seed}", ttg=100.0, seed=seed) for seed in (1, 2, 3)]
    shutil.copy(runs[0] / stray, root / stray)
    assert find_results(root) == [root, *runs]
    assert find_results(runs[1]) == [runs[1]]
    assert find_results(runs[1] / "summary.json") == [runs[1] / "summary.json"]
