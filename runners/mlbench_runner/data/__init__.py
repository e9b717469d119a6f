"""Datasets as whole tensors: loaded once, cached, then indexed by batch (no DataLoader)."""

from mlbench_runner.data.base import TensorDataset
from mlbench_runner.data.loader import load_dataset

__all__ = ["TensorDataset", "load_dataset"]
