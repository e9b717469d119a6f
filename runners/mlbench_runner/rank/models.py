"""The task models: CIFAR ResNets (He et al. 2015 / 2016) and L2 logistic regression.

Written out in full (no torchvision) so the closed division's exact architectures are
visible in one place: m1 uses option-A identity shortcuts (stride-2 subsampling plus
zero-padded channels, no extra parameters), m2 the pre-activation block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mlbench_api.model import ModelName, ModelSpec

RESNET_DEPTHS = (20, 32, 44, 56)


class ShortcutA(nn.Module):
    """Option A: subsample spatially, zero-pad the new channels (parameter free)."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.pad = planes - in_planes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.pad:
            half = self.pad // 2
            x = F.pad(x, (0, 0, 0, 0, half, self.pad - half))
        return x


class BasicBlock(nn.Module):
    """conv-bn-relu-conv-bn + shortcut, relu (He et al. 2015, CIFAR variant)."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = (
            ShortcutA(in_planes, planes, stride) if stride != 1 or in_planes != planes else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class PreActBlock(nn.Module):
    """bn-relu-conv-bn-relu-conv + shortcut (He et al. 2016, identity mappings).

    When the shape changes the shortcut is a 1x1 projection of the pre-activated input,
    as in the paper's CIFAR code.
    """

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.projection: nn.Module | None = (
            nn.Conv2d(in_planes, planes, 1, stride, bias=False) if stride != 1 or in_planes != planes else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = F.relu(self.bn1(x))
        shortcut = self.projection(pre) if self.projection is not None else x
        out = self.conv1(pre)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + shortcut


class CifarResNet(nn.Module):
    """3 stages of (depth-2)/6 blocks with 16/32/64 channels, global pool, linear."""

    def __init__(self, depth: int, version: str, num_classes: int = 10) -> None:
        super().__init__()
        if depth not in RESNET_DEPTHS:
            raise ValueError(f"model.depth: {depth} is not one of {RESNET_DEPTHS}")
        if version not in ("m1", "m2"):
            raise ValueError(f"model.version: {version!r} is not m1 or m2")
        self.preact = version == "m2"
        block = PreActBlock if self.preact else BasicBlock
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        # m2 normalises inside the first block instead, so it has no stem BN (no unused parameters).
        self.bn1: nn.Module = nn.Identity() if self.preact else nn.BatchNorm2d(16)
        layers: list[nn.Module] = []
        in_planes = 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(block(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.bn_final = nn.BatchNorm2d(64) if self.preact else nn.Identity()
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        if not self.preact:
            out = F.relu(self.bn1(out))
        out = self.layers(out)
        if self.preact:
            out = F.relu(self.bn_final(out))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


class LogisticRegression(nn.Module):
    """A linear score s = w.x (no intercept); labels are +-1, loss log(1 + exp(-y s)).

    No intercept: with task 2a's step sizes (alpha in the hundreds) an unregularised bias
    takes steps of that size and swamps w.x on unit-norm rows, predicting one class.
    """

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 1, bias=False)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).squeeze(1)


def build_model(spec: ModelSpec, features: int | None = None) -> nn.Module:
    """The task's model; ``features`` is the input width for logistic regression."""
    if spec.name is ModelName.RESNET:
        if spec.depth is None or spec.version is None:
            raise ValueError("model: a resnet model needs version and depth")
        return CifarResNet(spec.depth, spec.version)
    if features is None:
        raise ValueError("model: logistic regression needs the dataset's feature count")
    return LogisticRegression(features)
