"""In CI a skip fails unless the machine cannot run the test (tests/skips.py), tried on small test files run
by pytester in this process."""

from __future__ import annotations

import pytest

from tests.skips import MACHINE_LIMITS, NO_SKIP, allowed

FILE = """
import pytest

def test_needs_a_dataset():
    pytest.skip("the dataset is not there")

@pytest.mark.skipif(True, reason="OpenMPI's mpirun is not installed on this machine")
def test_needs_mpirun(): pass

def test_needs_a_gpu():
    pytest.skip("needs a GPU")

def test_own_module():
    pytest.importorskip("no_such_module_of_ours")

@pytest.mark.xfail(reason="known")
def test_expected_failure():
    assert False

def test_plain(): pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest('pytest_plugins = ["tests.skips"]\n')
    pytester.makepyfile(test_some=FILE)
    return pytester


def test_in_ci_a_skip_fails_unless_the_machine_cannot_run_the_test(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(NO_SKIP, "1")
    result = suite.runpytest("-rfEs")
    result.assert_outcomes(passed=1, failed=2, errors=1, skipped=1, xfailed=1)  # a skipif mark fails in setup
    result.stdout.fnmatch_lines(["*skipped in CI (MLBENCH_NO_SKIP=1): the dataset is not there*"])
    result.stdout.fnmatch_lines(["*ERROR test_some.py::test_needs_mpirun*"], consecutive=False)
    result.stdout.fnmatch_lines(["*FAILED test_some.py::test_own_module*"], consecutive=False)


def test_outside_ci_a_skip_stays_a_skip(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NO_SKIP, raising=False)
    suite.runpytest().assert_outcomes(passed=1, skipped=4, xfailed=1)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("needs a GPU", True),
        ("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM / sch_netem): Error", True),
        ("this promtool is built without Kubernetes SD (Debian's): use http_sd_url=", True),
        ("no real node: none Ready", False),
        ("no image builder: neither `docker info` nor `podman info` answers", False),
        ("the prometheus binary is not installed on this machine", False),
        ("a GPU is nice", False),
    ],
)
def test_the_allowed_reasons_are_what_the_machine_cannot_do(reason: str, expected: bool) -> None:
    assert allowed(reason) is expected


def test_every_allowed_reason_says_why() -> None:
    assert all(why.strip() for why in MACHINE_LIMITS.values())
