"""``mlbench run --local`` end to end, and ``mlbench results``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest

from mlbench_api.results import RunSummary
from mlbench_runner import local, report

from .helpers import REPO, logreg_task, resnet_task, run_doc, write_cifar_python, write_yaml

pytestmark = pytest.mark.timeout(300)


def _task_file(tmp: Path, spec: dict[str, Any]) -> Path:
    doc = {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkTask", "metadata": {"name": "tiny"}, "spec": spec}
    return write_yaml(tmp / "task.yaml", doc)


@pytest.mark.parametrize("launcher", ["process", "mpirun"])
def test_run_local_end_to_end(tmp_path: Path, launcher: str, capsys: pytest.CaptureFixture[str]) -> None:
    if launcher == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("OpenMPI's mpirun is not installed on this machine")
    data = write_cifar_python(tmp_path, n_train=80, n_test=40)
    task = _task_file(tmp_path, resnet_task(data, batch=8, epochs=2, subset=64, warmup=0, milestones=[]))
    run = write_yaml(tmp_path / "run.yaml", run_doc("tiny-local", "tiny", 2))
    out = tmp_path / "results"
    code = local.main([str(run), "--local", "--task-file", str(task), "--output", str(out), "--launcher", launcher])
    text = capsys.readouterr().out
    assert code == 0, text
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.run == "tiny-local"
    assert summary.environment.world_size == 2
    assert summary.epochs == 2
    assert "test accuracy" in text
    assert "tiny-local" in text
    assert "samples/s" in text
    for name in ("events.jsonl", "config.json", "accuracy-vs-time.svg", "phase-split.svg"):
        assert (out / name).exists(), name
    svg = ElementTree.parse(out / "accuracy-vs-time.svg").getroot()  # well-formed XML
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    assert any(
        (t.text or "").startswith("Data: tiny: cifar10-fake") for t in svg.iter("{http://www.w3.org/2000/svg}text")
    )
    if launcher == "mpirun":
        assert RunSummary.from_termination_message((out / "termination-log").read_text()).run == "tiny-local"


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
            "--output",
            str(out),
            "--launcher",
            "process",
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr()
    assert RunSummary.model_validate_json((out / "summary.json").read_text()).environment.world_size == 2
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
    assert local.main([str(run), "--local", "--task-file", str(task), "--output", str(tmp_path / "o")]) == 2
    assert "spec.network" in capsys.readouterr().err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_example_manifest_is_valid() -> None:
    doc = local.load_run(str(REPO / "manifests" / "examples" / "local-quick.yaml"))
    assert doc.spec.task_ref.name == "cifar10-resnet20-smoke"


def test_the_main_jobs_run_builds_its_config(tmp_path: Path) -> None:
    """`make run-local`'s run: a dataset path override on a sourced catalog task is where the data already
    is (a local run fetches nothing), not a fetch destination that must lie under /data/."""
    import argparse

    example = REPO / "manifests" / "examples" / "local-quick.yaml"
    args = argparse.Namespace(run=str(example), task_file=None, ranks=None, metrics_port=0)
    config = local.build_config(args, tmp_path)
    assert config.task.dataset.path == "../shared/datasets/cifar10-jpeg.tar.gz"
    assert config.task.dataset.source is None
    assert config.world_size == 2
