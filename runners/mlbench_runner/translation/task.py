"""The translation task kind under ``mlbench-runner train``: a RunConfig of a transformer (4b) or gnmt (4a) task
in, rank 0's RunSummary out (summary.json), as :func:`mlbench_runner.rank.train.train` does for the other models.

The task's sections become a :class:`~.loop.TranslationRecipe` (:func:`recipe_for`); the data is the task's
``parallel-text`` folder, or the synthetic pair (NOT WMT) generated into this rank's output folder for format
``synthetic``. allreduce-sgd and centralized-adam run the loop's fused step (one all-reduce of the summed
gradients and the token count per optimizer step); powersgd, sign-sgd, sparsified-sgd, decentralized-sgd and ddp
run through the runner's algorithm registry (:mod:`~.algorithm_step`), their declared and counted bytes per step in
the summary's ``communication`` (ddp's declared only: its reducer talks to the process group itself).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from mlbench_api.config import RunConfig
from mlbench_api.dataspec import DatasetFormat, DatasetSpec
from mlbench_api.model import ModelSpec
from mlbench_api.results import RunSummary
from mlbench_api.schedule import Schedule
from mlbench_api.training import TRANSLATION_ALGORITHMS, Training
from mlbench_runner.algorithms import DistributedAlgorithm, make_algorithm
from mlbench_runner.comm import CountingCommunicator, close_quietly, make_communicator
from mlbench_runner.token_summary import finish, record_rank, start_rank, summary_of
from mlbench_runner.translation.algorithm_step import FUSED
from mlbench_runner.translation.corpus import write_synthetic
from mlbench_runner.translation.gnmt import GnmtShape
from mlbench_runner.translation.loop import StepDecay, TranslationRecipe, train_translation
from mlbench_runner.translation.transformer import TransformerShape
from mlbench_runner.world import World, detect_world

PRECISIONS = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": None}


def model_shape(model: ModelSpec, max_length: int) -> TransformerShape | GnmtShape:
    """The network's sizes: the task's, or the recipe's model (Transformer base, GNMT 4 x 1024) when unset."""
    if model.gnmt is not None:
        g = model.gnmt
        return GnmtShape(hidden=g.hidden, layers=g.layers, dropout=g.dropout, share_embedding=g.share_embedding)
    if model.name.value == "gnmt":
        return GnmtShape()
    positions = max(max_length + 1, 64)
    size = model.transformer
    if size is None:
        return TransformerShape(max_positions=positions)  # the base model
    return TransformerShape(
        d_model=size.d_model,
        heads=size.heads,
        ffn=size.ffn,
        encoder_layers=size.encoder_layers,
        decoder_layers=size.decoder_layers,
        dropout=size.dropout,
        norm_first=size.norm_first,
        max_positions=positions,
    )


def step_decay(training: Training) -> StepDecay | None:
    """4a's decays when the task's schedule is exponential-warmup-step-decay, else None (4b's inverse-sqrt)."""
    lr = training.learning_rate
    if lr.schedule is not Schedule.EXPONENTIAL_WARMUP_STEP_DECAY:
        return None
    return StepDecay(lr.decay_start, lr.decay_interval, lr.max_decays, lr.decay_factor)


def recipe_for(config: RunConfig) -> TranslationRecipe:
    """The loop's recipe from a translation task's sections (the run's goal target: full or light)."""
    task = config.task
    training = task.training
    extra = training.translation
    if extra is None:
        raise ValueError("training.translation: a translation task needs it")
    goal = task.goal.model_copy(update={"target": config.goal_target, "light_target": None})
    by_sentences = extra.sentences_per_step is not None
    return TranslationRecipe(
        shape=model_shape(task.model, max(extra.max_length, extra.test_max_length or 0)),
        global_tokens=extra.tokens_per_step,
        max_tokens=TranslationRecipe.max_tokens if by_sentences else training.batch_size_per_worker,
        sentences_per_step=extra.sentences_per_step,
        max_sentences=training.batch_size_per_worker if by_sentences else TranslationRecipe.max_sentences,
        peak_lr=config.lr.peak_lr,
        warmup=config.lr.warmup_steps,
        betas=(extra.adam_betas[0], extra.adam_betas[1]),
        eps=extra.adam_eps,
        smoothing=extra.label_smoothing,
        initial_scale=extra.loss_scaling.initial_scale,
        scale_factor=extra.loss_scaling.factor,
        scale_window=extra.loss_scaling.window,
        max_scale=extra.loss_scaling.max_scale or float("inf"),
        max_length=extra.max_length,
        test_max_length=extra.test_max_length,
        max_epochs=training.max_epochs,
        beam=extra.beam,
        length_penalty=extra.length_penalty,
        length_const=extra.length_norm_const,
        coverage=extra.coverage_penalty,
        decay=step_decay(training),
        clip_norm=extra.clip_norm,
        goal=goal,
    )


def data_folder(dataset: DatasetSpec, out: Path, rank: int) -> Path:
    """The parallel-text folder; format synthetic: the synthetic pair, generated into this rank's own folder."""
    if dataset.format is DatasetFormat.SYNTHETIC:
        assert dataset.synthetic is not None
        sizes = {"train": dataset.synthetic.train_samples, "test": dataset.synthetic.test_samples}
        return write_synthetic(out / "data" / f"rank-{rank}", sizes, seed=dataset.synthetic.seed)
    assert dataset.path is not None
    return Path(dataset.path)


def registry_algorithm(config: RunConfig, comm: CountingCommunicator) -> DistributedAlgorithm | None:
    """The run's algorithm from the runner's registry over ``comm``, or None for the loop's fused step."""
    name = config.algorithm.value
    if name in FUSED:
        return None
    return make_algorithm(name, comm, config.bucketing.value, config.algorithm_parameters, config.seed)


def run(config: RunConfig, world: World | None = None) -> RunSummary | None:
    """Train this rank of a translation task; rank 0 writes and returns the RunSummary."""
    started = time.perf_counter()
    world = world or detect_world()
    recipe = recipe_for(config)
    rank = start_rank(config, world, f"a {config.task.model.name.value}", TRANSLATION_ALGORITHMS)
    extra = config.task.training.translation
    autocast = PRECISIONS[extra.precision] if extra is not None and rank.device.type == "cuda" else None
    root = data_folder(config.task.dataset, rank.out, world.rank)
    rank.log.event("hyperparameters", task=config.task_name, recipe=str(recipe), data=str(root))
    comm = make_communicator(world, config.backend.value)
    algorithm = registry_algorithm(config, CountingCommunicator(comm))
    try:
        result = train_translation(
            root,
            recipe,
            comm,
            seed=config.seed,
            autocast=autocast,
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
        config,
        world,
        rank.device,
        result,
        time.perf_counter() - started,
        precision=extra.precision if extra is not None and rank.device.type == "cuda" else "fp32",
        bleu_signature=result.signature or None,
        skipped_steps=result.skipped_steps,
        update_freq=result.update_freq,
        communication=result.communication(),
    )
    return finish(rank, summary)
