"""The algorithm contract on real multi-process runs: Centralized Adam's equivalence, and declared
bytes per step against what the communicator counted (the reference family)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mlbench_api.training import Algorithm
from mlbench_runner.algorithms import make_algorithm, registered
from mlbench_runner.timing import PhaseTimer
from tests.factories import read_summary

from .helpers import launch_processes, logreg_task, make_config
from .test_decentralized import StubComm, small_model

pytestmark = pytest.mark.timeout(300)


def test_every_api_algorithm_is_registered() -> None:
    assert registered() == sorted(a.value for a in Algorithm)


@pytest.mark.multiproc
def test_centralized_adam_k_workers_match_one_big_batch(tmp_path: Path) -> None:
    """Averaged gradients then Adam: k ranks x batch b step exactly as one rank x batch k*b (fp64)."""
    k, b = 4, 5
    task = logreg_task(batch=b, epochs=2, train=200, features=12, alpha=0.05)
    many = launch_processes(
        make_config(task, tmp_path / "k", k, algorithm="centralized-adam"),
        k,
        MLBENCH_TRACE_PARAMS="1",
        MLBENCH_DTYPE="float64",
    )
    big = logreg_task(batch=k * b, epochs=2, train=200, features=12, alpha=0.05)
    one = launch_processes(
        make_config(big, tmp_path / "one", 1, algorithm="centralized-adam"),
        1,
        MLBENCH_TRACE_PARAMS="1",
        MLBENCH_DTYPE="float64",
    )
    for rec in many[1:]:
        assert rec["param_sha1"] == many[0]["param_sha1"], "ranks diverged"
    a, c = np.asarray(many[0]["param_values"]), np.asarray(one[0]["param_values"])
    assert a.shape == c.shape == (2 * 200 // (k * b), 12)
    np.testing.assert_allclose(a, c, rtol=1e-9, atol=1e-12)
    # ... and it is Adam, not SGD: the same task with allreduce-sgd takes other steps.
    sgd = launch_processes(make_config(task, tmp_path / "sgd", k), k, MLBENCH_TRACE_PARAMS="1", MLBENCH_DTYPE="float64")
    assert not np.allclose(np.asarray(sgd[0]["param_values"]), a)
    s = read_summary(tmp_path / "k")
    assert s.environment.algorithm == "centralized-adam/by-model"
    assert s.final_accuracy is not None
    assert s.final_accuracy > 0.7


@pytest.mark.multiproc
@pytest.mark.parametrize("bucketing", ["by-model", "by-layer"])
def test_allreduce_declares_what_it_sends(tmp_path: Path, bucketing: str) -> None:
    features = 12
    task = logreg_task(batch=5, epochs=1, train=100, features=features)
    launch_processes(make_config(task, tmp_path, 2, bucketing=bucketing), 2)
    c = read_summary(tmp_path).communication
    assert c is not None
    weights = features * 4  # logistic regression: one weight per feature (no bias), fp32
    assert (c.collectives, c.bytes_per_step, c.uncompressed_bytes_per_step) == (["all-reduce"], weights, weights)
    assert c.measured_bytes_per_step == weights  # every step sent exactly the declared payload
    assert c.compression_ratio == 1


@pytest.mark.multiproc
def test_one_rank_sends_nothing(tmp_path: Path) -> None:
    launch_processes(make_config(logreg_task(epochs=1, train=100), tmp_path, 1), 1)
    c = read_summary(tmp_path).communication
    assert c is not None
    assert (c.collectives, c.bytes_per_step, c.measured_bytes_per_step) == ([], 0, 0)


@pytest.mark.parametrize(
    ("name", "bucketing"), [(n, b) for n in ("allreduce-sgd", "centralized-adam") for b in ("by-model", "by-layer")]
)
@pytest.mark.parametrize("k", [1, 3])
def test_the_all_reduce_family_times_its_average_as_compute(name: str, bucketing: str, k: int) -> None:
    """The sum is communication; dividing it by k is a local kernel, timed as compression (compute)."""
    model = small_model()
    algo = make_algorithm(name, StubComm(0, k, peer_value=2.0), bucketing)
    algo.prepare(model)
    for p in model.parameters():
        p.grad.fill_(5.0)  # type: ignore[union-attr]
    timer = PhaseTimer(torch.device("cpu"))
    timer.start_step(0)
    algo.synchronize(model, timer)
    timer.end_step()
    assert set(timer.flush()[0].phases) == ({"communication", "compression"} if k > 1 else set())
    assert all(bool((p.grad == (5.0 + 2.0 * (k - 1)) / k).all()) for p in model.parameters())  # type: ignore[union-attr]
