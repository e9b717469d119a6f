"""Task 4b's rule across two gloo ranks: accumulation over ranks takes one rank's step on the same global batch,
and the smoke recipe reaches its BLEU goal on the synthetic pair (NOT WMT) on a CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from mlbench_api.catalog import get_task
from mlbench_api.results import RunSummary
from mlbench_runner.comm import LocalCommunicator, TorchCommunicator, close_quietly
from mlbench_runner.pod.launch import launcher_command
from mlbench_runner.translation.corpus import write_synthetic
from mlbench_runner.translation.loop import RECIPE_4A, RECIPE_4B, SMOKE, SMOKE_GNMT, train_translation
from mlbench_runner.translation.optim import LossScaler, accumulated_step
from mlbench_runner.translation.task import recipe_for
from mlbench_runner.translation.transformer import TransformerShape
from mlbench_runner.world import free_port

from .helpers import env, join_all, launch_processes, make_config, read_ranks, spawn_ranks
from .test_translation import micro_batches, tiny_model
from .translation_rank import smoke_record

STEPS = 3


def train_steps(comm: LocalCommunicator | TorchCommunicator, batches_per_step: list[list[int]]) -> list[float]:
    """STEPS Adam steps of the tiny fp64 model on this rank's micro-batches (their indices into one shared list)."""
    pool = micro_batches(7, 4 * STEPS)
    model = tiny_model().double().train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    scaler = LossScaler()
    for step, indices in enumerate(batches_per_step):
        lr = 1e-3 * (step + 1)
        mine = [pool[i] for i in indices]
        accumulated_step(model, optimizer, mine, comm, scaler, lr=lr, pad=0, smoothing=0.1)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def _accumulating_rank(rank: int, port: int, out: str) -> None:
    from mlbench_runner.world import World

    comm = TorchCommunicator(World(rank, 2, rank, 2, "127.0.0.1", port, "env"), "gloo")
    plan = [[4 * s + 2 * rank, 4 * s + 2 * rank + 1] for s in range(STEPS)]  # update_freq 2 on each of 2 ranks
    params = train_steps(comm, plan)
    close_quietly(comm, True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(params))


@pytest.mark.multiproc
@pytest.mark.timeout(180)
def test_two_ranks_with_accumulation_take_one_ranks_step_on_the_same_global_batch(tmp_path: Path) -> None:
    join_all(spawn_ranks(_accumulating_rank, str(tmp_path)), timeout=150)
    ranks = [torch.tensor(json.loads((tmp_path / f"rank{r}.json").read_text()), dtype=torch.float64) for r in (0, 1)]
    alone = torch.tensor(
        train_steps(LocalCommunicator("gloo"), [[4 * s + i for i in range(4)] for s in range(STEPS)]),
        dtype=torch.float64,
    )
    torch.testing.assert_close(ranks[0], ranks[1], rtol=0, atol=0)  # every rank takes the same step
    torch.testing.assert_close(ranks[0], alone, rtol=1e-9, atol=1e-9)
    untrained = torch.cat([p.detach().reshape(-1) for p in tiny_model().double().parameters()])
    assert not torch.allclose(alone, untrained)  # the steps did move the model


def _smoke_rank(rank: int, port: int, root: str, out: str) -> None:
    from mlbench_runner.world import World

    torch.set_num_threads(1)
    comm = TorchCommunicator(World(rank, 2, rank, 2, "127.0.0.1", port, "env"), "gloo")
    result = train_translation(Path(root), SMOKE, comm, seed=0)
    close_quietly(comm, True)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(smoke_record(result)))


