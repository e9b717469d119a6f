"""What differs between task families: batch assembly, loss and correctness counting.

Both keep the whole dataset as tensors on the training device and assemble a batch by
indexing, so the hot loop has no per-sample Python.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from mlbench_runner.data import TensorDataset
from mlbench_runner.rank.augment import crop_flip, normalize

#: Dtypes whose logits the loss takes in fp32.
LOW_PRECISION = (torch.float16, torch.bfloat16)


class TaskKernel(ABC):
    """Batch, loss and accuracy for one task family."""

    n_train: int
    n_test: int

    @abstractmethod
    def train_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abstractmethod
    def test_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abstractmethod
    def synthetic_batch(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch shaped like :meth:`train_batch`'s, from no data (graph capture warms up on it)."""

    @abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor, model: nn.Module) -> torch.Tensor: ...

    @abstractmethod
    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Number of correct predictions in the batch (a 0-d tensor, no host sync)."""


class ImageClassification(TaskKernel):
    """CIFAR-10: uint8 images on the device, augmented and normalised per batch."""

    def __init__(
        self,
        data: TensorDataset,
        device: torch.device,
        dtype: torch.dtype,
        generator: torch.Generator,
        channels_last: bool = False,
    ) -> None:
        assert data.mean is not None
        assert data.std is not None
        self.x_train = torch.from_numpy(data.x_train.copy()).to(device)
        self.y_train = torch.from_numpy(data.y_train.astype("int64")).to(device)
        self.x_test = torch.from_numpy(data.x_test.copy()).to(device)
        self.y_test = torch.from_numpy(data.y_test.astype("int64")).to(device)
        self.mean = torch.tensor(data.mean, device=device, dtype=dtype).view(1, -1, 1, 1)
        self.std = torch.tensor(data.std, device=device, dtype=dtype).view(1, -1, 1, 1)
        self.dtype, self.generator = dtype, generator
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.n_train, self.n_test = len(self.y_train), len(self.y_test)

    def train_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = crop_flip(self.x_train[idx].to(self.dtype), self.generator)
        x = normalize(x, self.mean, self.std).contiguous(memory_format=self.memory_format)
        return x, self.y_train[idx]

    def test_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = normalize(self.x_test[idx].to(self.dtype), self.mean, self.std)
        return x.contiguous(memory_format=self.memory_format), self.y_test[idx]

    def synthetic_batch(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator(device=self.x_train.device).manual_seed(seed)
        shape = (n, *self.x_train.shape[1:])
        x = torch.randn(shape, device=self.x_train.device, dtype=self.dtype, generator=g)
        classes = int(self.y_train.max()) + 1 if self.n_train else 1
        y = torch.randint(0, classes, (n,), device=self.x_train.device, generator=g)
        return x.contiguous(memory_format=self.memory_format), y

    def loss(self, output: torch.Tensor, target: torch.Tensor, model: nn.Module) -> torch.Tensor:
        # bf16 autocast's logits: the loss in fp32. fp64 (the equivalence tests) must stay fp64.
        return F.cross_entropy(output.float() if output.dtype in LOW_PRECISION else output, target)

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (output.argmax(dim=1) == target).sum()


class LinearClassification(TaskKernel):
    """Logistic regression on +-1 labels with an L2 penalty lambda/2 ||w||^2 on the weights."""

    def __init__(self, data: TensorDataset, device: torch.device, dtype: torch.dtype, l2: float) -> None:
        self.x_train = torch.from_numpy(data.x_train.reshape(len(data.x_train), -1)).to(device, dtype)
        self.y_train = torch.from_numpy(data.y_train).to(device, dtype)
        self.x_test = torch.from_numpy(data.x_test.reshape(len(data.x_test), -1)).to(device, dtype)
        self.y_test = torch.from_numpy(data.y_test).to(device, dtype)
        self.l2 = l2
        self.n_train, self.n_test = len(self.y_train), len(self.y_test)

    def train_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x_train[idx], self.y_train[idx]

    def test_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x_test[idx], self.y_test[idx]

    def synthetic_batch(self, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator(device=self.x_train.device).manual_seed(seed)
        x = torch.randn((n, self.x_train.shape[1]), device=self.x_train.device, dtype=self.x_train.dtype, generator=g)
        y = torch.randint(0, 2, (n,), device=self.x_train.device, generator=g).to(self.y_train.dtype) * 2 - 1
        return x, y

    def loss(self, output: torch.Tensor, target: torch.Tensor, model: nn.Module) -> torch.Tensor:
        loss = F.softplus(-target * output).mean()
        if self.l2:
            weights = [p for name, p in model.named_parameters() if name.endswith("weight")]
            loss = loss + 0.5 * self.l2 * sum((w * w).sum() for w in weights)
        return loss

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((output >= 0) == (target > 0)).sum()
