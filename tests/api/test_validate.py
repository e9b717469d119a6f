"""``mlbench validate`` speaks like the API server and the operator's admission (issue 13).

No cluster here: the verdicts are the ones the API server was seen to give (``validate_cases``,
checked against a real one by ``test_validate_agrees.py``), and the admission verdicts are
compared with the operator's own :func:`admit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mlbench_api import cli
from mlbench_api.badinput import EXIT_BAD_INPUT
from mlbench_api.catalog import KubectlLoader, load_catalog, parse_run, parse_task, wire
from mlbench_api.errors import InvalidObject
from mlbench_api.run import Backend, BenchmarkRunSpec
from mlbench_operator.conditions import Reason
from mlbench_operator.run import admission
from tests.api.examples import EXAMPLES, EXPECT_FIELD, admission_refused, example_files
from tests.api.validate_cases import CASES, RUN, TASK, Case


@dataclass
class Result:
    rc: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


@pytest.fixture
def validate(capsys: pytest.CaptureFixture[str]) -> Any:
    def run(*args: str | Path) -> Result:
        rc = cli.main(["validate", *map(str, args)])
        captured = capsys.readouterr()
        return Result(rc, captured.out, captured.err)

    return run


def _write(tmp_path: Path, text: str, name: str = "input.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_verdict_is_the_api_servers(case: Case, tmp_path: Path, validate: Any) -> None:
    result = validate(_write(tmp_path, case.text))
    assert (result.rc == 0) is case.accepted, result.text
    assert case.mention in result.text
    assert "Traceback" not in result.text


def _doc(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("path", example_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_examples_schema_only_is_the_api_servers_verdict(path: Path, validate: Any) -> None:
    result = validate("--schema-only", path)
    if path.parent.name == "valid":
        assert result.rc == 0, result.err
    else:
        assert result.rc == EXIT_BAD_INPUT, result.out
        assert _doc(path)["metadata"]["annotations"][EXPECT_FIELD] in result.err


@pytest.mark.parametrize("path", example_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_examples_with_admission(path: Path, validate: Any) -> None:
    """Without --schema-only, validate also refuses what the operator's admission refuses."""
    doc = _doc(path)
    refused = admission_refused(doc)
    result = validate(path)
    if path.parent.name == "valid" and refused is None:
        assert result.rc == 0, result.err
    else:
        assert result.rc == EXIT_BAD_INPUT, result.out
        field = refused or doc["metadata"]["annotations"][EXPECT_FIELD]
        assert f": {field}" in result.err
    if refused:
        assert "the operator would fail the run" in result.err


def test_admission_examples_cover_every_reason() -> None:
    docs = [_doc(p) for p in sorted((EXAMPLES / "valid").glob("*.yaml"))]
    assert {admission_refused(d) for d in docs} >= {"spec.taskRef.name", "spec.overrides"}


def _admission_examples() -> list[Path]:
    return sorted((EXAMPLES / "valid").glob("run-*.yaml"))


@pytest.mark.parametrize("path", _admission_examples(), ids=lambda p: p.stem)
def test_admission_verdict_is_the_operators(path: Path) -> None:
    """The operator's own admit() refuses exactly the runs that validate refuses for admission."""
    doc = _doc(path)
    run = parse_run(doc)
    tasks = load_catalog()
    task = tasks.get(run.spec.task_ref.name)
    body = {**run.to_api(), "metadata": {**doc["metadata"], "namespace": "default", "uid": "u"}}
    verdict = admission.admit(body, task.to_api() if task else None)
    refused = isinstance(verdict, admission.Rejection) and verdict.reason != Reason.POLICY_VIOLATION
    ours = cli.admission_problems(run, dict(tasks), "the catalog")
    assert refused == bool(ours), (verdict, ours)
    assert refused == (admission_refused(doc) is not None)
    if isinstance(verdict, admission.Rejection) and refused:
        assert ours[0].endswith(f"would fail the run {verdict.reason}")


# --- strict types, and the models stay as lax as the operator needs -------------------------------


