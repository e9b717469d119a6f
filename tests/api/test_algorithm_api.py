"""The algorithm choice in the API: parameters per algorithm, closed-division admission, sweeps."""

from __future__ import annotations

from typing import Any

import pytest

from mlbench_api.catalog import get_task, parse_run
from mlbench_api.config import AlgorithmNotAllowed, InvalidOverride, effective_config
from mlbench_api.errors import InvalidObject
from mlbench_api.parameters import PARAMETER_DEFAULTS, AlgorithmParameters, Selection, Topology
from mlbench_api.sweep import expand, parse_sweep
from mlbench_api.task import BenchmarkTaskSpec
from mlbench_api.training import REFERENCE_ALGORITHMS, Algorithm


def run_doc(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mlbench.io/v1alpha1",
        "kind": "BenchmarkRun",
        "metadata": {"name": "r", "namespace": "ns"},
        "spec": {"taskRef": {"name": "cifar10-resnet20-smoke"}, **spec},
    }


def problems(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidObject) as info:
        parse_run(doc)
    return info.value.problems


@pytest.mark.parametrize(("name", "owner"), [(n, owner) for n, (owner, _d) in PARAMETER_DEFAULTS.items()])
@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_a_parameter_belongs_to_its_algorithm_only(name: str, owner: Algorithm, algorithm: Algorithm) -> None:
    value = {"rank": 3, "warmStart": False, "topology": "complete", "density": 0.5, "selection": "random-k"}[name]
    doc = run_doc(algorithm=algorithm.value, algorithmParameters={name: value})
    if algorithm is owner:
        assert parse_run(doc).spec.algorithm_parameters == AlgorithmParameters.model_validate({name: value})
    else:
        assert problems(doc) == [f"spec.algorithmParameters.{name}: is for algorithm {owner.value} only"]


@pytest.mark.parametrize(
    ("algorithm", "given", "expected"),
    [
        (Algorithm.POWERSGD, {}, {"rank": 2, "warmStart": True}),
        (Algorithm.POWERSGD, {"rank": 8}, {"rank": 8, "warmStart": True}),
        (Algorithm.DECENTRALIZED_SGD, {}, {"topology": Topology.RING.value}),
        (Algorithm.SPARSIFIED_SGD, {"selection": "random-k"}, {"density": 0.01, "selection": "random-k"}),
        (Algorithm.SPARSIFIED_SGD, {}, {"density": 0.01, "selection": Selection.TOP_K.value}),
        (Algorithm.ALLREDUCE_SGD, {}, {}),
        (Algorithm.SIGN_SGD, {}, {}),
    ],
)
def test_the_config_carries_the_algorithms_defaults(
    algorithm: Algorithm, given: dict[str, Any], expected: dict[str, Any]
) -> None:
    doc = run_doc(algorithm=algorithm.value, **({"algorithmParameters": given} if given else {}))
    config = effective_config(parse_run(doc), "s", get_task("cifar10-resnet20-smoke").spec)
    assert config.algorithm_parameters.to_api() == expected


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_a_closed_task_allows_the_reference_update_only(algorithm: Algorithm) -> None:
    run = parse_run({**run_doc(algorithm=algorithm.value), "spec": {"taskRef": {"name": "cifar10-resnet20"}}})
    run.spec.algorithm = algorithm
    task = get_task("cifar10-resnet20").spec
    assert task.algorithms == list(REFERENCE_ALGORITHMS)
    if algorithm in REFERENCE_ALGORITHMS:
        assert effective_config(run, "cifar10-resnet20", task).algorithm is algorithm
    else:
        with pytest.raises(AlgorithmNotAllowed, match=rf"^spec\.algorithm: {algorithm.value} is not allowed"):
            effective_config(run, "cifar10-resnet20", task)


def test_a_closed_task_may_list_more_algorithms() -> None:
    data = get_task("cifar10-resnet20").spec.to_api()
    data["algorithms"] = ["allreduce-sgd", "powersgd"]
    task = BenchmarkTaskSpec.model_validate(data)
    run = parse_run(run_doc(algorithm="powersgd"))
    assert effective_config(run, "t", task).algorithm is Algorithm.POWERSGD
    with pytest.raises(AlgorithmNotAllowed):
        effective_config(parse_run(run_doc(algorithm="ddp")), "t", task)


def test_a_time_budget_on_a_time_to_accuracy_task_is_refused() -> None:
    run = parse_run(run_doc(overrides={"timeBudgetSeconds": 60}))
    with pytest.raises(InvalidOverride, match=r"^spec\.overrides\.timeBudgetSeconds: .*time-to-accuracy"):
        effective_config(run, "s", get_task("cifar10-resnet20-smoke").spec)


