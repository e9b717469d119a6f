"""A task's ``spec.training``: the optimizer, the distributed algorithms, and the hyperparameters of each kind of
training (image classification, translation, language model).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from mlbench_api.common import (
    ApiModel,
    cel,
)
from mlbench_api.schedule import LearningRate


class Optimizer(StrEnum):
    SGD = "sgd"
    ADAM = "adam"


class Algorithm(StrEnum):
    """How the ranks agree on the model (``BenchmarkRun.spec.algorithm``; the runner's registry)."""

    ALLREDUCE_SGD = "allreduce-sgd"  #: the reference: flatten, all-reduce, average, step
    DDP = "ddp"  #: torch DistributedDataParallel, the comparison baseline
    CENTRALIZED_ADAM = "centralized-adam"  #: averaged gradients (all-reduce), then Adam on every rank
    POWERSGD = "powersgd"  #: rank-r PowerSGD compression with error feedback (Vogels et al. 2019)
    DECENTRALIZED_SGD = "decentralized-sgd"  #: local step, then gossip averaging with the topology's neighbours
    SIGN_SGD = "sign-sgd"  #: majority vote of the gradients' signs (all-reduce of int8 signs)
    SPARSIFIED_SGD = "sparsified-sgd"  #: top-k or random-k of the gradient with error-feedback memory


#: The algorithms that compute the reference's update (synchronous averaged-gradient SGD): what a closed task
#: allows unless it lists others in ``algorithms``.
REFERENCE_ALGORITHMS = (Algorithm.ALLREDUCE_SGD, Algorithm.DDP)
#: The algorithms the translation kind's loop runs (models transformer and gnmt; docs/tasks-translation.md): its own
#: fused all-reduce of the accumulated gradient with the token count (allreduce-sgd; centralized-adam is the same
#: step, the recipe's Adam on the averaged gradient), the compressed ones, gossip and ddp (its reducer held off by
#: ``no_sync()`` on all micro-batches of a step but the last) through the runner's registry.
TRANSLATION_ALGORITHMS = (
    Algorithm.ALLREDUCE_SGD,
    Algorithm.CENTRALIZED_ADAM,
    Algorithm.POWERSGD,
    Algorithm.SIGN_SGD,
    Algorithm.SPARSIFIED_SGD,
    Algorithm.DECENTRALIZED_SGD,
    Algorithm.DDP,
)
#: The algorithms the language-modelling kind's loop (awd-lstm; docs/algorithms.md) runs through the runner's registry,
#: each under the recipe's clip and switch to averaged SGD. Not centralized-adam (NT-ASGD is a rule of SGD, and the
#: recipe's rate, 30, is SGD's), not ddp (the loop trains the model itself, unwrapped).
LANGUAGE_MODEL_ALGORITHMS = (
    Algorithm.ALLREDUCE_SGD,
    Algorithm.POWERSGD,
    Algorithm.SIGN_SGD,
    Algorithm.SPARSIFIED_SGD,
    Algorithm.DECENTRALIZED_SGD,
)


class LossScaling(ApiModel):
    """The dynamic loss scale of mixed-precision training (tasks 4a and 4b of the page): the loss is multiplied by the
    scale before backward and the gradient divided by it; a non-finite gradient skips the step and divides the scale
    by factor, ``window`` clean steps in a row multiply it by factor (up to maxScale)."""

    initial_scale: Annotated[float, Field(gt=0)] = 128.0
    """The first scale (default 2**7)."""
    factor: Annotated[float, Field(gt=1)] = 2.0
    """Down- and up-scaling factor (default 2)."""
    window: Annotated[int, Field(ge=1, le=10_000_000)] = 2000
    """Clean steps before the scale grows (default 2000)."""
    max_scale: Annotated[float, Field(gt=0)] | None = None
    """The largest scale (task 4a: 2**13); unset: no bound (task 4b)."""


class TranslationTraining(ApiModel):
    """What a translation task (model transformer or gnmt) adds to its training: batches by tokens or sentences,
    Adam's constants, label smoothing, loss scaling, gradient clipping, and the decoding its BLEU is measured with."""

    tokens_per_step: Annotated[int, Field(ge=1, le=1 << 30)] = 1 << 17
    """b: target tokens per optimizer step over all ranks (default 2**17). Each rank accumulates
    update_freq = max(1, b / (batchSizePerWorker * world size)) micro-batches of at most
    b / (world size * update_freq) tokens, and all-reduces once per optimizer step."""
    sentences_per_step: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    """Set: b counts sentence pairs instead of tokens (task 4a: 2048), batchSizePerWorker is bs_max in sentences,
    and the gradient is the mean per sentence; tokensPerStep is then unused."""
    adam_betas: Annotated[list[Annotated[float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)] = Field(
        default_factory=lambda: [0.9, 0.98]
    )
    """Adam's beta1 and beta2 (default 0.9, 0.98)."""
    adam_eps: Annotated[float, Field(gt=0, le=1)] = 1e-9
    """Adam's epsilon (default 1e-9)."""
    label_smoothing: Annotated[float, Field(ge=0, lt=1)] = 0.1
    """Label smoothing of the cross-entropy (default 0.1)."""
    precision: Literal["fp32", "fp16", "bf16"] = "fp16"
    """Mixed precision on a GPU: fp16 (default, with lossScaling), bf16, or fp32; a CPU trains in fp32."""
    loss_scaling: LossScaling = Field(default_factory=LossScaling)
    """The dynamic loss scale (also applied in fp32 and bf16, where it rarely matters)."""
    max_length: Annotated[int, Field(ge=2, le=4096)] = 80
    """Longest sentence in tokens (end of sentence included), in training and, unless testMaxLength, test; longer
    pairs are dropped."""
    test_max_length: Annotated[int, Field(ge=2, le=4096)] | None = None
    """Longest test sentence and hypothesis in tokens (task 4a: 150); unset: maxLength."""
    clip_norm: Annotated[float, Field(gt=0, le=1e6)] | None = None
    """The averaged gradient's global norm is clipped at this (task 4a: 5.0); unset: no clipping."""
    beam: Annotated[int, Field(ge=1, le=64)] = 4
    """Beam size of the decoding that BLEU is measured on (default 4)."""
    length_penalty: Annotated[float, Field(ge=0, le=10)] = 0.6
    """Hypothesis score = log-probability / length**lengthPenalty (default 0.6), or with lengthNormConst c GNMT's
    log-probability / ((c + length) / (c + 1))**lengthPenalty."""
    length_norm_const: Annotated[float, Field(ge=0, le=1000)] | None = None
    """GNMT's length normalisation constant c (task 4a: 5); unset: length**lengthPenalty (fairseq's)."""
    coverage_penalty: Annotated[float, Field(ge=0, le=10)] = 0.0
    """GNMT's coverage penalty weight (task 4a: 0.1): adds weight * sum over source tokens of log(min(1, attention
    received)); needs a model that reports its attention (gnmt). Default 0."""


class LanguageModelTraining(ApiModel):
    """What a language-modelling task (model awd-lstm) adds to its training: task 3a's BPTT windows, clipping,
    activation regularisation and the switch to averaged SGD. batchSizePerWorker counts streams, learningRate.value
    is eta for a window of bptt tokens, weightDecay is SGD's."""

    bptt: Annotated[int, Field(ge=2, le=10000)] = 70
    """Back-propagation-through-time window (default 70); also the evaluation's window."""
    random_length: bool = True
    """Draw each training window's length: X ~ Bernoulli(shortProbability), max(minLength, Normal(bptt / (1 + X),
    lengthStd)) (default true); false: every window is bptt."""
    short_probability: Annotated[float, Field(ge=0, le=1)] = 0.05
    """P(X = 1), a half-length window (default 0.05)."""
    length_std: Annotated[float, Field(ge=0, le=1000)] = 5.0
    """Standard deviation of the window length (default 5)."""
    min_length: Annotated[int, Field(ge=1, le=10000)] = 5
    """Shortest drawn window (default 5)."""
    warmup_epochs_per_worker: Annotated[float, Field(ge=0, le=1000)] = 3.0
    """The rate rises linearly from eta to eta * sqrt(world size) over world size * this many epochs (default 3)."""
    clip_norm: Annotated[float, Field(gt=0, le=1e6)] = 0.25
    """The averaged gradient's norm is clipped at this (default 0.25)."""
    ar_alpha: Annotated[float, Field(ge=0, le=1e3)] = 2.0
    """Activation regularisation: alpha * mean(h^2) of the last layer's dropped output (default 2)."""
    tar_beta: Annotated[float, Field(ge=0, le=1e3)] = 1.0
    """Temporal activation regularisation: beta * mean((h_t - h_t-1)^2) of its raw output (default 1)."""
    nonmono: Annotated[int, Field(ge=1, le=10000)] = 5
    """Averaged SGD starts when the validation loss has not improved for this many epochs (default 5)."""
    eval_batch_size: Annotated[int, Field(ge=1, le=65536)] = 10
    """Streams the evaluated split is cut into, over all ranks (default 10)."""
    evaluate_on: Literal["valid", "test"] = "valid"
    """The split the goal is measured on after every epoch (default valid, the page's); the test split's perplexity of
    the final model is reported either way."""


class Training(ApiModel):
    """The optimisation recipe, per worker."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.learningRate.warmupEpochs) || self.learningRate.warmupEpochs < self.maxEpochs",
                    "learningRate.warmupEpochs must be less than maxEpochs",
                    ".learningRate.warmupEpochs",
                ),
                cel(
                    "!has(self.learningRate.milestones) || self.learningRate.milestones.all(m, m < self.maxEpochs)",
                    "learningRate.milestones must be less than maxEpochs",
                    ".learningRate.milestones",
                ),
                cel(
                    "!self.nesterov || self.momentum > 0.0",
                    "nesterov needs momentum > 0",
                    ".nesterov",
                ),
            ]
        }
    )

    optimizer: Optimizer = Optimizer.SGD
    """sgd (default) or adam."""
    batch_size_per_worker: Annotated[int, Field(ge=1, le=65536)]
    """Samples per optimizer step on each process (rank); the global batch is this times the world size. A
    transformer: the most target tokens in one micro-batch (bs_max; translation.tokensPerStep is the batch)."""
    learning_rate: LearningRate
    """The learning-rate schedule."""
    momentum: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """SGD momentum, 0 (default, none) up to but excluding 1."""
    nesterov: bool = False
    """Use Nesterov momentum (sgd; needs momentum > 0)."""
    weight_decay: Annotated[float, Field(ge=0, le=1)] = 0.0
    """The optimizer's weight_decay (torch's: decay*w added to the gradient), default 0."""
    l2_regularization: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.0, description="lambda/2 * ||w||^2 added to the loss (2a); distinct from weightDecay."
    )
    max_epochs: Annotated[int, Field(ge=1, le=100_000)]
    """Training stops after this many epochs (passes over the training data) if the goal was not met earlier."""
    translation: TranslationTraining | None = None
    """A transformer's (required there, refused elsewhere): token batches, Adam's constants, label smoothing,
    loss scaling and decoding."""
    language_model: LanguageModelTraining | None = None
    """An awd-lstm's (required there, refused elsewhere): BPTT windows, clipping, AR/TAR, the averaged-SGD switch."""

    @model_validator(mode="after")
    def _rules(self) -> Training:
        lr = self.learning_rate
        if lr.warmup_epochs >= self.max_epochs:
            raise ValueError("learningRate.warmupEpochs: must be less than maxEpochs")
        if any(m >= self.max_epochs for m in lr.milestones):
            raise ValueError("learningRate.milestones: must be less than maxEpochs")
        if self.nesterov and self.momentum <= 0:
            raise ValueError("nesterov: needs momentum > 0")
        return self