def test_parse_run_is_strict_where_model_validate_is_lax() -> None:
    doc = yaml.safe_load(RUN + '  workers: "4"\n  overrides: {nesterov: "true"}\n  backend: mpi\n')
    with pytest.raises(InvalidObject) as info:
        parse_run(doc)
    assert info.value.problems == [
        "spec.workers: Input should be a valid integer",
        "spec.overrides.nesterov: Input should be a valid boolean",
    ]
    # The operator and runner validate API dicts with model_validate: unchanged (enums from strings).
    spec = BenchmarkRunSpec.model_validate(doc["spec"])
    assert spec.workers == 4
    assert spec.backend is Backend.MPI


def test_parse_task_is_strict() -> None:
    doc = yaml.safe_load(TASK.replace("target: 0.89", 'target: "0.89"'))
    with pytest.raises(InvalidObject) as info:
        parse_task(doc)
    assert info.value.problems == ["spec.goal.target: Input should be a valid number"]


def test_the_catalog_passes_the_strict_check() -> None:
    assert set(load_catalog()) >= {"cifar10-resnet20", "epsilon-logreg"}


def test_wire_is_what_kubectl_sends() -> None:
    assert wire({"a": 4.0, "b": 4.5, "c": None, 1: [None, 2.0], False: "x"}) == {
        "a": 4,
        "b": 4.5,
        "1": [None, 2],
        "false": "x",
    }
    assert wire(1e21) == 1e21  # Go writes 1e+21: a float


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("y", True),
        ("N", False),
        ("off", False),
        ("1e3", 1000.0),
        ("5.", 5.0),
        (".5", 0.5),
        ("08", 8.0),
        ("010", 8),
        ("-010", -8),
        ("0o17", 15),
        ("0x1F", 31),
        ("0b101", 5),
        ("1_000", 1000),
        ("+12", 12),
        ("1:20", "1:20"),
        ("2024-01-01", "2024-01-01"),
        ("1.2.3", "1.2.3"),
    ],
)
def test_yaml_scalars_as_go_yaml_reads_them(text: str, value: object) -> None:
    loaded = yaml.load(text, Loader=KubectlLoader)
    assert loaded == value
    assert type(loaded) is type(value)


# --- what the output says ---------------------------------------------------------------------------


def test_a_problem_names_file_line_column_and_document(tmp_path: Path, validate: Any) -> None:
    path = _write(tmp_path, TASK + "---\n" + RUN + '  workers: "4"\n')
    result = validate(path)
    assert result.rc == EXIT_BAD_INPUT
    line = TASK.count("\n") + 1 + RUN.count("\n") + 1
    assert f"{path}:{line}:12: document 2 (BenchmarkRun case): spec.workers: Input should be a valid integer" in (
        result.err
    )
    assert f"{path}:1:1: document 1 (BenchmarkTask case-task): valid" in result.out


def test_a_single_document_names_no_index(tmp_path: Path, validate: Any) -> None:
    path = _write(tmp_path, RUN + "  workers: 0\n")
    result = validate(path)
    assert f"{path}:7:12: BenchmarkRun case: spec.workers: Input should be greater than or equal to 1" in result.err


def test_broken_yaml_is_a_line_not_a_traceback(tmp_path: Path, validate: Any) -> None:
    path = _write(tmp_path, "apiVersion: v1\nkind: [a\n")
    result = validate(path)
    assert result.rc == EXIT_BAD_INPUT
    assert result.err.startswith(f"{path}:3:1: invalid YAML: expected ',' or ']'")
    assert "line 2, column 7" in result.err


def test_broken_second_document_keeps_the_first(tmp_path: Path, validate: Any) -> None:
    path = _write(tmp_path, TASK + "---\nkind: [\n")
    result = validate(path)
    assert result.rc == EXIT_BAD_INPUT
    assert "document 1 (BenchmarkTask case-task): valid" in result.out
    assert f"{path}:" in result.err
    assert "document 2: invalid YAML" in result.err


def test_unreadable_file(tmp_path: Path, validate: Any) -> None:
    result = validate(tmp_path / "missing.yaml")
    assert result.rc == EXIT_BAD_INPUT
    assert "cannot read the file" in result.err
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert "cannot read the file" in validate(binary).err


