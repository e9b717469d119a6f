"""``mlbench run --local`` end to end, and ``mlbench results``."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import yaml

from mlbench_api.results import RunSummary
from mlbench_runner.tools import inputs, local, processes, report, running
from tests.factories import read_summary

from .helpers import REPO, logreg_task, resnet_task, run_doc, write_cifar_python, write_yaml

pytestmark = pytest.mark.timeout(300)


def _task_file(tmp: Path, spec: dict[str, Any]) -> Path:
    doc = {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkTask", "metadata": {"name": "tiny"}, "spec": spec}
    return write_yaml(tmp / "task.yaml", doc)


@pytest.mark.multiproc
@pytest.mark.parametrize("launcher", ["process", "mpirun"])
def test_run_local_end_to_end(
    tmp_path: Path, launcher: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is not installed on this machine")
    plotted: list[RunSummary] = []
    write_plots = report.write_plots

    def spy(runs: Any, dest: Path, *args: Any, **kwargs: Any) -> list[Path]:
        plotted.extend(summary for _, summary in runs)
        return write_plots(runs, dest, *args, **kwargs)

    monkeypatch.setattr(local, "write_plots", spy)
    data = write_cifar_python(tmp_path, n_train=80, n_test=40)
    task = _task_file(tmp_path, resnet_task(data, batch=8, epochs=2, subset=64, warmup=0, milestones=[]))
    run = write_yaml(tmp_path / "run.yaml", run_doc("tiny-local", "tiny", 2))
    out = tmp_path / "results"
    code = local.main([str(run), "--local", "--task-file", str(task), "--output-dir", str(out), "--launcher", launcher])
    text = capsys.readouterr().out
    assert code == 0, text
    summary = read_summary(out)
    assert summary.run == "tiny-local"
    assert summary.environment.world_size == 2
    assert summary.epochs == 2
    assert "test accuracy" in text
    assert "tiny-local" in text
    assert "samples/s" in text
    for name in ("events.jsonl", "config.json", "accuracy-vs-time.svg", "phase-split.svg"):
        assert (out / name).exists(), name
    # the plot is drawn from summary.json's per-epoch history, which the streamed summary line leaves out
    assert [len(s.history) for s in plotted] == [2]
    svg = ElementTree.parse(out / "accuracy-vs-time.svg").getroot()  # well-formed XML
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert any(
        (t.text or "").startswith("Data: tiny: cifar10-fake") for t in svg.iter("{http://www.w3.org/2000/svg}text")
    )
    if launcher == "mpirun":
        assert RunSummary.from_termination_message((out / "termination-log").read_text()).run == "tiny-local"


@pytest.mark.multiproc
def test_run_local_ranks_override_and_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = _task_file(tmp_path, logreg_task(batch=10, epochs=2, train=200))
    run = write_yaml(tmp_path / "run.yaml", run_doc("lr-local", "tiny", 1, slotsPerWorker=1))
    out = tmp_path / "r"
    code = local.main(
        [
            str(run),
            "--local",
            "--ranks",
            "2",
            "--task-file",
            str(task),
            "--output-dir",
            str(out),
            "--launcher",
            "process",
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr()
    assert read_summary(out).environment.world_size == 2
    capsys.readouterr()
    assert report.main([str(out), str(out / "summary.json"), "--plots", str(tmp_path / "plots")]) == 0
    table = capsys.readouterr().out
    assert table.count("lr-local") == 2
    assert "comm/compute" in table
    assert (tmp_path / "plots" / "phase-split.svg").exists()


def test_bad_input_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = _task_file(tmp_path, logreg_task())
    run = write_yaml(tmp_path / "run.yaml", run_doc("bad", "tiny", 1, backend="tcp"))
    assert local.main([str(run), "--local", "--task-file", str(task)]) == 2
    assert "spec.backend" in capsys.readouterr().err
    run = write_yaml(tmp_path / "run.yaml", run_doc("bad", "tiny", 1, overrides={"maxEpochs": 0}))
    assert local.main([str(run), "--local", "--task-file", str(task)]) == 2
    assert "maxEpochs" in capsys.readouterr().err
    assert report.main([str(tmp_path / "nowhere")]) == 2


def test_network_conditions_are_refused_locally(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One machine has no traffic control between its ranks: the run must not pretend it was shaped."""
    task = _task_file(tmp_path, logreg_task())
    run = write_yaml(tmp_path / "run.yaml", run_doc("shaped", "tiny", 2, network={"latencyMs": 5}))
    assert local.main([str(run), "--local", "--task-file", str(task), "--output-dir", str(tmp_path / "o")]) == 2
    assert "spec.network" in capsys.readouterr().err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_example_manifest_is_valid() -> None:
    doc = inputs.load_run(str(REPO / "manifests" / "examples" / "local-quick.yaml"))
    assert doc.spec.task_ref.name == "cifar10-resnet20-smoke"


