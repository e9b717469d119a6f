"""The README's cluster section followed as written, on the test cluster: the operator installed from the chart
(tests/e2e/conftest.py), ``kubectl apply -f manifests/examples/cifar10-smoke-2workers.yaml`` (the public smoke
task, 2 workers at 1 CPU), the run Succeeded, ``mlbench results <namespace>/cifar10-smoke`` downloading its results
(table, summary, plots); meanwhile ``helm upgrade`` with the run in flight keeps it.

Nothing is downloaded. The task's public archive is served in-cluster: a CIFAR-10 archive in the python format
(tests/e2e/cifar_python.py) made from the JPEG copy of CIFAR-10 (``../shared/datasets/cifar10-jpeg.tar.gz``), and
a small subset of it: 500 training images (50 of each class, five batches of 100) and 200 test images. Its sha256
is not the public archive's, so the run points at it as a user without internet would point at a mirror, with
``spec.overrides.datasetSource`` (the open division allows other bytes). The task as shipped is too slow for CI
here: its 8 epochs of 5000 images ran at 12 samples/s per rank on the test nodes (the machine's 2 cores at a load
average of 16), about 55 minutes in all (the catalog's figure for a quiet machine's two ranks: 2 to 2.5 minutes),
so the run trains on the archive's 500 (``spec.overrides.trainSubset``; the task's ``trainSubset`` is 5000) for
the task's 8 epochs: Succeeded need not mean the task's goal (GoalNotReached).

What the example gets besides, for the test cluster only: the e2e label (the e2e operator serves only those runs),
the real nodes' scheduling (they are tainted) and the e2e namespace (the README's ``default`` is the namespace the
example lands in without one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.cifar_python import write_archive
from tests.e2e.conftest import DATASET, E2E, E2E_LABEL, OPERATOR_NAMESPACE, sha256

pytestmark = [pytest.mark.cluster, pytest.mark.realnode, pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "cifar10-smoke-2workers.yaml"
ARCHIVE = "cifar-10-python.tar.gz"
#: images of each class in the archive: 500 training images (the run's trainSubset), 200 test images
TRAIN_PER_CLASS, TEST_PER_CLASS = 50, 20
TIMEOUT = 1200


def example(e2e: E2E, source: dict[str, Any]) -> dict[str, Any]:
    """The README's example as written, plus what the test cluster needs and the in-cluster mirror."""
    (run,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    run["metadata"].update(namespace=e2e.namespace, labels=E2E_LABEL)
    run["spec"]["scheduling"] = e2e.scheduling
    run["spec"]["overrides"] = {"datasetSource": source, "trainSubset": TRAIN_PER_CLASS * 10}
    return dict(run)


def serve_archive(e2e: E2E, workdir: Path) -> dict[str, Any]:
    """The python-format archive on the namespace's dataset server; the task's source with its URL and sha256."""
    archive = write_archive(DATASET, workdir / ARCHIVE, TRAIN_PER_CLASS, TEST_PER_CLASS)
    e2e.cluster.kubectl("cp", str(archive), f"{e2e.namespace}/datasets:/srv/{ARCHIVE}", check=True, timeout=120)
    task = json.loads(e2e.kubectl("get", "benchmarktask", "cifar10-resnet20-public-smoke", "-o", "json").stdout)
    source = dict(task["spec"]["dataset"]["source"])  # unpack, stripComponents as the task says
    source.update(url=f"http://datasets.{e2e.namespace}.svc.cluster.local:8080/{ARCHIVE}", sha256=sha256(archive))
    return source


def operator_pods(e2e: E2E) -> set[str]:
    selector = "app.kubernetes.io/name=mlbench-operator"
    return set(e2e.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", selector, "-o", "name").stdout.split())


def upgrade_in_flight(e2e: E2E, run: str) -> str:
    """``helm upgrade`` (a new operator pod template: the Deployment's pods are recreated) once the run trains;
    returns the run's launcher UID from before, which must stay the run's (no restart, no new attempt)."""
    assert e2e.release is not None, "the operator was not installed with helm"
    st = e2e.wait_status(
        run,
        lambda s: (
            s.get("phase") in ("Succeeded", "Failed")
            or (s.get("phase") == "Running" and '"epoch_start"' in e2e.logs(f"{run}-launcher"))
        ),
        600,
        "the first epoch to start",
    )
    assert st["phase"] == "Running", f"{run} ended before the upgrade: {st}\n{e2e.debug(run)}"
    before = operator_pods(e2e)
    e2e.release.upgrade("operator.resources.limits.memory=1100Mi")
    assert operator_pods(e2e).isdisjoint(before), "helm upgrade did not replace the operator's pods"
    return str(st["launcher"]["uid"])


def results(e2e: E2E, run: str, workdir: Path) -> Path:
    """``mlbench results <namespace>/<run>`` as the README types it, in ``workdir``: the downloaded folder."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "mlbench"), "results", f"{e2e.namespace}/{run}"],
        cwd=workdir,
        env={"KUBECONFIG": str(e2e.cluster.kubeconfig), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert run in proc.stdout, proc.stdout
    return workdir / "mlbench-results" / f"{e2e.namespace}.{run}"


def test_the_readmes_first_cluster_example(e2e: E2E, tmp_path: Path) -> None:
    run = example(e2e, serve_archive(e2e, tmp_path))
    name = run["metadata"]["name"]
    e2e.kubectl("apply", "-f", "-", input=yaml.safe_dump(run))
    launcher = upgrade_in_flight(e2e, name)
    st = e2e.wait_finished(name, timeout=TIMEOUT)
    assert st["phase"] == "Succeeded", f"{st}\n{e2e.debug(name)}"
    assert (st["launcher"]["uid"], st.get("restarts") or 0) == (launcher, 0), "the upgrade restarted the run"
    assert st["result"]["worldSize"] == 2
    fetched = results(e2e, name, tmp_path)
    summary = json.loads((fetched / "summary.json").read_text())
    assert len(summary["history"]) == st["result"]["epochs"]
    events = [json.loads(line)["event"] for line in (fetched / "events.jsonl").read_text().splitlines()]
    assert events[0] == "run_start", events
    assert "run_summary" in events, events
    plot = fetched / "accuracy-vs-time.svg"  # the plots next to the run, captioned from its config.json
    assert plot.exists(), f"no plot next to the run: {sorted(p.name for p in fetched.iterdir())}"
    assert "CIFAR-10 (python version)" in plot.read_text()
