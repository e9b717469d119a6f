"""``mlbench sweep``: a study's runs printed as BenchmarkRuns, or run here one after another."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_api.catalog import parse_run
from mlbench_api.results import RunSummary
from mlbench_api.sweep import LABEL_SWEEP
from mlbench_runner.tools import inputs, local, report, sweep
from tests.factories import read_summary

from .helpers import REPO, env, logreg_task, write_yaml
from .test_report import fake_run

pytestmark = pytest.mark.timeout(300)
RUNS = ["lr-study-w1-s1", "lr-study-w1-s2", "lr-study-w2-s1", "lr-study-w2-s2"]


def _task_file(tmp: Path, spec: dict[str, Any]) -> Path:
    doc = {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkTask", "metadata": {"name": "tiny"}, "spec": spec}
    return write_yaml(tmp / "task.yaml", doc)


def _sweep_file(tmp: Path, matrix: dict[str, Any], **spec: Any) -> Path:
    doc = {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkSweep",
        "metadata": {"name": "lr-study", "labels": {"team": "a"}},
        "spec": {"template": {"taskRef": {"name": "tiny"}}, "matrix": matrix, **spec},
    }
    return write_yaml(tmp / "study.yaml", doc)


@pytest.mark.multiproc
@pytest.mark.slow
def test_a_study_runs_here_run_after_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2 worker counts x 2 seeds of a tiny logistic regression, each into <output>/<run>/."""
    task = _task_file(tmp_path, logreg_task(batch=10, epochs=2, train=200, test=100))
    study = _sweep_file(tmp_path, {"workers": [1, 2], "seeds": [1, 2]}, maxConcurrent=2)
    out = tmp_path / "study"
    args = [
        str(study),
        "--local",
        "--task-file",
        str(task),
        "--output-dir",
        str(out),
        "--launcher",
        "process",
        "--quiet",
    ]
    code = sweep.main(args)
    text = capsys.readouterr().out
    assert code == 0, text
    assert sorted(p.name for p in out.iterdir()) == RUNS
    for name in RUNS:
        summary = read_summary(out / name)
        assert summary.run == name
        assert summary.environment.world_size == int(name.split("-w")[1][0])
        assert summary.environment.seed == int(name[-1])
        task_doc, run_doc = yaml.safe_load_all((out / name / "run.yaml").read_text())  # the task file's, the run
        run = parse_run(run_doc)  # the run as it was expanded
        assert run.metadata.labels is not None
        assert run.metadata.labels[LABEL_SWEEP] == "lr-study"
        assert task_doc["metadata"]["name"] == "tiny"
        # and it runs on its own, task included
        config = inputs.build_config(local.parse_args([str(out / name / "run.yaml"), "--local"]), tmp_path / "again")
        assert (config.run_name, config.task_name, config.seed) == (name, "tiny", int(name[-1]))
    assert "[4/4] run lr-study-w2-s2: workers=2 algorithm=allreduce-sgd backend=gloo seed=2" in text
    assert f"mlbench results {out}" in text
    # the runs scored together, as `mlbench results` does
    assert report.main([str(out / name) for name in RUNS]) == 0
    table = capsys.readouterr().out
    assert all(name in table for name in RUNS)
    # --resume keeps the runs that ended on their own and runs the rest again: one was interrupted, one never wrote
    interrupted = out / RUNS[1] / "summary.json"
    interrupted.write_text(_with(interrupted, status="aborted", stopReason="error"))
    (out / RUNS[2] / "summary.json").unlink()
    assert sweep.main([*args, "--resume"]) == 0
    text = capsys.readouterr().out
    assert text.count("skipped:") == 2, text
    assert f"runs: {interrupted} says aborted (error) (--resume)" in text
    assert f"{RUNS[1]}: succeeded" in text
    assert f"{RUNS[2]}: succeeded" in text
    assert RunSummary.model_validate_json(interrupted.read_text()).status != "aborted"
    # the template's runPolicy edited: nothing a local run uses, every run kept
    edited = yaml.safe_load(study.read_text())
    edited["spec"]["template"]["runPolicy"] = {"maxRestarts": 1}
    study.write_text(yaml.safe_dump(edited))
    assert sweep.main([*args, "--resume"]) == 0
    assert capsys.readouterr().out.count("skipped:") == len(RUNS)
    # the template edited (another bucketing): every run is another configuration now, and runs again
    edited["spec"]["template"]["bucketing"] = "by-layer"
    study.write_text(yaml.safe_dump(edited))
    assert sweep.main([*args, "--resume"]) == 0
    text = capsys.readouterr().out
    assert "skipped:" not in text
    assert text.count("is not the run the sweep asks for now") == len(RUNS), text


def _with(summary: Path, **fields: Any) -> str:
    """The summary file's text with some of its fields changed."""
    return json.dumps({**json.loads(summary.read_text()), **fields})


