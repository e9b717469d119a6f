"""Fixtures of the chart tests: a real helm (built from its Go module, cached) with private homes."""

from __future__ import annotations

import pytest

from tests.cluster.helm import Helm, build


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(build(), tmp_path_factory.mktemp("helm-home"))