def test_the_main_jobs_run_builds_its_config(tmp_path: Path) -> None:
    """`make run-local`'s run: a dataset path override on a sourced catalog task is where the data already
    is (a local run fetches nothing), not a fetch destination that must lie under /data/."""
    import argparse

    example = REPO / "manifests" / "examples" / "local-quick.yaml"
    args = argparse.Namespace(run=str(example), task_file=None, ranks=None, metrics_port=0)
    config = inputs.build_config(args, tmp_path)
    assert config.task.dataset.path == "../shared/datasets/cifar10-jpeg.tar.gz"
    assert config.task.dataset.source is None
    assert config.world_size == 2


# -- the review's findings: input checked as the cluster checks it, results kept, clear errors ---------------------


@pytest.mark.parametrize(
    ("names", "wanted", "picked"),
    [
        (["tiny"], "tiny", "tiny"),
        (["other", "tiny"], "tiny", "tiny"),  # a file of several tasks: the run's own
        (["epsilon-logreg-synthetic"], "cifar10-resnet20", None),
        ([], "tiny", None),
    ],
)
def test_pick_task_takes_the_runs_task_or_refuses(names: list[str], wanted: str, picked: str | None) -> None:
    from mlbench_api import BenchmarkTask

    tasks = [BenchmarkTask.model_validate({"metadata": {"name": n}, "spec": logreg_task()}) for n in names]
    if picked is not None:
        assert inputs.pick_task(wanted, tasks, "t.yaml").metadata.name == picked
        return
    with pytest.raises(inputs.LocalRunError) as err:
        inputs.pick_task(wanted, tasks, "t.yaml")
    assert f"spec.taskRef.name is {wanted!r}" in str(err.value)
    assert "metadata.name" in str(err.value)


