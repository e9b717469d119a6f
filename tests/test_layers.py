"""The test layers (tests/layers.py): which layer a test is in, and the guard that keeps processes out of unit.

The guard is tried on small test files run by pytester in this process (``runpytest``: no subprocess).
"""

from __future__ import annotations

import pytest

from tests.layers import UNIT, layer

INI = """
[pytest]
markers =
    unit: no process
    multiproc: starts processes
    cluster: the control plane
    e2e: end to end
"""
CONFTEST = 'pytest_plugins = ["tests.layers"]\n'


@pytest.fixture
def layered(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini(INI)
    pytester.makeconftest(CONFTEST)
    return pytester


@pytest.mark.parametrize(
    ("markers", "expected"),
    [
        (set(), UNIT),
        ({"slow", "timeout"}, UNIT),
        ({"multiproc"}, "multiproc"),
        ({"cluster"}, "cluster"),
        ({"cluster", "realnode", "e2e", "slow"}, "e2e"),
        ({"multiproc", "cluster"}, "cluster"),
    ],
)
def test_the_layer_of_a_test_is_its_most_specific_marker(markers: set[str], expected: str) -> None:
    assert layer(markers) == expected


def test_unit_selects_the_tests_of_no_other_layer(layered: pytest.Pytester) -> None:
    layered.makepyfile(
        """
        import pytest

        def test_plain(): pass

        @pytest.mark.slow
        def test_slow(): pass

        @pytest.mark.multiproc
        def test_ranks(): pass

        @pytest.mark.cluster
        def test_api(): pass
        """
    )
    layered.makeini(INI + "    slow: slow\n")
    result = layered.runpytest("-m", "unit", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*::test_plain", "*::test_slow", "2/4 tests collected (2 deselected)*"])


def test_a_unit_test_that_starts_a_process_fails_even_when_it_catches_the_error(layered: pytest.Pytester) -> None:
    layered.makepyfile(
        """
        import multiprocessing
        import os
        import subprocess

        def test_popen():
            try:
                subprocess.run(["true"], check=True)
            except Exception:
                pass  # code under test that swallows the error

        def test_multiprocessing():
            process = multiprocessing.get_context("fork").Process(target=print)
            process.start()

        def test_system():
            os.system("true")

        def test_no_process():
            assert sum([1, 2]) == 3
        """
    )
    result = layered.runpytest()
    result.assert_outcomes(passed=1, failed=3)
    result.stdout.fnmatch_lines(
        [
            "*unit test started a process (subprocess._fork_exec): mark it `multiproc`*",
            "*unit test started a process (os.fork): mark it `multiproc`*",
            "*unit test started a process (os.system): mark it `multiproc`*",
        ]
    )


def test_a_fixture_that_starts_a_process_fails_the_unit_test_that_uses_it(layered: pytest.Pytester) -> None:
    layered.makepyfile(
        """
        import subprocess
        import pytest

        @pytest.fixture(scope="module")
        def server():
            return subprocess.Popen(["sleep", "60"])

        def test_uses_it(server):
            pass
        """
    )
    result = layered.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unit test started a process*"])


def test_unit_is_not_written_by_hand(layered: pytest.Pytester) -> None:
    layered.makepyfile(
        """
        import pytest

        @pytest.mark.unit
        def test_claims_it(): pass
        """
    )
    result = layered.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "`unit` is given by collection" in result.stderr.str() + result.stdout.str()


@pytest.mark.multiproc
def test_a_multiproc_test_starts_processes(layered: pytest.Pytester) -> None:
    layered.makepyfile(
        """
        import subprocess
        import pytest

        @pytest.mark.multiproc
        def test_ranks():
            assert subprocess.run(["true"]).returncode == 0
        """
    )
    layered.runpytest().assert_outcomes(passed=1)