@pytest.mark.parametrize(
    ("fields", "kept", "why"),
    [
        (None, None, "no summary.json yet"),
        ({"status": "success", "stopReason": "goal"}, "kept", "says success (goal)"),
        ({"status": "goal-not-reached", "stopReason": "max-epochs"}, "kept", "says goal-not-reached (max-epochs)"),
        ({"status": "aborted", "stopReason": "diverged"}, "kept: diverged", "says aborted (diverged)"),
        ({"status": "aborted", "stopReason": "error"}, None, "says aborted (error)"),
        ({"status": "aborted", "stopReason": None}, None, "says aborted (no stop reason)"),
        ({"status": "finished"}, None, "is not a readable summary (ValidationError)"),
    ],
)
def test_resume_keeps_only_runs_that_ended_on_their_own(
    tmp_path: Path, fields: dict[str, Any] | None, kept: str | None, why: str
) -> None:
    run = tmp_path / "run"
    if fields is not None:
        run = fake_run(tmp_path, "run", ttg=10.0)
        (run / "summary.json").write_text(_with(run / "summary.json", **fields))
    run.mkdir(exist_ok=True)
    (run / "run.yaml").write_text(yaml.safe_dump_all(RAN))
    assert sweep.resumable(run, RAN) == (kept, why if fields is None else f"{run / 'summary.json'} {why}")


#: What a run's run.yaml holds (the documents `mlbench sweep --local` wrote for it).
RAN: list[dict[str, Any]] = [
    {"kind": "BenchmarkRun", "metadata": {"name": "run"}, "spec": {"taskRef": {"name": "tiny"}, "seed": 1}}
]


def test_resume_keeps_a_run_whose_cluster_only_fields_were_edited(tmp_path: Path) -> None:
    """runPolicy, scheduling and image place and police pods; a local run uses none of them."""
    run = fake_run(tmp_path, "run", ttg=10.0)
    (run / "run.yaml").write_text(yaml.safe_dump_all(RAN))
    now = [{**RAN[0], "spec": {**RAN[0]["spec"], "runPolicy": {"maxRestarts": 1}, "image": "x:1"}}]
    assert sweep.resumable(run, now)[0] == "kept"


@pytest.mark.parametrize(
    ("ran", "why"),
    [
        (None, "no run.yaml yet"),
        ([{**RAN[0], "spec": {**RAN[0]["spec"], "seed": 2}}], "is not the run the sweep asks for now"),
        ({"not": "a list of documents"}, "is not the run the sweep asks for now"),
        ([{"kind": "BenchmarkTask", "metadata": {"name": "tiny"}}, *RAN], "is not the run the sweep asks for now"),
    ],
)
def test_resume_runs_again_what_the_sweep_no_longer_asks_for(
    tmp_path: Path, ran: list[dict[str, Any]] | None, why: str
) -> None:
    """A finished run whose template, task or goal was edited since: another configuration, run again."""
    run = fake_run(tmp_path, "run", ttg=10.0)
    if ran is not None:
        (run / "run.yaml").write_text(yaml.safe_dump_all(ran))
    kept, said = sweep.resumable(run, RAN)
    assert kept is None
    assert why in said


def test_failure_policy_stop_stops_here_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Backend mpi under the process launcher fails at once (exit 2, nothing started): Stop ends the study."""
    task = _task_file(tmp_path, logreg_task())
    study = _sweep_file(tmp_path, {"backends": ["mpi", "gloo"]}, failurePolicy="Stop")
    out = tmp_path / "study"
    args = [str(study), "--local", "--task-file", str(task), "--output-dir", str(out), "--launcher", "process"]
    code = sweep.main(args)
    captured = capsys.readouterr()
    assert code == 1
    assert "spec.backend: mpi needs mpirun" in captured.err
    assert "failurePolicy is Stop" in captured.out
    assert "lr-study-mpi: not started (exit 2)" in captured.out
    assert "1 of 2 run(s) done" in captured.out
    assert not (out / "lr-study-gloo").exists()


def test_a_run_refused_before_it_starts_leaves_the_folder_to_the_run_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The edited sweep's run is refused (mpi under the process launcher): the folder's run.yaml still describes
    the earlier run's results beside it, so --resume does not take them for the new run's, and the study's table
    does not show them as its outcome."""
    task = _task_file(tmp_path, logreg_task())
    out = tmp_path / "study"
    earlier = fake_run(out, "lr-study-mpi", ttg=10.0)
    (earlier / "run.yaml").write_text(yaml.safe_dump_all(RAN))
    study = _sweep_file(tmp_path, {"backends": ["mpi"]})
    args = [
        str(study),
        "--local",
        "--task-file",
        str(task),
        "--output-dir",
        str(out),
        "--launcher",
        "process",
        "--resume",
    ]
    for _ in range(2):  # the second time, the first's refusal must not have made the earlier results this run's
        assert sweep.main(args) == 1
        text = capsys.readouterr().out
        assert "is not the run the sweep asks for now" in text
        assert "lr-study-mpi: not started (exit 2)" in text
        assert "success" not in text  # the earlier run's summary is not in the study's table
    assert list(yaml.safe_load_all((earlier / "run.yaml").read_text())) == RAN
    assert not (earlier / sweep.PENDING_RUN).exists()


