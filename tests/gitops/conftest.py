"""Fixtures of the GitOps tests: the Lua interpreter that runs Argo CD's health checks."""

from __future__ import annotations

import pytest

from tests.gitops import lua


@pytest.fixture(scope="module")
def lua54() -> str:
    """lua5.4 (CI installs it: `make system-deps`); the tests that need it skip without it, saying so."""
    found = lua.interpreter(lua.LUA)
    if found is None:
        pytest.skip(f"{lua.LUA} is not installed (`make system-deps` installs it, as CI does)")
    return found