def check_smoke(out: Path) -> None:
    """Both ranks' records: from near 0 BLEU to the goal, judged alike on every rank."""
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    first = ranks[0]
    print("BLEU per epoch", first["bleu"], "seconds", first["wall"], "steps", first["steps"])
    assert first["reached"]
    assert first["bleu"][0] < 5.0 < SMOKE.goal.target <= first["bleu"][-1]
    assert first["update_freq"] == 1  # 1024 tokens over 2 ranks of 512: no accumulation needed
    assert first["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert ranks[1]["bleu"] == first["bleu"]
    assert ranks[1]["hypotheses"] == first["hypotheses"]  # every rank judged the same gathered test set


@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_the_smoke_recipe_reaches_its_bleu_goal_with_two_gloo_ranks(tmp_path: Path) -> None:
    root = write_synthetic(tmp_path / "synthetic", {"train": 3000, "test": 200}, seed=0)
    join_all(spawn_ranks(_smoke_rank, str(root), str(tmp_path)), timeout=540)
    check_smoke(tmp_path)


@pytest.mark.multiproc
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed on this machine")
def test_the_smoke_recipe_reaches_its_bleu_goal_with_two_mpi_ranks(tmp_path: Path) -> None:
    root = write_synthetic(tmp_path / "synthetic", {"train": 3000, "test": 200}, seed=0)
    root_flag = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    cmd = ["mpirun", "-np", "2", "--oversubscribe", *root_flag, sys.executable, "-m", "tests.runner.translation_rank"]
    proc = subprocess.run(
        [*cmd, str(root), str(tmp_path), "mpi"], env=env(), capture_output=True, text=True, timeout=540, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_smoke(tmp_path)


def test_the_catalog_4b_task_is_the_pages_recipe() -> None:
    """recipe_for reads task 4b's sections into the loop's recipe: the same numbers as RECIPE_4B."""
    config = make_config(get_task("wmt17-transformer").spec.to_api(), Path("/tmp/unused"), 4)
    recipe = recipe_for(config)
    assert isinstance(RECIPE_4B.shape, TransformerShape)
    assert recipe == dataclasses.replace(
        RECIPE_4B, shape=dataclasses.replace(RECIPE_4B.shape, max_positions=81), goal=recipe.goal
    )
    assert (recipe.goal.metric.value, recipe.goal.target) == ("bleu", 25.0)


def test_the_catalog_4a_task_is_the_pages_recipe() -> None:
    """recipe_for reads task 4a's sections into the loop's recipe: the same numbers as RECIPE_4A."""
    config = make_config(get_task("wmt16-gnmt").spec.to_api(), Path("/tmp/unused"), 4)
    recipe = recipe_for(config)
    assert recipe == dataclasses.replace(RECIPE_4A, goal=recipe.goal)
    assert (recipe.goal.metric.value, recipe.goal.target) == ("bleu", 24.0)
    assert recipe.rate(0, 1000) == pytest.approx(2e-5)
    assert recipe.rate(400, 1000) == pytest.approx(1e-3)


@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_the_catalog_smoke_task_trains_to_its_goal_under_the_runner_command(tmp_path: Path) -> None:
    """``mlbench-runner train`` on two gloo ranks runs a transformer task through the translation kind; rank 0's
    summary carries BLEU per epoch, sacrebleu's signature and the loss scaler's count."""
    config = make_config(get_task("synthetic-transformer-smoke").spec.to_api(), tmp_path / "out", 2)
    ranks = launch_processes(config, 2, timeout=540)
    summary = RunSummary.model_validate_json((tmp_path / "out" / "summary.json").read_text())
    print("scores", [h.score for h in summary.history], "wall", summary.wall_clock_seconds)
    assert (summary.status, summary.stop_reason, summary.goal_reached) == ("success", "goal", True)
    assert summary.goal_metric == "bleu"
    assert summary.final_score is not None
    assert summary.final_score >= 60.0
    assert summary.history[0].score is not None
    assert summary.history[0].score < 5.0
    assert summary.bleu_signature is not None
    assert summary.bleu_signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert (summary.skipped_steps, summary.update_freq) == (0, 1)
    assert summary.communication_seconds > 0
    assert [r["steps"] for r in ranks] == [summary.steps, summary.steps]
    events = [json.loads(line) for line in (tmp_path / "out" / "events.jsonl").read_text().splitlines()]
    evaluations = [e for e in events if e["event"] == "eval_accuracy"]
    assert [e["score"] for e in evaluations] == [h.score for h in summary.history]
    assert {e["metric"] for e in evaluations} == {"bleu"}
    assert events[-1]["event"] == "run_summary"


def test_the_gnmt_smoke_task_is_the_smoke_recipe() -> None:
    """The catalog's synthetic-gnmt-smoke reads into SMOKE_GNMT (the recipe the docs describe)."""
    config = make_config(get_task("synthetic-gnmt-smoke").spec.to_api(), Path("/tmp/unused"), 2)
    recipe = recipe_for(config)
    assert recipe == dataclasses.replace(SMOKE_GNMT, goal=recipe.goal)
    assert recipe.goal.target == SMOKE_GNMT.goal.target


def check_gnmt_smoke(out: Path, ranks: list[dict[str, Any]], backend: str) -> None:
    """Rank 0's summary: from near 0 BLEU to the smoke goal, with sacrebleu's signature, on every rank's steps."""
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    print(backend, "scores", [h.score for h in summary.history], "wall", summary.wall_clock_seconds)
    assert (summary.status, summary.stop_reason, summary.goal_reached) == ("success", "goal", True)
    assert summary.environment.backend == backend
    assert summary.goal_metric == "bleu"
    assert summary.final_score is not None
    assert summary.final_score >= SMOKE_GNMT.goal.target
    assert summary.history[0].score is not None
    assert summary.history[0].score < 5.0
    assert summary.bleu_signature is not None
    assert summary.bleu_signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert (summary.skipped_steps, summary.update_freq) == (0, 1)
    assert [r["steps"] for r in ranks] == [summary.steps, summary.steps]


@pytest.mark.multiproc
@pytest.mark.timeout(600)
def test_the_gnmt_smoke_task_trains_to_its_goal_under_the_runner_command(tmp_path: Path) -> None:
    """``mlbench-runner train`` on two gloo ranks runs a gnmt task through the translation kind (4a's rule: sentence
    batches, exponential warm-up and step decay, clipping, GNMT's beam search) from near 0 BLEU to the smoke goal."""
    config = make_config(get_task("synthetic-gnmt-smoke").spec.to_api(), tmp_path / "out", 2)
    check_gnmt_smoke(tmp_path / "out", launch_processes(config, 2, timeout=540), "gloo")


@pytest.mark.multiproc
@pytest.mark.timeout(600)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed on this machine")
def test_the_gnmt_smoke_task_trains_to_its_goal_with_two_mpi_ranks(tmp_path: Path) -> None:
    """The launcher pod's path: ``mlbench-runner launch`` starts two ranks under mpirun (backend mpi, mpi4py), and
    they train the gnmt smoke task to its goal as the gloo ranks do."""
    out = tmp_path / "out"
    out.mkdir()
    config = make_config(get_task("synthetic-gnmt-smoke").spec.to_api(), out, 2, backend="mpi")
    (out / "config.json").write_text(config.dump())
    hostfile = out / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    proc = subprocess.run(
        launcher_command(out / "config.json", hostfile, out / "termination-log", oversubscribe=True),
        # Both ranks share the 2 cores with the test's other work: Open MPI's idle ranks yield their core instead of
        # busy-polling it away from the peer they wait for (an MCA tuning knob; the collectives are the same).
        env=env(MASTER_PORT=str(free_port()), OMPI_MCA_mpi_yield_when_idle="1"),
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    check_gnmt_smoke(out, read_ranks(out, 2), "mpi")
