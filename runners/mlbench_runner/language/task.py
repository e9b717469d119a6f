"""The language-modelling task kind under ``mlbench-runner train``: a RunConfig of an awd-lstm task in, rank 0's
RunSummary out (summary.json), as :func:`mlbench_runner.train.train` does for the other models.

The task's sections become a :class:`~.loop.LanguageRecipe` (:func:`recipe_for`); the data is the task's
``wikitext-tokens`` folder, or the synthetic corpus (NOT WikiText-2) generated into this rank's output folder for
format ``synthetic``. Only the reference algorithm runs it (allreduce-sgd: one all-reduce of the gradient per step).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from mlbench_api import atomic
from mlbench_api.config import RunConfig
from mlbench_api.results import RunSummary
from mlbench_api.task import Algorithm, DatasetFormat, DatasetSpec
from mlbench_runner.comm import close_quietly, make_communicator
from mlbench_runner.events import EventLog
from mlbench_runner.language.corpus import read_corpus, write_synthetic
from mlbench_runner.language.loop import LanguageRecipe, train_language
from mlbench_runner.language.model import AwdLstmShape
from mlbench_runner.metrics import RunnerMetrics
from mlbench_runner.token_summary import stop_of, summary_of
from mlbench_runner.world import World, detect_world


def recipe_for(config: RunConfig) -> LanguageRecipe:
    """The loop's recipe from an awd-lstm task's sections (the run's goal target: full or light)."""
    task = config.task
    training, size = task.training, task.model.awd_lstm
    extra = training.language_model
    if extra is None:
        raise ValueError("training.languageModel: an awd-lstm task needs it")
    shape = AwdLstmShape()
    if size is not None:
        shape = AwdLstmShape(
            embedding=size.embedding,
            hidden=size.hidden,
            layers=size.layers,
            dropout=size.dropout,
            dropout_hidden=size.dropout_hidden,
            dropout_input=size.dropout_input,
            dropout_embedding=size.dropout_embedding,
            weight_drop=size.weight_drop,
            tie_weights=size.tie_weights,
        )
    rate = training.learning_rate.value
    if rate is None:
        raise ValueError("learningRate.value: an awd-lstm task needs eta (the constant schedule's value)")
    return LanguageRecipe(
        shape=shape,
        batch=training.batch_size_per_worker,
        bptt=extra.bptt,
        random_length=extra.random_length,
        short_probability=extra.short_probability,
        length_std=extra.length_std,
        min_length=extra.min_length,
        rate=rate,
        warmup_epochs_per_worker=extra.warmup_epochs_per_worker,
        weight_decay=training.weight_decay,
        clip=extra.clip_norm,
        alpha=extra.ar_alpha,
        beta=extra.tar_beta,
        nonmono=extra.nonmono,
        eval_batch=extra.eval_batch_size,
        max_epochs=training.max_epochs,
        evaluate_on=extra.evaluate_on,
        goal=task.goal.model_copy(update={"target": config.goal_target, "light_target": None}),
    )


def data_folder(dataset: DatasetSpec, out: Path, rank: int) -> Path:
    """The token-file folder; format synthetic: the synthetic corpus, generated into this rank's own folder
    (trainSamples lines of training text, testSamples lines of validation and of test text)."""
    if dataset.format is DatasetFormat.SYNTHETIC:
        assert dataset.synthetic is not None
        s = dataset.synthetic
        lines = {"train": s.train_samples, "valid": s.test_samples, "test": s.test_samples}
        return write_synthetic(out / "data" / f"rank-{rank}", lines, seed=s.seed)
    assert dataset.path is not None
    return Path(dataset.path)


def run(config: RunConfig, world: World | None = None) -> RunSummary | None:
    """Train this rank of an awd-lstm task; rank 0 writes and returns the RunSummary."""
    started = time.perf_counter()
    world = world or detect_world()
    if config.algorithm is not Algorithm.ALLREDUCE_SGD:
        raise ValueError(f"algorithm: an awd-lstm task runs allreduce-sgd only, not {config.algorithm.value}")
    use_gpu = config.backend.value == "nccl" or (config.gpus_per_worker > 0 and torch.cuda.is_available())
    device = torch.device("cuda", world.local_rank % torch.cuda.device_count()) if use_gpu else torch.device("cpu")
    recipe = recipe_for(config)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = EventLog(world.rank, out)
    metrics = RunnerMetrics(
        config.run_name,
        config.task_name,
        config.backend.value,
        world_size=world.size,
        algorithm=config.algorithm.value,
        rank=world.rank,
    )
    metrics.serve(config.metrics_port + world.local_rank if config.metrics_port else 0)
    log.event("run_start", run=config.run_name, task=config.task_name, rank_count=world.size, device=str(device))
    root = data_folder(config.task.dataset, out, world.rank)
    corpus = read_corpus(root)
    log.event(
        "hyperparameters",
        task=config.task_name,
        recipe=str(recipe),
        data=str(root),
        vocabulary=len(corpus.vocab),
        unknown_words=corpus.unknown,
    )
    comm = make_communicator(world, config.backend.value)
    try:
        result = train_language(corpus, recipe, comm, seed=config.seed, device=device, metrics=metrics, log=log)
    finally:
        close_quietly(comm, orderly=True)
    _status, reason = stop_of(config, result)
    record = {"rank": world.rank, "steps": result.steps, "stop_reason": reason, "epochs_completed": len(result.history)}
    (out / "ranks").mkdir(exist_ok=True)
    (out / "ranks" / f"rank-{world.rank}.json").write_text(json.dumps(record))  # as the Trainer's RankRecord
    if world.rank != 0:
        log.close()
        return None
    summary = summary_of(config, world, device, result, time.perf_counter() - started)
    atomic.write_text(out / "summary.json", summary.model_dump_json(by_alias=True, indent=2))
    log.event("test_perplexity", perplexity=result.test_perplexity, averaging_from_epoch=result.averaging_from_epoch)
    log.event("run_stop", status=summary.status, stop_reason=summary.stop_reason, goal_reached=summary.goal_reached)
    log.event("run_summary", summary=json.loads(summary.termination_message()))
    log.close()
    return summary
