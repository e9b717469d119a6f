"""The images install offline from the wheelhouse that ``hack/images.sh`` fills: every package a Dockerfile's
``pip install`` names must be among the wheelhouse's requirements (a package missing there fails the build with
pip's ResolutionImpossible, as sacrebleu once did). No builder needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pip_installed(dockerfile: Path) -> set[str]:
    """The packages of the Dockerfile's ``pip install --constraint ...`` commands (its RUN lines joined)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    names: set[str] = set()
    for command in re.findall(r"pip install ([^;\n]*)", text):
        words = command.split()
        skip = False
        for word in words:
            if skip:
                skip = False
            elif word in ("--constraint", "--index-url", "-c"):
                skip = True
            elif not word.startswith(("-", "$", '"')):
                names.add(word)
    return names


def wheel_requirements() -> set[str]:
    match = re.search(r"^WHEEL_REQUIREMENTS=\(([^)]*)\)", (REPO / "hack" / "images.sh").read_text(), flags=re.M)
    assert match is not None, "hack/images.sh has no WHEEL_REQUIREMENTS"
    return set(match.group(1).split())


@pytest.mark.parametrize("dockerfile", ["Dockerfile.runner", "Dockerfile.operator"])
def test_every_package_an_image_installs_is_in_the_wheelhouse(dockerfile: str) -> None:
    installed = pip_installed(REPO / dockerfile)
    assert {"pydantic", "pyyaml"} <= installed  # the parser found the command
    assert installed <= wheel_requirements(), f"{dockerfile} installs {installed - wheel_requirements()} offline"
