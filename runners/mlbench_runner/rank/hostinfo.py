"""What this rank sees of its machine for the result's hardware record: the NVIDIA driver and CUDA versions.

The driver comes from the kernel module's ``/proc/driver/nvidia/version`` (present wherever the NVIDIA driver
is loaded and visible in the container: no NVML binding needed); None without one. CUDA is the version
PyTorch was built with (``torch.version.cuda``), None for a CPU build.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from mlbench_api.results import RankHardware

NVIDIA_VERSION = Path("/proc/driver/nvidia/version")
#: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023"
_DRIVER = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")


def parse_driver(text: str) -> str | None:
    """The driver version of ``/proc/driver/nvidia/version``'s text; None when it names none."""
    found = _DRIVER.search(text + " ")
    return found.group(1) if found else None


def nvidia_driver(path: Path = NVIDIA_VERSION) -> str | None:
    try:
        return parse_driver(path.read_text())
    except OSError:
        return None


def local_text(driver: str | None, cuda: str | None) -> str:
    """This rank's part of the all-gather (short: a few dozen bytes of the gather's 256)."""
    return f"{driver or ''}|{cuda or ''}"


def rank_hardware(nodes: list[str], texts: list[str]) -> list[RankHardware]:
    """Every rank's record from the gathered node names and :func:`local_text` parts, in rank order."""
    out = []
    for node, text in zip(nodes, texts, strict=True):
        driver, _, cuda = text.partition("|")
        out.append(RankHardware(node=node or None, driver=driver or None, cuda=cuda or None))
    return out


def this_rank() -> str:
    return local_text(nvidia_driver(), torch.version.cuda)
