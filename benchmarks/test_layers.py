"""Time the test layers (tests/layers.py): one pytest run per layer, raw figures as JSON.

    .venv/bin/python benchmarks/test_layers.py unit [multiproc ...] > benchmarks/results/<date>-test-layers.json

Or split one whole-suite run (CI's, ``PYTEST_ARGS=--junitxml=junit.xml bash .ci/run``) into its layers: each
layer's test count and the sum of its tests' own times from that run's JUnit XML (the layers ran interleaved, in
one process, so the sums add up to pytest's total less collection and fixtures shared across layers):

    .venv/bin/python benchmarks/test_layers.py --from-junit junit.xml > benchmarks/results/<date>-layers-in-ci.json

Per layer: the wall time of the pytest process (collection included), pytest's own count of tests and of
passed/failed/skipped/errors (from its JUnit XML), and the machine's load average before and after, since a
shared machine's figures are only comparable at a similar load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: the pytest selection of each layer, as the Makefile's targets give it
LAYERS = {
    "unit": "unit",
    "multiproc": "multiproc",
    "cluster": "cluster and not e2e",
    "e2e": "e2e",
}


def junit_counts(path: Path) -> dict[str, Any]:
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None, f"{path}: no testsuite"
    counts: dict[str, Any] = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    counts["pytest_seconds"] = float(suite.get("time", "0"))
    return counts


def time_layer(name: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        selection = ["-m", LAYERS[name], "-q", "-p", "no:cacheprovider"]
        command = [sys.executable, "-m", "pytest", *selection, f"--junitxml={xml}"]
        load_before = os.getloadavg()
        start = time.monotonic()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
        wall = time.monotonic() - start
        return {
            "layer": name,
            "command": " ".join(["python", *command[1:-1]]),
            "returncode": done.returncode,
            "wall_seconds": round(wall, 1),
            **junit_counts(xml),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }


def layer_ids(name: str) -> set[tuple[str, str]]:
    """The (classname, name) JUnit keys of the layer's tests, from pytest's own collection with its selection."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", LAYERS[name]]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    return {junit_key(line) for line in done.stdout.splitlines() if "::" in line}


def junit_key(nodeid: str) -> tuple[str, str]:
    """``tests/a/test_b.py::Class::test_c[x]`` as JUnit names it: (``tests.a.test_b.Class``, ``test_c[x]``)."""
    path, *parts = nodeid.split("::")
    return ".".join([path.removesuffix(".py").replace("/", "."), *parts[:-1]]), parts[-1]


def split_junit(xml: Path, layers: dict[str, set[tuple[str, str]]]) -> list[dict[str, Any]]:
    """Per layer: tests found in the XML and the sum of their times; tests of no layer are counted apart."""
    sums: dict[str, list[float]] = {name: [] for name in [*layers, "unknown"]}
    for case in ET.parse(xml).getroot().iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        name = next((layer for layer, ids in layers.items() if key in ids), "unknown")
        sums[name].append(float(case.get("time", "0")))
    return [{"layer": k, "tests": len(v), "test_seconds": round(sum(v), 1)} for k, v in sums.items() if v]


def from_junit(xml: Path) -> dict[str, Any]:
    return {
        "produced_by": f"benchmarks/test_layers.py --from-junit {xml.name}",
        "date": time.strftime("%Y-%m-%d"),
        "whole_run": junit_counts(xml),
        "layers": split_junit(xml, {name: layer_ids(name) for name in LAYERS}),
    }


def main(layers: list[str]) -> int:
    if layers[:1] == ["--from-junit"] and len(layers) == 2:  # the flag and its file
        json.dump(from_junit(Path(layers[1])), sys.stdout, indent=1)
        print()
        return 0
    unknown = [name for name in layers if name not in LAYERS]
    if unknown or not layers:
        print(f"layers: one or more of {', '.join(LAYERS)} (got {' '.join(layers) or 'none'})", file=sys.stderr)
        return 2
    git = ["git", "rev-parse", "--short", "HEAD"]
    commit = subprocess.run(git, cwd=REPO, capture_output=True, text=True, check=True).stdout
    report = {
        "produced_by": " ".join(["benchmarks/test_layers.py", *layers]),
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit.strip(),
        "cpus": os.cpu_count(),
        "env": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
        "layers": [time_layer(name) for name in layers],
    }
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