def test_a_time_budget_on_an_accuracy_after_time_task_replaces_the_tasks() -> None:
    data = get_task("cifar10-resnet20-smoke").spec.to_api()
    data["goal"].update(mode="accuracy-after-time", timeBudgetSeconds=600)
    config = effective_config(
        parse_run(run_doc(overrides={"timeBudgetSeconds": 60})), "s", BenchmarkTaskSpec.model_validate(data)
    )
    assert config.time_budget_seconds == 60


def _sweep(parameters: dict[str, Any], algorithms: list[str] | None, algorithm: str = "powersgd") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "template": {"taskRef": {"name": "t"}, "algorithm": algorithm, "algorithmParameters": parameters}
    }
    if algorithms is not None:
        spec["matrix"] = {"algorithms": algorithms}
    return {"apiVersion": "mlbench.io/v1alpha1", "kind": "BenchmarkSweep", "metadata": {"name": "cmp"}, "spec": spec}


def test_sweep_runs_keep_only_their_algorithms_parameters() -> None:
    doc = _sweep({"rank": 4}, ["allreduce-sgd", "powersgd", "sparsified-sgd"])
    runs = expand(parse_sweep(doc))
    assert [(r.name, r.spec.algorithm_parameters) for r in runs] == [
        ("cmp-ar", None),
        ("cmp-psgd", AlgorithmParameters(rank=4)),
        ("cmp-ssgd", None),
    ]


def test_one_sweep_tunes_every_algorithm_it_compares() -> None:
    """MLBench's study: PowerSGD at rank 4 and top-k at 5 % against all-reduce, in one sweep; the template's
    own algorithm need not own any of them."""
    doc = _sweep(
        {"rank": 4, "warmStart": False, "density": 0.05, "topology": "complete"},
        ["allreduce-sgd", "powersgd", "sparsified-sgd", "decentralized-sgd"],
        algorithm="allreduce-sgd",
    )
    runs = expand(parse_sweep(doc))
    assert [(r.name, r.spec.algorithm_parameters) for r in runs] == [
        ("cmp-ar", None),
        ("cmp-psgd", AlgorithmParameters(rank=4, warm_start=False)),
        ("cmp-ssgd", AlgorithmParameters(density=0.05)),
        ("cmp-dsgd", AlgorithmParameters(topology="complete")),
    ]


@pytest.mark.parametrize(
    ("parameters", "algorithms", "problem"),
    [
        ({"topology": "ring"}, ["allreduce-sgd", "sparsified-sgd"], "topology: is for algorithm decentralized-sgd"),
        ({"selection": "random-k"}, ["powersgd"], "selection: is for algorithm sparsified-sgd only"),
        ({"density": 0.1}, None, "density: is for algorithm sparsified-sgd only"),  # no matrix: the template's
    ],
)
def test_a_sweep_parameter_that_no_run_uses_is_refused(
    parameters: dict[str, Any], algorithms: list[str] | None, problem: str
) -> None:
    with pytest.raises(InvalidObject) as info:
        parse_sweep(_sweep(parameters, algorithms))
    (found,) = info.value.problems
    assert found.startswith(f"spec.template.algorithmParameters.{problem}")
    assert found.endswith("only, which is neither template.algorithm nor in matrix.algorithms")


def test_a_sweep_valid_before_stays_valid() -> None:
    """A parameter of template.algorithm, which the matrix leaves out, was accepted (and unused) before the
    template could hold other algorithms' parameters: a stored sweep must not turn invalid on an upgrade."""
    runs = expand(parse_sweep(_sweep({"rank": 4}, ["allreduce-sgd", "sign-sgd"])))
    assert [r.spec.algorithm_parameters for r in runs] == [None, None]


@pytest.mark.parametrize(
    ("network", "problem"),
    [
        ({}, "spec.network: set at least one of bandwidthMbit, latencyMs, lossPercent"),
        ({"bandwidthMbit": 0}, "spec.network.bandwidthMbit: Input should be greater than 0"),
        ({"latencyMs": 1, "lossPercent": 100}, "spec.network.lossPercent: Input should be less than 100"),
        ({"bandwidthMbit": 10, "jitterMs": 1}, "spec.network.jitterMs: needs latencyMs"),
    ],
)
def test_network_conditions_name_the_field(network: dict[str, Any], problem: str) -> None:
    assert problems(run_doc(network=network)) == [problem]
