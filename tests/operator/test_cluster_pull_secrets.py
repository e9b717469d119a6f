"""Pulling a run's image from a private registry (issue 34), against the real API server (kwok nodes): the run's
``spec.pod.imagePullSecrets`` on its pods, the namespace's default service account's when the run names none, and
the CRD refusing a name that is no Secret's."""

from __future__ import annotations

import json

import pytest

from tests.operator import helpers as h
from tests.operator.conftest import Runs

pytestmark = pytest.mark.cluster


def _pull_secrets(runs: Runs, run: str) -> dict[str, list[dict[str, str]] | None]:
    pods = runs.pods(run)
    assert pods, f"no pods of {run}"
    return {name: pod["spec"].get("imagePullSecrets") for name, pod in pods.items()}


def test_the_runs_pull_secrets_are_on_its_pods(runs: Runs) -> None:
    secrets = [{"name": "regcred"}, {"name": "mirror.example"}]
    runs.apply(h.run("pulls", workers=2, pod={"imagePullSecrets": secrets}))
    runs.wait_phase("pulls", "Running")
    found = _pull_secrets(runs, "pulls")
    assert set(found) == {"pulls-worker-0", "pulls-worker-1", "pulls-launcher"}
    assert all(value == secrets for value in found.values()), found


def test_without_them_the_namespaces_service_account_s_apply(runs: Runs) -> None:
    """What docs/operator.md says: ``kubectl patch serviceaccount default`` reaches the run's pods (they run under
    the namespace's default service account, and the API server's ServiceAccount admission copies its secrets)."""
    patch = {"imagePullSecrets": [{"name": "team-registry"}]}
    runs.kubectl("patch", "serviceaccount", "default", "-p", json.dumps(patch))
    runs.apply(h.run("sa-pulls", workers=1))
    runs.wait_phase("sa-pulls", "Running")
    found = _pull_secrets(runs, "sa-pulls")
    assert all(value == patch["imagePullSecrets"] for value in found.values()), found


@pytest.mark.parametrize(
    ("secrets", "needle"),
    [
        ([{"name": "Not_A_Name"}], "spec.pod.imagePullSecrets[0].name"),
        ([{"name": f"s{i}"} for i in range(9)], "spec.pod.imagePullSecrets"),
        ([{"name": "a"}, {"name": "a"}], "spec.pod.imagePullSecrets[1]"),
    ],
)
def test_the_api_server_refuses_bad_pull_secrets(runs: Runs, secrets: list[dict[str, str]], needle: str) -> None:
    body = h.run("bad-pulls", runs.ns, pod={"imagePullSecrets": secrets})
    refused = runs.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)
    assert refused.returncode != 0
    assert needle in refused.stderr, refused.stderr
