"""Datasets as whole tensors: loaded once, cached, then indexed by batch (no DataLoader)."""

from mlbench_runner.data.base import TensorDataset, load_dataset

__all__ = ["TensorDataset", "load_dataset"]
