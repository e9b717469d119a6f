"""The shipped catalog equals the normative task specification, number by number."""

from __future__ import annotations

import pytest

from mlbench_api.catalog import get_task, load_catalog
from mlbench_api.model import ModelName
from mlbench_api.schedule import Schedule
from mlbench_api.task import Division


def test_catalog_holds_the_official_tasks_and_smoke_variants() -> None:
    tasks = load_catalog()
    assert {"cifar10-resnet20", "epsilon-logreg"} <= set(tasks)
    for name, task in tasks.items():
        assert task.metadata.name == name
        if "smoke" in name or "synthetic" in name:
            assert task.spec.division is Division.OPEN, f"{name} is not an official task"


def test_task_1a_matches_the_spec() -> None:
    s = get_task("cifar10-resnet20").spec
    assert s.division is Division.CLOSED
    assert (s.model.name, s.model.version, s.model.depth) == (ModelName.RESNET, "m1", 20)
    assert s.dataset.name == "cifar10"
    t = s.training
    assert t.optimizer.value == "sgd"
    assert t.batch_size_per_worker == 32
    assert t.learning_rate.schedule is Schedule.MULTI_STEP
    assert t.learning_rate.per_sample == 0.1 / 256
    assert t.learning_rate.linear_scaling is True
    assert t.learning_rate.warmup_epochs == 5
    assert t.learning_rate.milestones == [82, 109]
    assert t.learning_rate.decay_factor == 0.1
    assert t.momentum == 0.9
    assert t.nesterov is True
    assert t.weight_decay == 0.0001
    assert t.max_epochs == 164
    assert s.goal.metric == "test-top1-accuracy"
    assert s.goal.target == 0.80
    assert s.goal.light_target == 0.70
    assert s.goal.mode.value == "time-to-accuracy"
    assert "batch 32 per worker" in s.description
    assert "old code used 128" in s.description


def test_task_2a_matches_the_spec() -> None:
    s = get_task("epsilon-logreg").spec
    assert s.division is Division.CLOSED
    assert s.model.name is ModelName.LOGISTIC_REGRESSION
    assert s.dataset.name == "epsilon"
    assert s.dataset.format.value == "libsvm"
    t = s.training
    assert t.batch_size_per_worker == 100
    assert t.learning_rate.schedule is Schedule.INVERSE_SQRT
    table = {row.min_workers: row.alpha for row in t.learning_rate.alpha_by_workers}
    assert table == {1: 200, 2: 400, 4: 600, 8: 700, 16: 800}
    assert t.momentum == 0.0
    assert t.nesterov is False
    assert t.weight_decay == 0.0
    assert t.l2_regularization == 0.0000025
    assert s.goal.target == 0.89
    assert s.goal.light_target == 0.80


def test_unknown_task_names_the_field() -> None:
    with pytest.raises(KeyError, match=r"spec\.taskRef\.name: no task 'nope'"):
        get_task("nope")
