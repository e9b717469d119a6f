"""One operator setting names the runner image: a task without runner.image runs it, and the admission allowlist
follows it (a private registry is one change)."""

from __future__ import annotations

import pytest

from mlbench_operator.env import SettingsError
from mlbench_operator.policy import DEFAULT_RUNNER_IMAGE, AdmissionPolicy, repository_patterns, violations
from mlbench_operator.run.admission import Rejection, admit

from .helpers import run, task

PRIVATE = "registry.example.com/team/mlbench-runner:0.2.0"


@pytest.mark.parametrize(
    ("image", "patterns"),
    [
        (PRIVATE, ("registry.example.com/team/mlbench-runner:*", "registry.example.com/team/mlbench-runner@sha256:*")),
        ("localhost:5000/r@sha256:" + "a" * 64, ("localhost:5000/r:*", "localhost:5000/r@sha256:*")),
        ("mlbench/mlbench-runner", ("docker.io/mlbench/mlbench-runner:*", "docker.io/mlbench/mlbench-runner@sha256:*")),
    ],
)
def test_repository_patterns_allow_any_tag_or_digest(image: str, patterns: tuple[str, str]) -> None:
    assert repository_patterns(image) == patterns


def test_the_allowlist_follows_the_runner_image() -> None:
    policy = AdmissionPolicy.from_env({"MLBENCH_RUNNER_IMAGE": PRIVATE})
    assert policy.runner_image == PRIVATE
    assert not violations("registry.example.com/team/mlbench-runner:9", "spec.image", None, None, policy)
    assert violations(DEFAULT_RUNNER_IMAGE, "spec.image", None, None, policy)  # the default's repository is out
    listed = AdmissionPolicy.from_env({"MLBENCH_RUNNER_IMAGE": PRIVATE, "MLBENCH_ALLOWED_IMAGES": "other.example/x:*"})
    assert listed.images == ("other.example/x:*",)  # an explicit list wins


def test_a_runner_image_that_is_a_pattern_is_refused() -> None:
    with pytest.raises(SettingsError, match="MLBENCH_RUNNER_IMAGE"):
        AdmissionPolicy.from_env({"MLBENCH_RUNNER_IMAGE": "registry.example.com/*"})


def test_a_task_without_an_image_runs_the_operators_and_keeps_it_in_its_snapshot() -> None:
    bare = task()
    del bare["spec"]["runner"]
    policy = AdmissionPolicy.from_env({"MLBENCH_RUNNER_IMAGE": PRIVATE})
    admitted = admit(run(), bare, policy=policy)
    assert not isinstance(admitted, Rejection), admitted
    ctx, snapshot = admitted
    assert ctx.image == PRIVATE
    assert snapshot["runner"]["image"] == PRIVATE
    named = admit(run(), task(), policy=AdmissionPolicy.from_env({}))  # the task's own image, allowed by default
    assert not isinstance(named, Rejection), named
    assert named[0].image == task()["spec"]["runner"]["image"]
    refused = admit(run(), bare, policy=AdmissionPolicy(images=("other.example/*",), runner_image=PRIVATE))
    assert isinstance(refused, Rejection)
    assert "MLBENCH_RUNNER_IMAGE" in refused.message
