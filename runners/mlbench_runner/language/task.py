"""The language-modelling task kind under ``mlbench-runner train``: a RunConfig of an awd-lstm task in, rank 0's
RunSummary out (summary.json), as :func:`mlbench_runner.rank.train.train` does for the other models.

The task's sections become a :class:`~.loop.LanguageRecipe` (:func:`recipe_for`); the data is the task's
``wikitext-tokens`` folder, or the synthetic corpus (NOT WikiText-2) generated into this rank's output folder for
format ``synthetic``. The run's algorithm comes from the runner's registry (``mlbench_api.training.
LANGUAGE_MODEL_ALGORITHMS``: allreduce-sgd, powersgd, sign-sgd, sparsified-sgd, decentralized-sgd), its declared and
counted bytes per step in the summary's ``communication``.
"""

from __future__ import annotations

import time
from pathlib import Path

from mlbench_api.config import RunConfig
from mlbench_api.dataspec import DatasetFormat, DatasetSpec
from mlbench_api.results import RunSummary
from mlbench_api.training import LANGUAGE_MODEL_ALGORITHMS
from mlbench_runner.algorithms import make_algorithm
from mlbench_runner.comm import CountingCommunicator, close_quietly, make_communicator
from mlbench_runner.language.corpus import read_corpus, write_synthetic
from mlbench_runner.language.loop import LanguageRecipe, train_language
from mlbench_runner.language.model import AwdLstmShape
from mlbench_runner.token_summary import finish, record_rank, start_rank, summary_of
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
    recipe = recipe_for(config)
    rank = start_rank(config, world, "an awd-lstm", LANGUAGE_MODEL_ALGORITHMS)
    root = data_folder(config.task.dataset, rank.out, world.rank)
    corpus = read_corpus(root)
    rank.log.event(
        "hyperparameters",
        task=config.task_name,
        recipe=str(recipe),
        data=str(root),
        vocabulary=len(corpus.vocab),
        unknown_words=corpus.unknown,
    )
    comm = make_communicator(world, config.backend.value)
    counting = CountingCommunicator(comm)
    algorithm = make_algorithm(
        config.algorithm.value, counting, config.bucketing.value, config.algorithm_parameters, config.seed
    )
    try:
        result = train_language(
            corpus,
            recipe,
            comm,
            seed=config.seed,
            device=rank.device,
            metrics=rank.metrics,
            log=rank.log,
            algorithm=algorithm,
        )
    finally:
        close_quietly(comm, orderly=True)
    record_rank(config, world, rank.out, result)
    if world.rank != 0:
        rank.log.close()
        return None
    summary = summary_of(
        config, world, rank.device, result, time.perf_counter() - started, communication=result.communication()
    )
    rank.log.event(
        "test_perplexity", perplexity=result.test_perplexity, averaging_from_epoch=result.averaging_from_epoch
    )
    return finish(rank, summary)
