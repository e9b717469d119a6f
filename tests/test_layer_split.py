"""benchmarks/test_layers.py --from-junit: one whole-suite run's JUnit XML split into the test layers."""

from __future__ import annotations

from pathlib import Path

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "test_layers.py"

XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="0" skipped="0" tests="4" time="12.5">
<testcase classname="tests.api.test_a" name="test_one" time="0.5"/>
<testcase classname="tests.runner.test_b.TestRanks" name="test_two[2-gloo]" time="7.0"/>
<testcase classname="tests.runner.test_b.TestRanks" name="test_two[4-gloo]" time="3.0"/>
<testcase classname="tests.new.test_c" name="test_three" time="1.0"/>
</testsuite></testsuites>
"""


def test_a_node_id_is_keyed_as_junit_names_it() -> None:
    key = load_script("benchmarks/test_layers.py").junit_key
    assert key("tests/api/test_a.py::test_one") == ("tests.api.test_a", "test_one")
    assert key("tests/runner/test_b.py::TestRanks::test_two[2-gloo]") == (
        "tests.runner.test_b.TestRanks",
        "test_two[2-gloo]",
    )


def test_each_layer_sums_its_own_tests_and_the_rest_is_counted_apart(tmp_path: Path) -> None:
    script = load_script("benchmarks/test_layers.py")
    xml = tmp_path / "junit.xml"
    xml.write_text(XML)
    layers = {
        "unit": {script.junit_key("tests/api/test_a.py::test_one")},
        "multiproc": {
            script.junit_key("tests/runner/test_b.py::TestRanks::test_two[2-gloo]"),
            script.junit_key("tests/runner/test_b.py::TestRanks::test_two[4-gloo]"),
        },
        "cluster": set(),
    }
    assert script.split_junit(xml, layers) == [
        {"layer": "unit", "tests": 1, "test_seconds": 0.5},
        {"layer": "multiproc", "tests": 2, "test_seconds": 10.0},
        {"layer": "unknown", "tests": 1, "test_seconds": 1.0},
    ]
