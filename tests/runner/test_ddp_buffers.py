"""DDP broadcasts rank 0's buffers before each forward only for models whose buffers move in training."""

from __future__ import annotations

import pytest
from torch import nn

from mlbench_runner.algorithms.allreduce import has_moving_buffers
from mlbench_runner.translation.transformer import Transformer, TransformerShape

SMALL = TransformerShape(d_model=16, heads=2, ffn=32, encoder_layers=1, decoder_layers=1, max_positions=32)


@pytest.mark.parametrize(
    ("model", "moves"),
    [
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), True),  # ResNet's running statistics
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)), False),
        (Transformer(11, 0, SMALL), False),  # its positional table is a constant buffer
        (nn.LSTM(4, 4), False),
    ],
)
def test_only_moving_buffers_are_broadcast(model: nn.Module, moves: bool) -> None:
    assert has_moving_buffers(model) is moves
