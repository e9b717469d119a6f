"""``spec.pod.imagePullSecrets`` (issue 34): every pod that pulls the run's image gets the run's pull secrets,
in order; a run without them leaves the field out, so the namespace's service account's apply (the pods run
under the namespace's ``default`` service account: the operator names none)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mlbench_api.pod import MAX_PULL_SECRETS
from mlbench_api.run import BenchmarkRunSpec
from mlbench_operator import fetchjob, runpods
from mlbench_operator.run import admission
from mlbench_operator.runcontext import RunContext
from mlbench_operator.settings import DatasetSettings
from tests.operator import helpers as h


def _ctx(pod: dict[str, Any] | None) -> RunContext:
    body = h.run(pod=pod) if pod is not None else h.run()
    result = admission.admit(body, h.sourced_task(), policy=h.PERMISSIVE)
    assert not isinstance(result, admission.Rejection), result
    return result[0]


def _pod_specs(ctx: RunContext) -> dict[str, dict[str, Any]]:
    return {
        "worker": runpods.worker_pod(ctx, 1, 0)["spec"],
        "launcher": runpods.launcher_pod(ctx, 0)["spec"],
        "fetch job": fetchjob.fetch_job(ctx, DatasetSettings())["spec"]["template"]["spec"],
    }


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (None, None),
        ({}, None),
        ({"imagePullSecrets": []}, None),
        ({"imagePullSecrets": [{"name": "regcred"}]}, [{"name": "regcred"}]),
        (
            {"imagePullSecrets": [{"name": "b.example"}, {"name": "a-1"}], "env": [{"name": "NCCL_DEBUG"}]},
            [{"name": "b.example"}, {"name": "a-1"}],
        ),
    ],
)
def test_every_pod_pulling_the_runs_image_gets_its_pull_secrets(
    pod: dict[str, Any] | None, expected: list[dict[str, str]] | None
) -> None:
    for what, spec in _pod_specs(_ctx(pod)).items():
        assert spec.get("imagePullSecrets") == expected, what
        assert "serviceAccountName" not in spec, what  # the namespace's default service account


@pytest.mark.parametrize(
    ("secrets", "needle"),
    [
        ([{"name": "RegCred"}], "pod.imagePullSecrets.0.name"),
        ([{"name": "reg_cred"}], "pod.imagePullSecrets.0.name"),
        ([{"name": ""}], "pod.imagePullSecrets.0.name"),
        ([{"name": "a" * 254}], "pod.imagePullSecrets.0.name"),
        ([{"name": "a"}, {"name": "a"}], "imagePullSecrets: 'a' is named twice"),
        ([{"name": f"s{i}"} for i in range(MAX_PULL_SECRETS + 1)], "pod.imagePullSecrets"),
        ([{"name": "a", "namespace": "other"}], "pod.imagePullSecrets.0.namespace"),
        (["regcred"], "pod.imagePullSecrets.0"),
    ],
)
def test_bad_pull_secrets_name_the_field(secrets: list[Any], needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        BenchmarkRunSpec.model_validate({"taskRef": {"name": "t"}, "pod": {"imagePullSecrets": secrets}})
    assert needle in str(err.value), str(err.value)


def test_the_longest_name_is_accepted() -> None:
    name = ".".join(["a" * 63] * 4)[:253]
    spec = BenchmarkRunSpec.model_validate({"taskRef": {"name": "t"}, "pod": {"imagePullSecrets": [{"name": name}]}})
    assert spec.to_api()["pod"] == {"imagePullSecrets": [{"name": name}]}