def test_a_task_file_for_another_task_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Results are filed under spec.taskRef.name: running the file's other task under that name mislabels them."""
    task = _task_file(tmp_path, logreg_task())  # metadata.name: tiny
    run = write_yaml(tmp_path / "run.yaml", run_doc("mislabelled", "epsilon-logreg-synthetic", 1))
    out = tmp_path / "o"
    assert local.main([str(run), "--local", "--task-file", str(task), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "'tiny'" in err
    assert "'epsilon-logreg-synthetic'" in err
    assert not (out / "config.json").exists()


@pytest.mark.parametrize("with_task", [True, False])
def test_a_run_file_that_also_holds_its_task_uses_it(tmp_path: Path, with_task: bool) -> None:
    """One file for ``kubectl apply`` with the task and the run: the local run takes the task from it too."""
    task = {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkTask", "metadata": {"name": "tiny"}}
    docs = [{**task, "spec": logreg_task(batch=7)}] if with_task else []
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump_all([*docs, run_doc("both", "tiny", 1)]))
    args = local.parse_args([str(path), "--local"])
    if not with_task:
        with pytest.raises(inputs.LocalRunError, match="tiny"):
            inputs.build_config(args, tmp_path / "o")
        return
    config = inputs.build_config(args, tmp_path / "o")
    assert (config.task_name, config.task.training.batch_size_per_worker) == ("tiny", 7)


PREVIOUS = {"summary.json": "previous summary", "events.jsonl": "previous events", "termination-log": "previous"}


@pytest.mark.parametrize(
    ("spec", "extra", "message"),
    [
        ({"network": {"latencyMs": 5}}, [], "spec.network"),
        ({"backend": "mpi"}, ["--launcher", "process"], "spec.backend"),
        ({"overrides": {"maxEpochs": 0}}, [], "maxEpochs"),
        ({"workers": "2"}, [], "spec.workers"),
    ],
)
def test_a_refused_run_keeps_the_previous_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any], extra: list[str], message: str
) -> None:
    """The previous run's files go only when the new run's ranks start, not when a check refuses it."""
    task = _task_file(tmp_path, logreg_task())
    out = tmp_path / "o"
    out.mkdir()
    for name, text in PREVIOUS.items():
        (out / name).write_text(text)
    run = write_yaml(
        tmp_path / "run.yaml", {**run_doc("again", "tiny", 1), "spec": {**run_doc("a", "tiny", 1)["spec"], **spec}}
    )
    assert local.main([str(run), "--local", "--task-file", str(task), "--output-dir", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert {name: (out / name).read_text() for name in PREVIOUS} == PREVIOUS


def test_a_missing_dataset_keeps_the_previous_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = resnet_task(tmp_path / "no-such-data")
    task = _task_file(tmp_path, {**spec, "dataset": {**spec["dataset"], "format": "image-folder"}})  # decoded here
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").write_text("previous summary")
    run = write_yaml(tmp_path / "run.yaml", run_doc("again", "tiny", 1))
    assert local.main([str(run), "--local", "--task-file", str(task), "--output-dir", str(out)]) == 2
    assert "no-such-data" in capsys.readouterr().err
    assert (out / "summary.json").read_text() == "previous summary"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"workers": "4"}, "spec.workers"),  # a string: kubectl and `mlbench validate` refuse it
        ({"workers": 2.5}, "spec.workers"),
        ({"seed": "1"}, "spec.seed"),
    ],
)
def test_the_run_is_parsed_as_strictly_as_mlbench_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any], field: str
) -> None:
    run = write_yaml(
        tmp_path / "run.yaml", {**run_doc("strict", "tiny", 1), "spec": {"taskRef": {"name": "tiny"}, **spec}}
    )
    with pytest.raises(inputs.LocalRunError) as err:
        inputs.load_run(str(run))
    assert field in str(err.value)


def test_the_task_file_is_parsed_strictly(tmp_path: Path) -> None:
    spec = logreg_task()
    task = _task_file(tmp_path, {**spec, "training": {**spec["training"], "maxEpochs": "2"}})
    with pytest.raises(inputs.LocalRunError) as err:
        inputs.load_task("tiny", str(task))
    assert "spec.training.maxEpochs" in str(err.value)


def test_output_naming_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = _task_file(tmp_path, logreg_task())
    run = write_yaml(tmp_path / "run.yaml", run_doc("f", "tiny", 1))
    (tmp_path / "afile").write_text("")
    assert local.main([str(run), "--local", "--task-file", str(task), "--output-dir", str(tmp_path / "afile")]) == 2
    assert "--output-dir" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "65536", "http"])
def test_metrics_port_outside_the_port_range_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        local.parse_args(["run.yaml", "--local", "--metrics-port", value])
    assert exit_.value.code == 2
    assert "--metrics-port" in capsys.readouterr().err


def test_metrics_ports_of_every_rank_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = _task_file(tmp_path, logreg_task())
    run = write_yaml(tmp_path / "run.yaml", run_doc("p", "tiny", 2))
    argv = [
        str(run),
        "--local",
        "--task-file",
        str(task),
        "--output-dir",
        str(tmp_path / "o"),
        "--metrics-port",
        "65535",
    ]
    assert local.main(argv) == 2
    assert "--metrics-port" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model", "text"),
    [
        ({"name": "resnet", "version": "m1", "depth": 20}, "resnet (version=m1, depth=20)"),
        ({"name": "logistic-regression"}, "logistic-regression"),
        ("custom", "custom"),
        (None, "None"),
    ],
)
def test_the_progress_line_names_the_model_in_words(model: Any, text: str) -> None:
    assert inputs.model_text(model) == text


