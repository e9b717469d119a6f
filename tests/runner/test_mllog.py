"""Runs as MLCommons mllog: the documented line format, and MLCommons' own parser and compliance checker."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from mlbench_runner.tools import mllog, report
from mlbench_runner.tools.runs import LoadedRun, load_config, load_run, load_summary

from .test_report import T0, fake_run

KEYS = ["namespace", "time_ms", "event_type", "key", "value", "metadata"]
REQUIRED = {
    "submission_benchmark",
    "submission_org",
    "submission_division",
    "submission_platform",
    "cache_clear",
    "seed",
    "global_batch_size",
    "opt_base_learning_rate",
    "train_samples",
    "eval_samples",
    "init_start",
    "init_stop",
    "run_start",
    "epoch_start",
    "eval_start",
    "eval_stop",
    "eval_accuracy",
    "epoch_stop",
    "run_stop",
}


def convert(run: Path) -> tuple[str, list[dict[str, Any]]]:
    text = "\n".join(mllog.convert_dir(run, load_summary(run), load_config(run))) + "\n"
    return text, mllog.parse(text)


def check_format(text: str) -> list[dict[str, Any]]:
    """The format mlperf_logging.mllog writes: ``:::MLLOG `` + one JSON object with its six keys, in order."""
    records = []
    for line in text.splitlines():
        assert line.startswith(":::MLLOG {"), line
        record = json.loads(line[len(":::MLLOG ") :])
        assert list(record) == KEYS
        assert record["namespace"] == ""
        assert isinstance(record["time_ms"], int)
        assert record["event_type"] in ("POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END")
        assert re.fullmatch(r"[a-z_]+", record["key"])
        assert {"file", "lineno"} <= set(record["metadata"])
        if record["event_type"] != "POINT_IN_TIME":
            assert record["value"] is None
        records.append(record)
    times = [r["time_ms"] for r in records]
    assert times == sorted(times)
    return records


def test_a_run_that_reached_the_goal(tmp_path: Path) -> None:
    run = fake_run(tmp_path, "ok", ttg=12.5, ranks=2, seed=7, epochs=3)
    text, _ = convert(run)
    records = check_format(text)
    keys = [r["key"] for r in records]
    assert set(keys) >= REQUIRED
    for once in ("submission_benchmark", "init_stop", "run_start", "run_stop", "train_samples", "eval_samples"):
        assert keys.count(once) == 1, once
    # MLPerf's order: init, then the run, epochs inside it
    assert keys.index("init_start") < keys.index("init_stop") <= keys.index("run_start") < keys.index("epoch_start")
    assert keys[-1] == "run_stop"
    by_key = {r["key"]: r for r in records}
    assert by_key["submission_benchmark"]["value"] == "test-task"
    assert by_key["submission_division"]["value"] == "open"
    assert by_key["seed"]["value"] == 7
    assert by_key["global_batch_size"]["value"] == 20  # 10 per worker x 2
    assert by_key["train_samples"]["value"] == 400
    assert by_key["eval_samples"]["value"] == 200
    assert by_key["run_stop"]["metadata"]["status"] == "success"
    # MLPerf's score, run_stop - run_start, is the runner's wall clock (here: the time to goal)
    assert by_key["run_stop"]["time_ms"] - by_key["run_start"]["time_ms"] == 12_500
    evals = [(r["metadata"]["epoch_num"], r["value"]) for r in records if r["key"] == "eval_accuracy"]
    history = load_summary(run).history
    assert evals == [(h.epoch, pytest.approx(h.accuracy)) for h in history]
    for start, stop in (("epoch_start", "epoch_stop"), ("eval_start", "eval_stop")):
        assert [r["metadata"]["epoch_num"] for r in records if r["key"] == start] == [1, 2, 3]
        assert [r["metadata"]["epoch_num"] for r in records if r["key"] == stop] == [1, 2, 3]
    assert all(r["metadata"]["file"] == "events.jsonl" for r in records)
    ev = by_key["eval_accuracy"]["metadata"]["lineno"]
    assert json.loads((run / "events.jsonl").read_text().splitlines()[ev - 1])["event"] == "eval_accuracy"


def test_the_ingest_our_clock_leaves_out_is_mlperfs_init(tmp_path: Path) -> None:
    run = fake_run(tmp_path, "ingest", ttg=10.0, ingest_ms=5000)
    records = check_format(convert(run)[0])
    t = {r["key"]: r["time_ms"] for r in records if r["key"] in ("init_start", "init_stop", "run_start", "run_stop")}
    assert t["init_start"] == T0
    assert t["init_stop"] == t["run_start"] == T0 + 5000 + 2  # the events' run_stop is 2 ms after the clock's
    assert t["run_stop"] - t["run_start"] == 10_000


def test_a_run_that_missed_the_goal_is_aborted(tmp_path: Path) -> None:
    run = fake_run(tmp_path, "miss", ttg=None, wall=30.0)
    stop = check_format(convert(run)[0])[-1]
    assert stop["key"] == "run_stop"
    assert stop["metadata"]["status"] == "aborted"
    assert stop["metadata"]["mlbench_status"] == "goal-not-reached"
    assert stop["metadata"]["stop_reason"] == "max-epochs"


def test_without_events_the_history_is_used(tmp_path: Path) -> None:
    run = fake_run(tmp_path, "bare", ttg=9.0, with_events=False, with_config=False)
    records = check_format(convert(run)[0])
    keys = [r["key"] for r in records]
    assert keys.count("eval_accuracy") == 3
    assert "global_batch_size" not in keys  # needs config.json
    assert next(r for r in records if r["key"] == "submission_division")["value"] == "open"
    run_start = next(r["time_ms"] for r in records if r["key"] == "run_start")
    assert records[-1]["time_ms"] - run_start == 9000


def test_mlbench_results_writes_mllog_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = fake_run(tmp_path / "runs", "a", ttg=5.0)
    b = fake_run(tmp_path / "runs", "b", ttg=6.0, seed=2)
    assert report.main([str(a), "--no-plots", "--mllog", str(tmp_path / "a.log")]) == 0
    check_format((tmp_path / "a.log").read_text())
    assert report.main([str(a), str(b), "--no-plots", "--mllog", str(tmp_path / "logs")]) == 0
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["a.log", "b.log"]
    assert f"wrote {tmp_path / 'logs' / 'b.log'}" in capsys.readouterr().out


def test_mlcommons_parser_and_compliance_checker_accept_it(tmp_path: Path) -> None:
    """mlperf-logging (installed into .venv by hack/venv.sh, without its pandas/scipy) checks the log.

    Its training 4.1.0 common rules, less one line: the division's rules only accept MLPerf's own
    benchmark names (resnet, bert, ...), and MLBench's tasks are none of them.
    """
    compliance = pytest.importorskip("mlperf_logging.compliance_checker.mlp_compliance")
    parser = pytest.importorskip("mlperf_logging.compliance_checker.mlp_parser")
    rules = Path(compliance.__file__).parent / "training_4.1.0" / "common.yaml"
    text = rules.read_text()
    enqueue = "enqueue_config('training_4.1.0/{}_common.yaml'.format(v['value'])); "
    assert text.count(enqueue) == 1
    ours = tmp_path / "common-any-benchmark.yaml"
    ours.write_text(text.replace(enqueue, ""))
    for name, ttg in (("ok", 12.0), ("miss", None)):
        run = fake_run(tmp_path, name, ttg=ttg, ingest_ms=1500)
        log = tmp_path / f"{name}.log"
        report.write_mllog([LoadedRun(run, load_summary(run), load_config(run))], log)
        lines, errors = parser.parse_file(str(log), ruleset="4.1.0")
        assert errors == []
        assert len(lines) == len(log.read_text().splitlines())
        checker = compliance.make_checker("training", "4.1.0", quiet=False, werror=True)
        assert checker.check_file(str(log), str(ours)), checker.warnings


def test_mllog_file_names_from_the_results_stay_in_the_output_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run given as ``.`` has no directory name: its file is named after the summary's run, which comes
    from the results (a cluster's ConfigMap) and must not pick where the file goes."""
    a = fake_run(tmp_path / "runs", "a", ttg=5.0)
    b = fake_run(tmp_path / "runs", "b", ttg=6.0, seed=2)
    loaded = load_run(a)
    assert isinstance(loaded, LoadedRun)
    monkeypatch.chdir(a)  # `mlbench results . ../b --mllog logs/`
    hostile = loaded.summary.model_copy(update={"run": "../../escaped"})
    other = load_run(b)
    assert isinstance(other, LoadedRun)
    out = tmp_path / "logs"
    targets = report.write_mllog([dataclasses.replace(loaded, path=Path("."), summary=hostile), other], out)
    assert [t.parent for t in targets] == [out, out]
    assert [t.name for t in targets] == ["_.._escaped.log", "b.log"]
    assert not (tmp_path / "escaped.log").exists()
