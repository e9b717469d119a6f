"""``mlbench validate`` and a real API server give the same verdict on the same file (issue 13).

Every example under ``tests/examples`` and every case of :mod:`tests.api.validate_cases` goes,
as the file a user has, through ``kubectl apply --dry-run=server -f <file>`` and through
``mlbench validate``. Two kinds of refusal exist:

* the API server's (OpenAPI types, the schema, CEL rules, strict field validation):
  ``mlbench validate --schema-only`` must give exactly its verdict;
* the operator's admission (``mlbench_operator.run.admission.admit``): the API server accepts the
  run, and the operator then fails it TaskNotFound, OverrideNotAllowed, InvalidTask or
  InvalidConfig. The valid examples annotated ``test.mlbench.io/admission-refuses`` are such
  runs: the server must accept them and plain ``mlbench validate`` must refuse them. (That the
  operator's own ``admit`` refuses them too is checked without a cluster in ``test_validate.py``.)

Plain ``mlbench validate`` thus refuses what either refuses, and accepts only what both accept.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml

from mlbench_api import cli
from tests.api.examples import EXPECT_FIELD, admission_refused, example_files
from tests.api.validate_cases import CASES, Case
from tests.cluster.plugin import KubeCluster

pytestmark = pytest.mark.cluster

NAMESPACE = "default"  # dry runs persist nothing


def _validate(*args: str | Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["validate", *map(str, args)])
    return rc, out.getvalue() + err.getvalue()


def _server(kube_cluster: KubeCluster, path: Path, *extra: str) -> tuple[bool, str]:
    """The API server's verdict on the file, sent as ``kubectl apply`` sends it."""
    res = kube_cluster.kubectl("apply", "--dry-run=server", "-n", NAMESPACE, *extra, "-f", str(path))
    return res.returncode == 0, res.stdout + res.stderr


def _expect_field(path: Path) -> str | None:
    doc = yaml.safe_load(path.read_text())
    return str(doc["metadata"]["annotations"][EXPECT_FIELD]) if path.parent.name == "invalid" else None


def _admission(path: Path) -> str | None:
    doc = yaml.safe_load(path.read_text())
    return admission_refused(doc) if isinstance(doc, dict) else None


@pytest.fixture(scope="module")
def case_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("validate-cases")
    files = {}
    for case in CASES:
        files[case.id] = directory / f"{case.id}.yaml"
        files[case.id].write_text(case.text)
    return files


@pytest.mark.parametrize("path", example_files(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_example_verdicts_agree(kube_cluster: KubeCluster, path: Path) -> None:
    accepted, server_says = _server(kube_cluster, path)
    schema_rc, schema_says = _validate("--schema-only", path)
    rc, says = _validate(path)
    assert (schema_rc == 0) is accepted, f"server: {server_says}\nvalidate --schema-only: {schema_says}"
    field = _expect_field(path)
    if field is not None:  # refused by the API server: both name the field
        assert field in server_says, server_says
        assert field in schema_says, schema_says
    admission = _admission(path)
    if admission is None:
        assert (rc == 0) is accepted, f"server: {server_says}\nvalidate: {says}"
    else:  # the server accepts; the operator's admission (and validate) refuse
        assert accepted, f"an admission example must pass the API server: {server_says}"
        assert rc == 2, says  # bad input: exit 2, as every command reports it
        assert f"{admission}:" in says
        assert "the operator would fail the run" in says


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case_verdicts_agree(kube_cluster: KubeCluster, case_files: dict[str, Path], case: Case) -> None:
    path = case_files[case.id]
    accepted, server_says = _server(kube_cluster, path)
    assert accepted is case.accepted, f"the recorded verdict is stale; the server says: {server_says}"
    rc, says = _validate(path)
    assert (rc == 0) is accepted, f"server: {server_says}\nvalidate: {says}"
    assert (_validate("--schema-only", path)[0] == 0) is accepted


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_server_side_apply_differs_only_where_validate_warns(
    kube_cluster: KubeCluster, case_files: dict[str, Path], case: Case
) -> None:
    """``kubectl apply --server-side`` (and Flux) refuses a null without a default that client-side apply
    drops; validate follows client-side apply and warns about every null."""
    path = case_files[case.id]
    client_side, _ = _server(kube_cluster, path)
    server_side, server_says = _server(kube_cluster, path, "--server-side", "--field-manager=mlbench-tests")
    if server_side is not client_side:
        _, says = _validate(path)
        assert "server-side apply (--server-side, Flux) refuses it" in says, server_says
