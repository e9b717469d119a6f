"""``-o/--output`` is the output format in every command, as in kubectl; directories are ``--output-dir``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_api.badinput import EXIT_BAD_INPUT
from mlbench_api.catalog import load_catalog
from mlbench_api.cli import _say, main
from mlbench_api.output import JSON, YAML, dump
from mlbench_api.watch import follow_events, status_line
from mlbench_runner.tools import sweep
from tests.api.test_cli_user import RUN, SWEEP

ROOT = Path(__file__).resolve().parents[2]


def out_of(capsys: pytest.CaptureFixture[str], *argv: str, entry: Any = main) -> str:
    assert entry(list(argv)) == 0
    return capsys.readouterr().out


def test_catalog_prints_every_task_as_a_list_in_json_and_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    names = sorted(load_catalog())
    listed = json.loads(out_of(capsys, "catalog", "-o", "json"))
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    assert [item["metadata"]["name"] for item in listed["items"]] == names
    documents = list(yaml.safe_load_all(out_of(capsys, "catalog", "--output", "yaml")))
    assert documents == listed["items"]


def test_catalog_of_one_task_in_each_format(capsys: pytest.CaptureFixture[str]) -> None:
    one = json.loads(out_of(capsys, "catalog", "cifar10-resnet20-smoke", "-o", "json"))
    assert (one["kind"], one["metadata"]["name"]) == ("BenchmarkTask", "cifar10-resnet20-smoke")
    assert yaml.safe_load(out_of(capsys, "catalog", "cifar10-resnet20-smoke")) == one  # yaml without -o, as before
    rows = out_of(capsys, "catalog", "cifar10-resnet20-smoke", "-o", "table").splitlines()
    assert rows[0].split()[0] == "TASK"
    assert [r.split()[0] for r in rows[1:]] == ["cifar10-resnet20-smoke"]


def test_config_in_yaml_is_the_json_it_prints_by_default(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(RUN)
    as_json = json.loads(out_of(capsys, "config", str(run)))
    assert as_json["taskName"] == "cifar10-resnet20-smoke"
    assert yaml.safe_load(out_of(capsys, "config", str(run), "-o", "yaml")) == as_json


def test_sweep_prints_its_runs_as_yaml_or_a_json_list(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    study = tmp_path / "sweep.yaml"
    study.write_text(SWEEP)
    documents = list(yaml.safe_load_all(out_of(capsys, str(study), entry=sweep.main)))
    listed = json.loads(out_of(capsys, str(study), "-o", "json", entry=sweep.main))
    assert listed["kind"] == "List"
    assert listed["items"] == documents
    assert [d["metadata"]["name"] for d in documents] == ["sw-w1", "sw-w2"]


def test_watch_in_json_prints_the_run_once_per_change(capsys: pytest.CaptureFixture[str]) -> None:
    running = {"metadata": {"name": "r"}, "status": {"phase": "Running"}}
    done = {"metadata": {"name": "r"}, "status": {"phase": "Succeeded"}}
    follow_events([("ADDED", running), ("MODIFIED", running), ("MODIFIED", done)], _say(JSON))
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [running, done]
    follow_events([("MODIFIED", running)], _say("text"))
    assert capsys.readouterr().out == status_line(running) + "\n"


@pytest.mark.parametrize(
    "argv",
    [["catalog"], ["config", "RUN"], ["watch", "ns/r"], ["results", "RUN"], ["sweep", "SWEEP"]],
    ids=lambda argv: argv[0],
)
def test_an_unknown_format_is_bad_input_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    (tmp_path / "run.yaml").write_text(RUN)
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    files = {"RUN": str(tmp_path / "run.yaml"), "SWEEP": str(tmp_path / "sweep.yaml")}
    argv = [files.get(arg, arg) for arg in argv]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "-o", "xml"])
    assert exit_.value.code == EXIT_BAD_INPUT
    assert "argument -o/--output: invalid choice: 'xml'" in capsys.readouterr().err


def test_run_refuses_output_as_a_directory_and_names_output_dir(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "run.yaml", "--local", "--output", "results"])
    assert exit_.value.code == EXIT_BAD_INPUT
    assert "for the result directory use --output-dir results" in capsys.readouterr().err


def test_crds_write_into_output_dir(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    written = out_of(capsys, "crds", "--output-dir", str(tmp_path)).split()
    assert written
    assert all(Path(p).parent == tmp_path for p in written)


@pytest.mark.parametrize("fmt", [YAML, JSON])
def test_one_object_prints_as_itself(fmt: str) -> None:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    assert yaml.safe_load(dump([obj], fmt, single=True)) == obj
