"""A task's ``spec.model``: which network, at which size (ResNet, Transformer, GNMT, AWD-LSTM)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from mlbench_api.common import (
    ApiModel,
    cel,
)


class ModelName(StrEnum):
    RESNET = "resnet"
    LOGISTIC_REGRESSION = "logistic-regression"
    TRANSFORMER = "transformer"
    GNMT = "gnmt"
    AWD_LSTM = "awd-lstm"


class TransformerSize(ApiModel):
    """A Transformer's sizes (fairseq's transformer_wmt_en_de by default: task 4b's base model)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [cel("self.dModel % self.heads == 0", "dModel must divide by heads", ".heads")]
        }
    )

    d_model: Annotated[int, Field(ge=2, le=16384)] = 512
    """Embedding and layer width (default 512)."""
    heads: Annotated[int, Field(ge=1, le=256)] = 8
    """Attention heads (default 8); must divide dModel."""
    ffn: Annotated[int, Field(ge=1, le=65536)] = 2048
    """Feed-forward inner width (default 2048)."""
    encoder_layers: Annotated[int, Field(ge=1, le=64)] = 6
    """Encoder layers (default 6)."""
    decoder_layers: Annotated[int, Field(ge=1, le=64)] = 6
    """Decoder layers (default 6)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.1
    """Dropout after embeddings, attention and feed-forward blocks (default 0.1)."""
    norm_first: bool = False
    """Pre-norm layers (fairseq's --*-normalize-before); default false: post-norm, as the base model."""

    @model_validator(mode="after")
    def _rules(self) -> TransformerSize:
        if self.d_model % self.heads:
            raise ValueError("heads: dModel must divide by heads")
        return self


class GnmtSize(ApiModel):
    """GNMT's sizes (the reference's task 4a model by default: 4 + 4 layers, 1024 wide, dropout 0.2, shared
    embedding)."""

    hidden: Annotated[int, Field(ge=1, le=16384)] = 1024
    """Width of the embedding, every LSTM layer and the attention (default 1024)."""
    layers: Annotated[int, Field(ge=2, le=64)] = 4
    """LSTM layers in the encoder (the first bidirectional) and in the decoder (default 4)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Dropout before every LSTM layer (default 0.2)."""
    share_embedding: bool = True
    """One embedding for source and target over the joined vocabulary (default true, the reference's)."""


class AwdLstmSize(ApiModel):
    """An AWD-LSTM's sizes and dropouts (Merity et al. 2017; the reference's WikiText-2 model by default: task 3a)."""

    embedding: Annotated[int, Field(ge=1, le=65536)] = 400
    """Embedding width (default 400); with tied weights also the last LSTM layer's width."""
    hidden: Annotated[int, Field(ge=1, le=65536)] = 1150
    """Width of the LSTM layers but the last (default 1150)."""
    layers: Annotated[int, Field(ge=1, le=16)] = 3
    """Stacked one-layer LSTMs (default 3)."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.4
    """Locked dropout on the last layer's output (default 0.4)."""
    dropout_hidden: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Locked dropout between LSTM layers (default 0.2, the reference's WikiText-2 setting)."""
    dropout_input: Annotated[float, Field(ge=0, lt=1)] = 0.65
    """Locked dropout on the embedded input (default 0.65)."""
    dropout_embedding: Annotated[float, Field(ge=0, lt=1)] = 0.1
    """Dropout of whole words of the embedding (default 0.1)."""
    weight_drop: Annotated[float, Field(ge=0, lt=1)] = 0.5
    """DropConnect on every layer's hidden-to-hidden weights (default 0.5)."""
    tie_weights: bool = True
    """Decoder weights tied to the embedding (default true)."""


class ModelSpec(ApiModel):
    """The network. ResNet m1 = He et al. 2015, m2 = pre-activation (He et al. 2016)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.name != 'resnet' || (has(self.version) && has(self.depth))",
                    "a resnet model needs version and depth",
                    ".depth",
                ),
                cel(
                    "self.name == 'transformer' || !has(self.transformer)",
                    "transformer sizes are for a transformer model only",
                    ".transformer",
                ),
                cel(
                    "self.name == 'gnmt' || !has(self.gnmt)",
                    "gnmt sizes are for a gnmt model only",
                    ".gnmt",
                ),
                cel(
                    "self.name == 'awd-lstm' || !has(self.awdLstm)",
                    "awdLstm sizes are for an awd-lstm model only",
                    ".awdLstm",
                ),
            ]
        }
    )

    name: ModelName
    """The architecture: resnet (CIFAR-style ResNet, task 1a), logistic-regression (task 2a), transformer (task 4b),
    gnmt (task 4a) or awd-lstm (task 3a)."""
    version: Literal["m1", "m2"] | None = None
    """ResNet variant: m1 = original (He et al. 2015), m2 = pre-activation (He et al. 2016). Required for resnet."""
    depth: Literal[20, 32, 44, 56] | None = None
    """ResNet depth in layers (20, 32, 44 or 56). Required for resnet; ignored by logistic-regression."""
    transformer: TransformerSize | None = None
    """transformer only: the sizes; unset: the base model (6+6 layers, 512 wide, 8 heads, FFN 2048)."""
    gnmt: GnmtSize | None = None
    """gnmt only: the sizes; unset: the reference's model (4 + 4 layers, 1024 wide, dropout 0.2)."""
    awd_lstm: AwdLstmSize | None = None
    """awd-lstm only: the sizes and dropouts; unset: the reference's WikiText-2 model (400/1150, 3 layers)."""

    @model_validator(mode="after")
    def _rules(self) -> ModelSpec:
        if self.name is ModelName.RESNET and (self.version is None or self.depth is None):
            raise ValueError("depth: a resnet model needs version and depth")
        if self.name is not ModelName.TRANSFORMER and self.transformer is not None:
            raise ValueError("transformer: transformer sizes are for a transformer model only")
        if self.name is not ModelName.GNMT and self.gnmt is not None:
            raise ValueError("gnmt: gnmt sizes are for a gnmt model only")
        if self.name is not ModelName.AWD_LSTM and self.awd_lstm is not None:
            raise ValueError("awdLstm: awdLstm sizes are for an awd-lstm model only")
        return self
