"""Fixtures of the kind recipe's tests: a real kind (built from its Go module, cached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.kind import build


@pytest.fixture(scope="session")
def kind() -> Path:
    return build()