@pytest.mark.multiproc
def test_ctrl_c_stops_the_ranks(tmp_path: Path) -> None:
    """KeyboardInterrupt while the ranks run: none of them outlives the command."""
    import sys

    started: list[str] = []

    def on_line(line: str) -> None:
        started.append(line)
        if len(started) == 2:
            raise KeyboardInterrupt

    sleeper = (sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)")
    procs: list[Any] = []
    real_popen = processes.subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> Any:
        procs.append(real_popen(*args, **kwargs))
        return procs[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(processes.subprocess, "Popen", popen)
        mp.setattr(processes, "SETTLE_SECONDS", 0.5)  # these sleepers never end on their own: terminated after it
        with pytest.raises(KeyboardInterrupt):
            processes.run_processes(tmp_path / "config.json", 2, dict(processes.os.environ), on_line, sleeper)
    assert len(procs) == 2
    assert all(p.poll() is not None for p in procs)


@pytest.mark.multiproc
def test_further_ctrl_cs_during_the_stop_cut_its_waits_short_but_never_skip_a_step() -> None:
    """Ranks blocked in a collective end neither on the Ctrl-C nor on SIGTERM; a second Ctrl-C skips the settle
    wait, a third the grace period, and the stop still ends with every rank killed (no KeyboardInterrupt
    escapes from between two of its steps)."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "time.sleep(120)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", stubborn], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "up"  # their handlers are set
    presses = [threading.Timer(t, os.kill, (os.getpid(), signal.SIGINT)) for t in (0.3, 0.9)]
    started = time.monotonic()
    try:
        for press in presses:
            press.start()
        processes.stop_processes(procs, settle=120.0, grace=120.0)
        assert [p.poll() is not None for p in procs] == [True, True]
        assert time.monotonic() - started < 60, "a Ctrl-C did not cut a wait short"
    finally:
        for press in presses:
            press.cancel()
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.multiproc
def test_a_ctrl_c_between_two_steps_of_the_stop_skips_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that lands in the /proc scan (not in a wait) must not end the stop before the kill."""
    import os
    import signal
    import subprocess
    import sys
    import time

    real_scan = processes.process_tree

    def scan_hit_by_a_ctrl_c(procs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, inside the scan
        return real_scan(procs)

    monkeypatch.setattr(processes, "process_tree", scan_hit_by_a_ctrl_c)
    ignores_sigterm = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", ignores_sigterm], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "1"
    try:
        try:
            processes.stop_processes([proc], settle=0.0, grace=0.5)
        except KeyboardInterrupt:
            pytest.fail("a Ctrl-C between two steps escaped from the stop")
        assert proc.poll() is not None
    finally:
        proc.kill()
        proc.wait()


def test_ctrl_c_during_the_run_is_one_line_and_exit_130(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(local, "run_processes", interrupted)
    task = _task_file(tmp_path, logreg_task())
    run = write_yaml(tmp_path / "run.yaml", run_doc("c", "tiny", 1))
    out = tmp_path / "o"
    assert (
        local.main([str(run), "--local", "--task-file", str(task), "--output-dir", str(out), "--launcher", "process"])
        == 130
    )
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0
    assert "interrupted" in err


def test_a_rank_killed_by_a_signal_exits_as_a_shell_reports_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Popen's -9 is 137 (128 + 9) for the command, not 247 (sys.exit(-9) wraps to 256 - 9)."""
    monkeypatch.setattr(local, "run_processes", lambda *args, **kwargs: -9)
    task = _task_file(tmp_path, logreg_task())
    run = write_yaml(tmp_path / "run.yaml", run_doc("k", "tiny", 1))
    argv = [str(run), "--local", "--task-file", str(task), "--output-dir", str(tmp_path / "o"), "--launcher", "process"]
    assert local.main(argv) == 137


def test_a_second_run_in_a_folder_where_one_runs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs writing one folder would overwrite each other's files, and the first to end would remove the
    marker of the other: the second is refused before it touches anything, and the first's marker stays."""
    monkeypatch.setattr(local, "run_processes", lambda *args, **kwargs: pytest.fail("the ranks started"))
    task = _task_file(tmp_path, logreg_task())
    out = tmp_path / "o"
    out.mkdir()
    for name, text in PREVIOUS.items():
        (out / name).write_text(text)
    marker = json.dumps({"host": socket.gethostname(), "pid": os.getpid()})  # a live process on this host
    (out / running.MARKER).write_text(marker)
    run = write_yaml(tmp_path / "run.yaml", run_doc("twice", "tiny", 1))
    argv = [str(run), "--local", "--task-file", str(task), "--output-dir", str(out), "--launcher", "process"]
    assert local.main(argv) == 2
    assert f"--output-dir: mlbench run (pid {os.getpid()}) is already running in {out}" in capsys.readouterr().err
    assert {name: (out / name).read_text() for name in PREVIOUS} == PREVIOUS
    assert (out / running.MARKER).read_text() == marker


@pytest.mark.parametrize(
    "marker",
    [
        pytest.param({"host": "this", "pid": 2**22 + 1}, id="a killed command's"),  # above Linux's pid_max
        pytest.param({"host": "another-machine", "pid": 1}, id="another machine's"),
        pytest.param("not json", id="unreadable"),
    ],
)
def test_a_marker_naming_no_live_process_here_is_replaced(tmp_path: Path, marker: object) -> None:
    body = marker if isinstance(marker, str) else json.dumps(marker).replace('"this"', json.dumps(socket.gethostname()))
    (tmp_path / running.MARKER).write_text(body)
    with running.marked(tmp_path):
        assert running.running_pid(tmp_path) == os.getpid()
    assert not (tmp_path / running.MARKER).exists()


@pytest.mark.parametrize(("ranks", "error"), [(0, True), (1, False), (1024, False), (1025, True), (5000, True)])
def test_ranks_has_the_bounds_of_spec_workers(tmp_path: Path, ranks: int, error: bool) -> None:
    """--ranks replaces spec.workers without pydantic's check: 5000 would start 5000 processes."""
    task = _task_file(tmp_path, logreg_task())
    run = write_yaml(tmp_path / "run.yaml", run_doc("r", "tiny", 1))
    args = local.parse_args([str(run), "--local", "--task-file", str(task), "--ranks", str(ranks)])
    if error:
        with pytest.raises(inputs.LocalRunError, match=f"--ranks: must be from 1 to 1024.*got {ranks}"):
            inputs.build_config(args, tmp_path / "o")
    else:
        assert inputs.build_config(args, tmp_path / "o").world_size == ranks


@pytest.mark.parametrize(
    "line",
    [
        '{"event": "train_progress"}',
        '{"event": "eval_accuracy", "epoch": 1, "accuracy": null, "target": 0.8, "elapsed_s": 1}',
        '{"event": "train_progress", "epoch": "one", "step": 1, "elapsed_s": 1, "samples_per_second": 2}',
        '{"event": "hyperparameters", "steps_per_epoch": 0, "dataset": []}',
        '{"event": "eval_accuracy", "epoch": 1, "accuracy": 0.5, "target": 0.8, "elapsed_s": "soon"}',
    ],
)
def test_an_event_unlike_the_reference_runners_is_shown_as_it_came(line: str) -> None:
    """A custom runner (open division) may print events with other fields: its line is shown raw, not a crash
    that would stop the run's ranks."""
    out = io.StringIO()
    progress = local.Progress(out, 8, False)
    progress.line(line)
    progress.line('{"event": "eval_accuracy", "epoch": 2, "accuracy": 0.5, "target": 0.8, "elapsed_s": 3}')
    assert out.getvalue().splitlines() == [f"  | {line}", "epoch 2/8: test accuracy 50.00% (target 80.0%)  at 3s"]


def test_local_checkpoint_flag_names_the_runs_checkpoint_folder(tmp_path: Path) -> None:
    example = REPO / "manifests" / "examples" / "local-quick.yaml"
    args = local.parse_args([str(example), "--local", "--checkpoint", str(tmp_path / "ckpt")])
    assert inputs.build_config(args, tmp_path / "o").checkpoint_dir == str(tmp_path / "ckpt")
    assert inputs.build_config(local.parse_args([str(example), "--local"]), tmp_path / "o").checkpoint_dir is None
