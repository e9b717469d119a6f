"""mlbench_runner.tools.scoring on hand-computed inputs: olympic mean, spread, speedup, cost, grouping."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mlbench_runner.tools import scoring
from mlbench_runner.tools.scoring import Configuration, PhaseSplit, RunResult
from mlbench_runner.tools.tables import format_scores
from tests.factories import summary_for

from .helpers import logreg_task, make_config

BASE = Configuration("t", 1, 1, 1, "gloo", "allreduce-sgd", "by-model", "open", (("precision", "fp32"),))


def run(
    ttg: float | None, *, world: int = 1, seed: int | None = None, wall: float | None = None, conf: Configuration = BASE
) -> RunResult:
    c = replace(conf, world_size=world, workers=world)
    return RunResult(
        name=f"r{seed}",
        configuration=c,
        seed=seed,
        status="success" if ttg is not None else "goal-not-reached",
        reached=ttg is not None,
        time_to_goal=ttg,
        wall_clock=wall if wall is not None else (ttg if ttg is not None else 100.0),
        best_accuracy=0.9,
        samples_per_second=100.0,
        split=PhaseSplit(compute=6.0, communication=2.0, other=2.0),
    )


# -- the olympic mean ------------------------------------------------------------------------


def test_olympic_mean_of_five_seeds_drops_the_fastest_and_the_slowest() -> None:
    r = scoring.olympic_mean([50.0, 10.0, 30.0, 20.0, 40.0])
    assert r.value == pytest.approx(30.0)  # (20 + 30 + 40) / 3
    assert r.method == "olympic"
    assert r.used == (20.0, 30.0, 40.0)
    assert r.dropped == (10.0, 50.0)
    assert not r.flags


def test_olympic_mean_with_ties_drops_one_run_at_each_end() -> None:
    r = scoring.olympic_mean([10.0, 30.0, 10.0, 30.0, 20.0])
    assert r.value == pytest.approx(20.0)  # (10 + 20 + 30) / 3: one 10 and one 30 stay
    assert r.used == (10.0, 20.0, 30.0)
    assert scoring.olympic_mean([7.0, 7.0, 7.0]).value == pytest.approx(7.0)
    assert scoring.olympic_mean([12.0, 12.0, 12.0, 18.0, 18.0]).value == pytest.approx(14.0)  # (12 + 12 + 18) / 3


def test_one_failed_run_is_dropped_as_the_slowest() -> None:
    r = scoring.olympic_mean([12.0, 10.0, 14.0, 11.0], failures=1)
    assert r.value == pytest.approx((11 + 12 + 14) / 3)  # the slowest success stays: the failure took its place
    assert r.failure_dropped
    assert r.dropped == (10.0,)
    assert not r.flags


def test_two_failed_runs_make_the_result_invalid_under_mlperf() -> None:
    r = scoring.olympic_mean([10.0, 20.0, 30.0], failures=2)
    assert r.value == pytest.approx(20.0)  # olympic mean of the successful runs, flagged
    assert r.method == "olympic"
    assert "invalid under MLPerf" in r.flags[0]


def test_fewer_than_three_successes_fall_back_to_the_plain_mean() -> None:
    r = scoring.olympic_mean([10.0, 20.0], failures=3)
    assert r.value == pytest.approx(15.0)
    assert r.method == "mean"
    assert "only 2 successful runs: plain mean" in r.flags[0]
    one = scoring.olympic_mean([42.0])
    assert (one.value, one.method) == (42.0, "mean")
    none = scoring.olympic_mean([], failures=5)
    assert (none.value, none.method, none.flags) == (None, "none", ("no run reached the goal",))
    with pytest.raises(ValueError, match="failures"):
        scoring.olympic_mean([1.0], failures=-1)


def test_spread_and_success_rate() -> None:
    s = scoring.spread([10.0, 20.0, 30.0, 40.0, 50.0])
    assert s is not None
    assert (s.min, s.max) == (10.0, 50.0)
    assert s.stdev == pytest.approx(15.811388, rel=1e-6)  # sqrt(250): sample standard deviation
    single = scoring.spread([3.0])
    assert single is not None
    assert single.stdev is None
    assert scoring.spread([]) is None
    assert scoring.success_rate(4, 5) == pytest.approx(0.8)
    assert scoring.success_rate(0, 0) is None


# -- speedup, cost, split ------------------------------------------------------------------------


def test_speedup_and_efficiency() -> None:
    assert scoring.speedup(100.0, 30.0) == pytest.approx(10 / 3)
    assert scoring.scaling_efficiency(10 / 3, 1, 4) == pytest.approx(5 / 6)
    assert scoring.scaling_efficiency(1.5, 2, 8) == pytest.approx(0.375)  # 1.5 / (8 / 2)
    assert scoring.speedup(None, 30.0) is None
    assert scoring.speedup(100.0, None) is None


def test_cost_is_workers_times_hours_times_price() -> None:
    assert scoring.cost(4, 1800.0, 2.5) == pytest.approx(5.0)  # 4 workers x 0.5 h x 2.5
    assert scoring.cost(1, 3600.0, 0.1) == pytest.approx(0.1)
    assert scoring.cost(4, 1800.0, None) is None
    assert scoring.cost(4, None, 2.5) is None


def test_phase_split_of_a_summary(tmp_path: Path) -> None:
    s = summary_for(make_config(logreg_task(), tmp_path, 2), ttg=None, wall=20.0, compute=(3.0, 4.0, 1.0), comm=2.0)
    split = scoring.phase_split(s)
    assert (split.compute, split.communication, split.other) == pytest.approx((8.0, 2.0, 10.0))
    assert split.communication_share == pytest.approx(0.2)
    assert PhaseSplit(0.0, 0.0, 1.0).communication_share is None


# -- configurations ------------------------------------------------------------------------------


def test_a_configuration_is_everything_but_the_seed(tmp_path: Path) -> None:
    task = logreg_task()
    a = scoring.configuration(
        summary_for(make_config(task, tmp_path, 2, seed=1), ttg=5.0), make_config(task, tmp_path, 2, seed=1)
    )
    b_cfg = make_config(task, tmp_path / "other", 2, name="other-name", seed=2)
    b = scoring.configuration(summary_for(b_cfg, ttg=6.0), b_cfg)
    assert a == b  # seed, run name and output folder differ only
    assert a.division == "open"
    assert a.label() == "test-task 2x1 gloo allreduce-sgd/by-model"
    bigger = make_config({**task, "training": {**task["training"], "batchSizePerWorker": 20}}, tmp_path, 2)
    c = scoring.configuration(summary_for(bigger, ttg=5.0), bigger)
    assert c != a
    assert c.family() != a.family()
    four = make_config(task, tmp_path, 4)
    d = scoring.configuration(summary_for(four, ttg=5.0), four)
    assert d.family() == a.family()  # only the world size differs
    assert scoring.variant_labels([a, c]) == {a: "batchSizePerWorker=10", c: "batchSizePerWorker=20"}
    alone = scoring.configuration(summary_for(four, ttg=5.0), None)  # no config.json: from the summary
    assert (alone.task, alone.world_size, alone.algorithm, alone.bucketing, alone.division) == (
        "test-task",
        4,
        "allreduce-sgd",
        "by-model",
        "unknown",
    )


def test_the_device_index_and_thread_count_are_not_part_of_the_configuration(tmp_path: Path) -> None:
    cfg = make_config(logreg_task(), tmp_path, 1)
    s = summary_for(cfg, ttg=1.0)
    s.environment.devices = ["cuda:3 NVIDIA H100 80GB HBM3"]
    assert scoring.device_of(s) == "cuda NVIDIA H100 80GB HBM3"
    s.environment.devices = ["cpu Intel(R) Xeon(R) (2 threads/rank)"]
    assert scoring.device_of(s) == "cpu Intel(R) Xeon(R)"


# -- scoring several configurations --------------------------------------------------------------


def test_score_groups_by_configuration_with_speedup_cost_and_flags() -> None:
    runs = [run(t, world=1, seed=i) for i, t in enumerate([100.0, 90.0, 110.0, 95.0, 105.0])]
    runs += [run(t, world=4, seed=i) for i, t in enumerate([30.0, 25.0, 35.0])]
    runs += [run(None, world=4, seed=9, wall=50.0)]
    one, four = scoring.score(runs, price_per_worker_hour=3.6)
    assert one.configuration.world_size == 1
    assert one.time_to_goal.value == pytest.approx(100.0)  # (95 + 100 + 105) / 3
    assert one.success_rate == 1.0
    assert one.speedup == pytest.approx(1.0)
    assert one.cost_to_goal == pytest.approx(1 * 100 / 3600 * 3.6)
    assert not one.flags
    assert four.time_to_goal.value == pytest.approx(32.5)  # 25 dropped, the failure dropped as the slowest
    assert four.success_rate == pytest.approx(0.75)
    assert four.speedup == pytest.approx(100 / 32.5)
    assert four.efficiency == pytest.approx(100 / 32.5 / 4)
    assert four.baseline_world_size == 1
    assert four.wall_clock == pytest.approx((30 + 25 + 35 + 50) / 4)
    assert four.cost_per_run == pytest.approx(4 * 35 / 3600 * 3.6)
    assert four.cost_to_goal == pytest.approx(4 * 32.5 / 3600 * 3.6)
    assert four.flags == ("4 runs; MLPerf-style scoring wants 5 seeds",)
    assert four.split.communication_share == pytest.approx(0.25)


def test_score_flags_repeated_seeds_and_a_baseline_that_never_reached_the_goal() -> None:
    runs = [run(None, world=1, seed=1), run(10.0, world=2, seed=1), run(11.0, world=2, seed=1)]
    one, two = scoring.score(runs)
    assert one.time_to_goal.value is None
    assert two.speedup is None
    assert any("seed 1 used more than once" in f for f in two.flags)
    assert any("baseline (1 ranks) never reached the goal" in f for f in two.flags)
    assert two.cost_to_goal is None  # no price given


def test_families_are_scored_apart() -> None:
    mpi = replace(BASE, backend="mpi")
    runs = [run(10.0, world=1), run(5.0, world=2), run(20.0, world=1, conf=mpi), run(8.0, world=2, conf=mpi)]
    scores = scoring.score(runs)
    assert [(s.configuration.backend, s.configuration.world_size, s.speedup) for s in scores] == [
        ("gloo", 1, pytest.approx(1.0)),
        ("gloo", 2, pytest.approx(2.0)),
        ("mpi", 1, pytest.approx(1.0)),
        ("mpi", 2, pytest.approx(2.5)),
    ]


# -- runs that left no summary ------------------------------------------------------------------------


FP32 = replace(BASE, settings=(("device", "cpu"), ("precision", "fp32"), ("task.x", "1")))
BF16 = replace(BASE, settings=(("device", "cpu"), ("precision", "bf16"), ("task.x", "1")))
UNSEEN = replace(BASE, settings=(("task.x", "1"),))  # what config.json alone says


@pytest.mark.parametrize(
    ("finished", "unfinished", "joined"),
    [
        ([FP32], UNSEEN, FP32),  # the one configuration it was started as
        ([FP32, BF16], UNSEEN, UNSEEN),  # two candidates: not guessed
        ([FP32], replace(UNSEEN, settings=(("task.x", "2"),)), None),  # another task setting: its own
        # every seed of its world size failed: the family's, at its own world size
        ([FP32], replace(UNSEEN, world_size=2, workers=2), replace(FP32, world_size=2, workers=2)),
        ([FP32, BF16], replace(UNSEEN, world_size=2, workers=2), None),  # two families: not guessed
    ],
)
def test_a_run_without_summary_joins_the_configuration_it_was_started_as(
    finished: list[Configuration], unfinished: Configuration, joined: Configuration | None
) -> None:
    runs = [run(10.0, seed=i, conf=c) for i, c in enumerate(finished)]
    crashed = replace(run(None, seed=9, conf=unfinished), configuration=unfinished, measured=False)
    out = scoring.attach_unfinished([*runs, crashed])
    assert out[-1].configuration == (joined or unfinished)
    assert out[:-1] == runs


def test_a_smallest_world_whose_seeds_all_failed_stays_the_baseline() -> None:
    """Every 1-rank seed crashed (config.json only): the speedups of 2 and 4 ranks are not taken against
    2 ranks as if it were the smallest; they have none, and say the baseline never reached the goal."""
    crashed = [
        replace(run(None, seed=s), configuration=UNSEEN, measured=False, name=f"c{s}", status="no-summary")
        for s in (1, 2)
    ]
    measured = [run(t, world=w, seed=s, conf=FP32) for w, t in [(2, 50.0), (4, 30.0)] for s in (1, 2)]
    one, two, four = scoring.score([*crashed, *measured])
    assert [s.configuration.world_size for s in (one, two, four)] == [1, 2, 4]
    assert one.configuration.family() == two.configuration.family() == four.configuration.family()
    assert (two.baseline_world_size, two.speedup, four.speedup) == (1, None, None)
    assert any("baseline (1 ranks) never reached the goal" in f for f in four.flags)


def test_a_run_without_summary_is_a_failure_that_adds_no_times() -> None:
    crashed = replace(run(None, seed=6), wall_clock=0.0, samples_per_second=0.0, measured=False, name="c")
    (s,) = scoring.score([run(t, seed=i) for i, t in enumerate([10.0, 20.0, 30.0, 40.0, 50.0])] + [crashed])
    assert s.success_rate == pytest.approx(5 / 6)
    assert s.time_to_goal.failure_dropped  # MLPerf: the one non-converging run is the dropped slowest
    assert s.wall_clock == pytest.approx(30.0)
    assert s.samples_per_second == pytest.approx(100.0)
    assert any("left no readable summary" in f and "c" in f for f in s.flags)
    (alone,) = scoring.score([crashed])
    assert alone.wall_clock is None
    assert alone.success_rate == 0.0


def test_unfinished_result_is_a_run_that_missed_the_goal(tmp_path: Path) -> None:
    config = make_config(logreg_task(), tmp_path, 2, name="crashed", seed=3)
    r = scoring.unfinished_result(config, "somewhere")
    assert (r.name, r.seed, r.reached, r.measured, r.source) == ("crashed", 3, False, False, "somewhere")
    assert r.configuration.world_size == 2


def test_an_accuracy_after_time_goal_is_scored_by_the_final_accuracy() -> None:
    """The spec: after the budget the final model is evaluated, higher is better; the time the target was
    first crossed is no score, and no speedup or spread is made of it."""
    runs = [
        replace(run(0.03, world=w, seed=s), final_accuracy=final, accuracy_after_time=True)
        for w, s, final in [(1, 1, 0.915), (1, 2, 0.60), (2, 1, 0.80), (2, 2, 0.70)]
    ]
    one, two = scoring.score(runs)
    assert one.final_accuracy == pytest.approx(0.7575)
    assert two.final_accuracy == pytest.approx(0.75)
    assert (one.time_to_goal.value, one.time_to_goal.method, one.spread) == (None, "none", None)
    assert two.speedup is None
    assert any("scored by the final model's accuracy" in f for f in one.flags)
    assert not any("never reached the goal" in f for f in two.flags)
    mixed = scoring.score([*runs, run(10.0, seed=3, conf=replace(BASE, task="other"))])
    assert {(s.configuration.task, s.accuracy_after_time) for s in mixed} == {("t", True), ("other", False)}

    table = format_scores(mixed).splitlines()
    header = next(line for line in table if line.startswith("configuration"))
    assert "final acc" in header
    assert any("75.75%" in line or "75.8%" in line for line in table), table


def test_the_goal_mode_comes_from_the_config(tmp_path: Path) -> None:
    task = logreg_task()
    task["goal"] = {**task.get("goal", {}), "mode": "accuracy-after-time", "timeBudgetSeconds": 60}
    config = make_config(task, tmp_path, 1)
    summary = summary_for(config, ttg=1.0)
    assert scoring.run_result(summary, config).accuracy_after_time
    assert not scoring.run_result(summary, None).accuracy_after_time
    assert scoring.unfinished_result(config).accuracy_after_time  # a crashed run of that task: the same goal
