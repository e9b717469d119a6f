"""One version, pyproject.toml's: the images' tag and OCI version label are read from it (hack/images.sh), and
every other place that names the version (the packages' ``__version__``, the manifests' image tags, the operator's
default runner image) is checked against it here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

import mlbench_operator
import mlbench_runner
from mlbench_operator.policy import DEFAULT_RUNNER_IMAGE

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = ("Dockerfile.operator", "Dockerfile.runner")
OCI_LABELS = {"version": "VERSION", "revision": "REVISION", "source": "SOURCE"}


def project_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


def final_stage(dockerfile: str) -> str:
    text = (REPO / dockerfile).read_text().replace("\\\n", " ")
    return re.split(r"(?m)^FROM .*$", text)[-1]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_the_final_stage_labels_the_image_from_its_build_arguments(dockerfile: str) -> None:
    stage = final_stage(dockerfile)
    for label, arg in OCI_LABELS.items():
        assert re.search(rf"(?m)^ARG {arg}=", stage), f"{dockerfile}: ARG {arg} in the final stage"
        assert f'org.opencontainers.image.{label}="${{{arg}}}"' in stage, f"{dockerfile}: {label} label"


def test_every_version_mention_is_pyprojects() -> None:
    version = project_version()
    assert mlbench_operator.__version__ == version
    assert mlbench_runner.__version__ == version
    assert DEFAULT_RUNNER_IMAGE.endswith(f":{version}")
    deployment = next(
        d
        for d in yaml.safe_load_all((REPO / "manifests" / "operator" / "deployment.yaml").read_text())
        if d and d.get("kind") == "Deployment"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f":{version}")


@pytest.mark.multiproc
def test_images_sh_reads_the_version_from_pyproject(tmp_path: Path) -> None:
    """A copy of hack/images.sh next to a pyproject.toml of another version tags and labels with that version."""
    (tmp_path / "hack").mkdir()
    shutil.copy(REPO / "hack" / "images.sh", tmp_path / "hack" / "images.sh")
    for dockerfile in DOCKERFILES:
        shutil.copy(REPO / dockerfile, tmp_path / dockerfile)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "9.8.7"\n')
    env = {**os.environ, "IMAGE_REPO": "r.example/t", "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    env.pop("MLBENCH_IMAGE_TAG", None)

    def images_sh(*args: str) -> list[str]:
        cmd = ["bash", str(tmp_path / "hack" / "images.sh"), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, timeout=60).stdout.split()

    assert images_sh("tags") == ["r.example/t/mlbench-operator:9.8.7", "r.example/t/mlbench-runner:9.8.7"]
    args = images_sh("oci-args", "Dockerfile.runner")
    assert "VERSION=9.8.7" in args
    assert "REVISION=" in args  # not a git checkout: no revision rather than a wrong one


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("given", "label"),
    [
        ("https://x-access-token:ghs_secret@github.com/o/mlbench.git", "https://github.com/o/mlbench.git"),
        ("https://user@gitlab.example/o/mlbench", "https://gitlab.example/o/mlbench"),
        ("git@github.com:o/mlbench.git", "git@github.com:o/mlbench.git"),  # scp form: a user name, no secret
        ("https://github.com/o/mlbench", "https://github.com/o/mlbench"),
    ],
)
def test_the_source_label_never_carries_credentials(given: str, label: str) -> None:
    env = {**os.environ, "MLBENCH_SOURCE_URL": given}
    cmd = ["bash", str(REPO / "hack" / "images.sh"), "oci-args", "Dockerfile.operator"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, check=True, timeout=60).stdout
    assert f"SOURCE={label}" in out.split()


@pytest.mark.multiproc
def test_the_revision_is_the_last_commit_of_the_images_inputs() -> None:
    env = {**os.environ, "MLBENCH_SOURCE_URL": "https://example.com/mlbench.git"}
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "images.sh"), "oci-args", "Dockerfile.operator"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=True,
        timeout=60,
    ).stdout.split()
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    inputs = [
        "Dockerfile.operator",
        ".dockerignore",
        "locks",
        "crds/mlbench_api",
        "operator/mlbench_operator",
    ]
    last = subprocess.run(
        ["git", "log", "-1", "--format=%H", "--", *inputs], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout.strip()
    (revision,) = [a.removeprefix("REVISION=") for a in out if a.startswith("REVISION=")]
    assert revision in (last, f"{last}-dirty")
    assert f"VERSION={project_version()}" in out
    assert "SOURCE=https://example.com/mlbench.git" in out


@pytest.mark.multiproc
def test_make_images_passes_the_labels_and_names_image_repo_for_both() -> None:
    """``make images`` with a builder that only prints its commands (``echo``): what docker or podman would run."""
    env = {**os.environ, "MLBENCH_BUILDER": "echo", "MLBENCH_BASE": "default", "MLBENCH_WHEELHOUSE": "off"}
    env.pop("MLBENCH_IMAGE_TAG", None)
    res = subprocess.run(
        ["make", "--no-print-directory", "images", "IMAGE_REPO=x/y"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=True,
        timeout=120,
    )
    builds = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("build -f ")]
    version = project_version()
    assert [b.split()[2:5] for b in builds] == [
        ["Dockerfile.operator", "-t", f"x/y/mlbench-operator:{version}"],
        ["Dockerfile.runner", "-t", f"x/y/mlbench-runner:{version}"],
    ]
    for build in builds:
        assert f"--build-arg VERSION={version} --build-arg REVISION=" in build


def make_images(*args: str) -> subprocess.CompletedProcess[str]:
    """``make images ARGS`` with a builder that only prints its commands (``echo``): what docker or podman would run."""
    env = {**os.environ, "MLBENCH_BUILDER": "echo", "MLBENCH_BASE": "default", "MLBENCH_WHEELHOUSE": "off"}
    return subprocess.run(
        ["make", "--no-print-directory", "images", "IMAGE_REPO=x/y", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        check=False,
        timeout=120,
    )


@pytest.mark.multiproc
def test_make_images_builds_from_a_base_pinned_by_digest() -> None:
    """BASE_IMAGE=name@sha256:... reaches both builds as BASE_IMAGE and as BASE_DIGEST (the base.digest label)."""
    digest = "sha256:" + "0123456789abcdef" * 4
    res = make_images(f"BASE_IMAGE=registry.example.com/python:3.11-slim-bookworm@{digest}")
    assert res.returncode == 0, res.stderr
    builds = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("build -f ")]
    assert len(builds) == 2
    for build in builds:
        assert f"--build-arg BASE_IMAGE=registry.example.com/python:3.11-slim-bookworm@{digest} " in build
        assert f"--build-arg BASE_DIGEST={digest} " in build
    assert "not reproducible" not in res.stderr


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("base", "message"),
    [
        ("python@sha256:abc", "a digest is sha256:<64 lowercase hex digits>"),
        ("python@sha512:" + "0" * 128, "only sha256 digests"),
    ],
)
def test_make_images_refuses_a_malformed_base_digest(base: str, message: str) -> None:
    res = make_images(f"BASE_IMAGE={base}")
    assert res.returncode != 0
    assert message in res.stderr
    assert "build -f " not in res.stdout + res.stderr


@pytest.mark.multiproc
def test_make_images_warns_of_a_base_by_tag() -> None:
    res = make_images("BASE_IMAGE=python:3.11-slim-bookworm")
    assert res.returncode == 0, res.stderr
    assert "base python:3.11-slim-bookworm is a tag, not a digest: the build is not reproducible" in res.stderr