def test_an_output_that_is_a_file_is_refused_before_any_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = _task_file(tmp_path, logreg_task())
    study = _sweep_file(tmp_path, {"seeds": [1, 2]})
    (tmp_path / "afile").write_text("")
    args = [str(study), "--local", "--task-file", str(task), "--output-dir", str(tmp_path / "afile")]
    assert sweep.main(args) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: --output-dir: {tmp_path / 'afile'} is a file, not a directory\n"
    assert "run lr-study" not in captured.out


def test_without_local_the_runs_are_printed_as_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = _sweep_file(tmp_path, {"workers": [1, 2], "seeds": [1, 2]})
    assert sweep.main([str(study), "-n", "team-a"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    runs = [parse_run(d) for d in docs]
    assert [r.metadata.name for r in runs] == RUNS
    assert {r.metadata.namespace for r in runs} == {"team-a"}
    assert [(r.spec.workers, r.spec.seed) for r in runs] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for r in runs:
        assert r.metadata.labels is not None
        assert r.metadata.labels["team"] == "a"
        assert r.metadata.labels[LABEL_SWEEP] == "lr-study"
        assert "ownerReferences" not in docs[0]["metadata"]


def test_a_bad_study_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    study = _sweep_file(tmp_path, {"workers": [1, 2], "backends": ["gloo", "nccl"]})
    assert sweep.main([str(study)]) == 2
    assert "spec.matrix.backends: nccl needs resources.gpu >= 1" in capsys.readouterr().err
    run = write_yaml(tmp_path / "run.yaml", {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkRun"})
    assert sweep.main([str(run)]) == 2
    assert "expected a BenchmarkSweep" in capsys.readouterr().err


def test_the_example_study_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert sweep.main([str(REPO / "manifests" / "examples" / "sweep-epsilon-logreg.yaml")]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert len(docs) == 9


def test_a_task_file_for_another_task_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = _task_file(tmp_path, logreg_task())  # metadata.name: tiny
    doc = yaml.safe_load(_sweep_file(tmp_path, {"seeds": [1, 2]}).read_text())
    doc["spec"]["template"]["taskRef"]["name"] = "epsilon-logreg-synthetic"
    study = write_yaml(tmp_path / "study.yaml", doc)
    out = tmp_path / "study"
    assert sweep.main([str(study), "--local", "--task-file", str(task), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "'tiny'" in err
    assert "'epsilon-logreg-synthetic'" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("matrix", "template", "field"),
    [
        ({"workers": ["2"]}, {}, "spec.matrix.workers.0"),  # kubectl and `mlbench validate` refuse a string
        ({"seeds": [1]}, {"workers": "4"}, "spec.template.workers"),
    ],
)
def test_the_sweep_is_parsed_as_strictly_as_mlbench_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], matrix: dict[str, Any], template: dict[str, Any], field: str
) -> None:
    doc = yaml.safe_load(_sweep_file(tmp_path, matrix).read_text())
    doc["spec"]["template"].update(template)
    study = write_yaml(tmp_path / "study.yaml", doc)
    assert sweep.main([str(study)]) == 2
    assert field in capsys.readouterr().err


def test_a_task_that_no_run_could_use_is_refused_before_the_first_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not in the catalog, no --task-file: exit 2 (an invalid study), not every run failing one by one."""
    study = _sweep_file(tmp_path, {"seeds": [1, 2, 3]})
    out = tmp_path / "study"
    assert sweep.main([str(study), "--local", "--output-dir", str(out), "--launcher", "process"]) == 2
    assert "tiny" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.multiproc
@pytest.mark.slow
def test_ctrl_c_stops_the_study_and_leaves_an_aborted_summary_to_resume_from(tmp_path: Path) -> None:
    """A terminal's Ctrl-C (SIGINT to the whole process group) during the first run: its ranks write their
    ``aborted`` summary (stop reason ``interrupted``), no further run starts, exit 130; ``--resume`` runs it again."""
    task = _task_file(tmp_path, logreg_task(epochs=100_000, train=2000))
    study = _sweep_file(tmp_path, {"workers": [2], "seeds": [1, 2]})
    out = tmp_path / "study"
    cmd = [sys.executable, "-m", "mlbench_runner.tools.sweep", str(study), "--local", "--task-file", str(task)]
    cmd += ["--output-dir", str(out), "--launcher", "process"]
    # its own process group, as a command in a terminal has: the SIGINT below is the terminal's Ctrl-C
    proc = subprocess.Popen(
        cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        first = out / "lr-study-w2-s1"
        deadline = time.monotonic() + 120
        while '"epoch_start"' not in _read(first / "events.jsonl"):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the first run never started training"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, output[-3000:]
    assert "interrupted: the other runs are not started" in output
    assert not (out / "lr-study-w2-s2").exists()
    summary = read_summary(first)
    assert (summary.status, summary.stop_reason) == ("aborted", "interrupted")
    assert sweep.resumable(first, list(yaml.safe_load_all((first / "run.yaml").read_text())))[0] is None
    assert not (first / "running").exists()  # and `mlbench results` scores it as a failed seed, not as running


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
