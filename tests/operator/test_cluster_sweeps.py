"""BenchmarkSweeps against the real control plane (kwok nodes): runs created a few at a time, the status and
``kubectl get bsw`` columns, what the API server refuses, finished runs remembered, cascading deletion."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlbench_api.sweep import LABEL_SEED, LABEL_SWEEP, LABEL_WORKERS
from mlbench_operator import conditions as c
from tests import factories
from tests.cluster.plugin import wait_for
from tests.operator import helpers as h
from tests.operator.conftest import SESSION, SESSION_LABEL, Runs

pytestmark = pytest.mark.cluster


def sweep_body(name: str, matrix: dict[str, Any], max_concurrent: int, **template: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkSweep",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "taskRef": {"name": h.TASK_NAME},
                "resources": {"cpu": "100m", "memory": "128Mi"},
                "runPolicy": {"maxRestarts": 0},
                **template,
            },
            "matrix": matrix,
            "maxConcurrent": max_concurrent,
        },
    }


def sweep_status(runs: Runs, name: str) -> dict[str, Any]:
    return dict((runs.get("benchmarksweep", name) or {}).get("status") or {})


def wait_sweep(runs: Runs, name: str, pred: Any, what: str, timeout: float = 60) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def check() -> Any:
        nonlocal last
        last = sweep_status(runs, name)
        return last if pred(last) else None

    try:
        return dict(wait_for(check, timeout=timeout, interval=0.3, what=what))
    except pytest.fail.Exception:
        pytest.fail(f"timed out waiting for {what}; last sweep status: {json.dumps(last, indent=1)}")


def sweep_runs(runs: Runs, sweep: str) -> dict[str, dict[str, Any]]:
    res = runs.kubectl("get", "benchmarkruns", "-l", f"{LABEL_SWEEP}={sweep}", "-o", "json")
    return {r["metadata"]["name"]: r for r in json.loads(res.stdout)["items"]}


def sweep_finalizers(runs: Runs, name: str) -> list[str]:
    return list(((runs.get("benchmarksweep", name) or {}).get("metadata") or {}).get("finalizers") or [])


def counts(status: dict[str, Any]) -> tuple[int, ...]:
    return tuple(status.get(k, -1) for k in ("total", "pending", "running", "succeeded", "failed"))


def finish(runs: Runs, name: str, workers: int, ok: bool = True) -> None:
    runs.wait_phase(name, "Running")
    if ok:
        runs.finish_launcher(name, 0, factories.summary(name, world_size=workers).termination_message())
        runs.wait_phase(name, "Succeeded")
    else:
        runs.finish_launcher(name, 1, '{"error":"mpirun exited with 1","exitCode":1}')
        runs.wait_phase(name, "Failed")


def test_sweep_creates_runs_a_few_at_a_time(runs: Runs) -> None:
    name = "study"
    w1s1, w1s2, w2s1, w2s2 = (f"{name}-w{w}-s{s}" for w in (1, 2) for s in (1, 2))
    runs.apply(sweep_body(name, {"workers": [1, 2], "seeds": [1, 2]}, max_concurrent=2))

    # maxConcurrent 2: the first two in order, owned by the sweep, with its labels (the session's too)
    status = wait_sweep(runs, name, lambda s: counts(s) == (4, 2, 2, 0, 0), "the first two runs")
    sweep = runs.get("benchmarksweep", name)
    assert sweep is not None
    assert set(sweep_runs(runs, name)) == {w1s1, w1s2}
    for run_name, run in sweep_runs(runs, name).items():
        labels = run["metadata"]["labels"]
        assert labels[SESSION_LABEL] == SESSION
        assert labels[LABEL_WORKERS] == "1"
        assert labels[LABEL_SEED] == run_name[-1]
        (owner,) = run["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("BenchmarkSweep", name, sweep["metadata"]["uid"])
        assert owner["controller"] is True
        assert run["spec"]["workers"] == 1
        assert run["spec"]["seed"] == int(run_name[-1])
    assert [r["name"] for r in status["runs"]] == [w1s1, w1s2, w2s1, w2s2]
    assert (c.get(status["conditions"], c.RECONCILING) or {}).get("status") == "True"
    assert status["observedGeneration"] == sweep["metadata"]["generation"]
    assert "startTime" in status

    # the API server refuses to change the matrix (the runs are named after it)
    res = runs.kubectl(
        "patch", "benchmarksweep", name, "--type=merge", "-p", '{"spec":{"matrix":{"seeds":[7]}}}', check=False
    )
    assert res.returncode != 0
    assert "matrix is immutable" in res.stderr

    # the first two finish: the next two are created (nothing more: there are only four)
    finish(runs, w1s1, 1)
    finish(runs, w1s2, 1)
    wait_sweep(runs, name, lambda s: counts(s) == (4, 0, 2, 2, 0), "the next two runs")
    assert set(sweep_runs(runs, name)) == {w1s1, w1s2, w2s1, w2s2}
    finish(runs, w2s1, 2)
    finish(runs, w2s2, 2, ok=False)

    # every run finished (one failed; failurePolicy Continue): the sweep is Ready, and says so in kubectl
    status = wait_sweep(runs, name, lambda s: s.get("completionTime"), "the sweep finished")
    assert counts(status) == (4, 0, 0, 3, 1)
    assert (c.get(status["conditions"], c.READY) or {}).get("status") == "True"
    assert (c.get(status["conditions"], c.RECONCILING) or {}).get("status") == "False"
    assert {r["name"]: r.get("phase") for r in status["runs"]} == {
        w1s1: "Succeeded",
        w1s2: "Succeeded",
        w2s1: "Succeeded",
        w2s2: "Failed",
    }
    assert runs.kubectl("wait", "--for=condition=Ready", f"benchmarksweep/{name}", "--timeout=5s").returncode == 0
    header, row = runs.kubectl("get", "bsw", name).stdout.splitlines()
    assert header.split() == ["NAME", "TOTAL", "RUNNING", "SUCCEEDED", "FAILED", "AGE"]
    assert row.split()[:5] == [name, "4", "0", "3", "1"]
    wide_header = runs.kubectl("get", "bsw", name, "-o", "wide").stdout.splitlines()[0].split()
    assert {"PENDING", "READY"} <= set(wide_header)

    def reasons() -> set[str]:
        out = runs.kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json").stdout
        return {e["reason"] for e in json.loads(out)["items"]}

    wait_for(lambda: {"RunCreated", "RunFailed", "Completed"} <= reasons(), timeout=20, what="the sweep's Events")

    # finished: the sweep no longer blocks its own deletion; deleting it deletes its runs (garbage collection)
    wait_for(lambda: not sweep_finalizers(runs, name), timeout=30, what="finalizer released")
    runs.kubectl("delete", "benchmarksweep", name, "--wait=true", "--timeout=30s")
    wait_for(lambda: sweep_runs(runs, name) == {}, timeout=60, what="the sweep's runs garbage-collected")


def test_finished_runs_deleted_by_their_ttl_are_not_created_again(runs: Runs) -> None:
    """Also: maxConcurrent raised while the sweep goes on takes effect at once."""
    name = "ttl-study"
    first, second, third = (f"{name}-s{seed}" for seed in (1, 2, 3))
    body = sweep_body(name, {"seeds": [1, 2, 3]}, max_concurrent=1)
    body["spec"]["template"]["runPolicy"]["ttlSecondsAfterFinished"] = 1
    runs.apply(body)
    wait_sweep(runs, name, lambda s: counts(s) == (3, 2, 1, 0, 0), "the first run")
    assert set(sweep_runs(runs, name)) == {first}
    finish(runs, first, 1)
    wait_for(lambda: runs.get("benchmarkrun", first) is None, timeout=30, what="the first run deleted by its TTL")
    wait_sweep(runs, name, lambda s: counts(s) == (3, 1, 1, 1, 0), "the second run")
    assert set(sweep_runs(runs, name)) == {second}
    # two at a time from now on: the third is created while the second runs
    runs.kubectl("patch", "benchmarksweep", name, "--type=merge", "-p", '{"spec":{"maxConcurrent":2}}')
    status = wait_sweep(runs, name, lambda s: counts(s) == (3, 0, 2, 1, 0), "the third run, at once")
    assert status["observedGeneration"] == 2
    finish(runs, second, 1)
    finish(runs, third, 1)
    status = wait_sweep(runs, name, lambda s: s.get("completionTime"), "the sweep finished")
    assert counts(status) == (3, 0, 0, 3, 0)
    wait_for(lambda: sweep_runs(runs, name) == {}, timeout=30, what="the other runs deleted by their TTL")
    assert counts(sweep_status(runs, name)) == (3, 0, 0, 3, 0)  # remembered, and not run again


def test_a_ttl_of_zero_waits_for_the_sweep_to_record_the_end(runs: Runs) -> None:
    """A run deleted the moment it finishes must not look to its sweep like one that vanished while running
    (which the sweep would create again): the TTL waits until the sweep has written down how it ended."""
    name = "ttl0-study"
    seeds = (1, 2, 3)
    body = sweep_body(name, {"seeds": list(seeds)}, max_concurrent=3)
    body["spec"]["template"]["runPolicy"]["ttlSecondsAfterFinished"] = 0
    runs.apply(body)
    wait_sweep(runs, name, lambda s: counts(s) == (3, 0, 3, 0, 0), "all three runs")
    for seed in seeds:
        run = f"{name}-s{seed}"
        runs.wait_phase(run, "Running")
        runs.finish_launcher(run, 0, factories.summary(run, world_size=1).termination_message())
    status = wait_sweep(runs, name, lambda s: s.get("completionTime"), "the sweep finished")
    assert counts(status) == (3, 0, 0, 3, 0), "a run was created again after its TTL deleted it"
    wait_for(lambda: sweep_runs(runs, name) == {}, timeout=30, what="the runs deleted by their TTL")


def test_the_api_server_takes_the_parameters_of_every_algorithm_the_sweep_compares(runs: Runs) -> None:
    """The template's own rules would refuse rank on an allreduce-sgd template; the sweep's rules take it."""
    body = sweep_body(
        "tuned",
        {"algorithms": ["allreduce-sgd", "powersgd", "sparsified-sgd"]},
        1,
        algorithmParameters={"rank": 4, "density": 0.05},
    )
    doc = {**body, "metadata": {**body["metadata"], "namespace": runs.ns, "labels": {SESSION_LABEL: SESSION}}}
    res = runs.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
    assert res.returncode == 0, res.stderr


def test_the_api_server_refuses_invalid_sweeps_naming_the_field(runs: Runs) -> None:
    cases = [
        (sweep_body("nccl", {"backends": ["gloo", "nccl"]}, 1), "spec.matrix.backends", "nccl needs"),
        (sweep_body("ddp", {"algorithms": ["ddp"]}, 1, backend="mpi"), "spec.matrix.algorithms", "not mpi"),
        (sweep_body("big", {"workers": [1, 2, 3], "seeds": list(range(90))}, 1), "spec.matrix", "more than 256"),
        (sweep_body("dup", {"seeds": [1, 1]}, 1), "spec.matrix.seeds", "Duplicate value"),
        (sweep_body("x" * 52, {"seeds": [1]}, 1), "metadata.name", "at most 51"),
        (
            sweep_body("unused", {"algorithms": ["sparsified-sgd"]}, 1, algorithmParameters={"rank": 4}),
            "spec.template.algorithmParameters.rank",
            "is for algorithm powersgd only, which is neither template.algorithm nor in matrix.algorithms",
        ),
        (
            sweep_body("nomatrix", {"seeds": [1]}, 1, algorithmParameters={"density": 0.1}),
            "spec.template.algorithmParameters.density",
            "is for algorithm sparsified-sgd only",
        ),
    ]
    for body, field, words in cases:
        labels = {SESSION_LABEL: SESSION}
        doc = {**body, "metadata": {**body["metadata"], "namespace": runs.ns, "labels": labels}}
        res = runs.kubectl("apply", "-f", "-", input=json.dumps(doc), check=False)
        assert res.returncode != 0, body["metadata"]["name"]
        assert field in res.stderr, res.stderr
        assert words in res.stderr, res.stderr