def test_other_api_groups_are_skipped(tmp_path: Path, validate: Any) -> None:
    path = _write(tmp_path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n" + RUN)
    result = validate(path)
    assert result.rc == 0, result.err
    assert "document 1 (ConfigMap c): skipped: v1 ConfigMap is not an MLBench object" in result.out


def test_an_unknown_mlbench_kind_is_refused(tmp_path: Path, validate: Any) -> None:
    result = validate(_write(tmp_path, RUN.replace("kind: BenchmarkRun", "kind: BenchmarkThing")))
    assert result.rc == EXIT_BAD_INPUT
    assert "kind: expected BenchmarkRun or BenchmarkTask or BenchmarkSweep, got 'BenchmarkThing'" in result.err


def test_null_warns_about_server_side_apply(tmp_path: Path, validate: Any) -> None:
    result = validate(_write(tmp_path, RUN + "  overrides: null\n"))
    assert result.rc == 0
    assert "7:14: warning: BenchmarkRun case: spec.overrides: null: kubectl apply drops it" in result.err


def test_duplicate_key_warns(tmp_path: Path, validate: Any) -> None:
    path = _write(tmp_path, RUN + "  workers: 2000\n  workers: 2\n")
    result = validate(path)
    assert result.rc == 0
    assert f"{path}:8:3: warning: duplicate key 'workers'" in result.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mlbench {cli.version()}"
    assert cli.version()[0].isdigit()


# --- admission: tasks from the files given, then the catalog --------------------------------------


def test_a_task_in_another_file_given_serves_the_run(tmp_path: Path, validate: Any) -> None:
    run = _write(tmp_path, RUN.replace("cifar10-resnet20-smoke", "case-task"), "run.yaml")
    assert validate(run).rc == EXIT_BAD_INPUT
    result = validate(_write(tmp_path, TASK, "task.yaml"), run)
    assert result.rc == 0, result.err
    assert "(task case-task from the files given)" in result.out


def test_a_task_in_the_files_replaces_the_catalogs(tmp_path: Path, validate: Any) -> None:
    """Applying the files would replace the catalog task, so the run is judged against the new one."""
    catalog = _doc(Path(__file__).resolve().parents[2] / "manifests" / "catalog" / "cifar10-resnet20.yaml")
    run = RUN.replace("cifar10-resnet20-smoke", "cifar10-resnet20") + "  overrides: {momentum: 0.5}\n"
    assert "OverrideNotAllowed" in validate(_write(tmp_path, run, "run.yaml")).err
    catalog["spec"]["division"] = "open"
    text = yaml.safe_dump(catalog) + "---\n" + run
    result = validate(_write(tmp_path, text, "both.yaml"))
    assert result.rc == 0, result.err


SWEEP = """\
apiVersion: mlbench.io/v1alpha1
kind: BenchmarkSweep
metadata: {name: study}
spec:
  template: {taskRef: {name: TASK}, algorithmParameters: {rank: 4}}
  matrix: {algorithms: [allreduce-sgd, powersgd], seeds: [1, 2, 3, 4]}
"""


@pytest.mark.parametrize(
    ("task", "refused"),
    [
        ("cifar10-resnet20-smoke", None),  # open division: any algorithm
        ("cifar10-resnet20", ":6:24: BenchmarkSweep study: spec.matrix.algorithms: powersgd is not allowed"),
        ("no-such-task", ":5:30: BenchmarkSweep study: spec.template.taskRef.name: no BenchmarkTask 'no-such-task'"),
    ],
)
def test_a_sweep_is_checked_as_the_operator_admits_its_runs(
    tmp_path: Path, validate: Any, task: str, refused: str | None
) -> None:
    """The API server accepts the sweep; the operator would then fail the runs its closed task does not
    allow (or whose task does not exist), one by one: validate says so, once per problem."""
    result = validate(_write(tmp_path, SWEEP.replace("TASK", task)))
    if refused is None:
        assert result.rc == 0, result.err
        assert f"(task {task} from the catalog)" in result.out
    else:
        assert result.rc == EXIT_BAD_INPUT
        assert refused in result.err
        assert result.err.count("BenchmarkSweep study:") == 1
        assert " more)\n" in result.err  # the runs it fails, last


def test_a_run_of_an_invalid_task_in_the_files(tmp_path: Path, validate: Any) -> None:
    task = TASK.replace("maxEpochs: 10", 'maxEpochs: "10"')
    text = task + "---\n" + RUN.replace("cifar10-resnet20-smoke", "case-task")
    result = validate(_write(tmp_path, text))
    assert result.rc == EXIT_BAD_INPUT
    assert "spec.training.maxEpochs: Input should be a valid integer" in result.err
    assert "BenchmarkTask 'case-task' is invalid (see above); the run would fail InvalidTask" in result.err


def test_without_a_catalog_only_the_files_count(tmp_path: Path, validate: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "catalog"
    empty.mkdir()
    monkeypatch.setenv("MLBENCH_CATALOG", str(empty))
    result = validate(_write(tmp_path, RUN))
    assert result.rc == EXIT_BAD_INPUT
    assert "no BenchmarkTask 'cifar10-resnet20-smoke'" in result.err
    assert validate("--schema-only", tmp_path / "input.yaml").rc == 0


def test_config_uses_a_task_of_the_same_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, TASK + "---\n" + RUN.replace("cifar10-resnet20-smoke", "case-task"))
    assert cli.main(["config", str(path)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["taskName"] == "case-task"


def test_config_reports_broken_yaml_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "kind: [\n")
    assert cli.main(["config", str(path)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith(f"{path}:2:1: invalid YAML")


#: A run of the catalog's smoke task (its dataset has a source) reading the data from this machine's path.
LOCAL_DATA = RUN + "  overrides: {dataset: ../shared/datasets/cifar10-jpeg.tar.gz}\n"


@pytest.mark.parametrize(
    ("text", "flags", "rc", "said"),
    [
        # the operator refuses a path outside /data for a sourced dataset; a local run reads it as it is
        (
            LOCAL_DATA,
            [],
            EXIT_BAD_INPUT,
            "the operator would fail the run InvalidConfig (a local run reads an overridden",
        ),
        (LOCAL_DATA, ["--local"], 0, "valid (task cifar10-resnet20-smoke from the catalog)"),
        # with its own datasetSource the path is a fetch target on both: refused both ways, no hint
        (
            RUN
            + "  overrides: {dataset: /tmp/x, datasetSource: {url: 'https://example.org/x.tar.gz', sha256: '"
            + "0" * 64
            + "'}}\n",
            ["--local"],
            EXIT_BAD_INPUT,
            "`mlbench run --local` would refuse it",
        ),
        # a problem --local does not mend gets no hint
        (
            RUN.replace("cifar10-resnet20-smoke", "cifar10-resnet20") + "  overrides: {momentum: 0.5}\n",
            [],
            EXIT_BAD_INPUT,
            "the operator would fail the run OverrideNotAllowed\n",
        ),
    ],
)
def test_local_admits_runs_as_a_local_run_forms_them(
    tmp_path: Path, validate: Any, text: str, flags: list[str], *, rc: int, said: str
) -> None:
    """``mlbench run --local`` drops a sourced dataset's source when the run overrides its path (the data is
    here); the operator does not. ``validate --local`` says what a local run makes of the file, and plain
    validate, refusing it for the cluster, says that a local run would take it."""
    result = validate(*flags, _write(tmp_path, text))
    assert result.rc == rc, result.text
    assert said in result.text
    assert ("a local run reads an overridden dataset path as it is" in result.text) is ("a local run" in said)


def test_config_local_drops_the_source_the_operator_keeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, LOCAL_DATA)
    assert cli.main(["config", "--local", str(path)]) == 0
    dataset = yaml.safe_load(capsys.readouterr().out)["task"]["dataset"]
    assert (dataset["path"], dataset.get("source")) == ("../shared/datasets/cifar10-jpeg.tar.gz", None)
    assert cli.main(["config", str(path)]) == EXIT_BAD_INPUT
    assert "path must lie under /data/" in capsys.readouterr().err


def test_a_refused_list_item_is_located_at_the_item(tmp_path: Path, validate: Any) -> None:
    """A list inside a list is named at its own line, not at a field inside it (its own ``items``)."""
    text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: mlbench.io/v1alpha1\n  kind: BenchmarkRunList\n"
    text += "  items: []\n"
    result = validate(_write(tmp_path, text))
    assert result.rc == EXIT_BAD_INPUT
    assert ":4:3: " in result.err, result.err
    assert "list item 0: kind: a BenchmarkRunList inside a List" in result.err
