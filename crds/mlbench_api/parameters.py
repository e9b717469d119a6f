"""A run's ``spec.algorithmParameters``: the knobs of the compressing and decentralized algorithms, each owned by
one algorithm, with its default there.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from mlbench_api.common import (
    ApiModel,
)
from mlbench_api.training import Algorithm


class Topology(StrEnum):
    """Who a decentralized rank averages with after each local step."""

    RING = "ring"  #: its two ring neighbours (rank +- 1 mod k), weights 1/3 each (1/2 each for 2 ranks)
    COMPLETE = "complete"  #: every rank (an all-reduce of the parameters: exact averaging)


class Selection(StrEnum):
    """Which gradient entries sparsified SGD sends."""

    TOP_K = "top-k"  #: the k largest in magnitude (after adding the error memory); values and indices all-gathered
    RANDOM_K = "random-k"  #: k indices drawn from a generator seeded alike on every rank; values all-reduced


#: The algorithms each AlgorithmParameters field belongs to, and its default there.
PARAMETER_DEFAULTS: dict[str, tuple[Algorithm, object]] = {
    "rank": (Algorithm.POWERSGD, 2),
    "warmStart": (Algorithm.POWERSGD, True),
    "topology": (Algorithm.DECENTRALIZED_SGD, Topology.RING),
    "density": (Algorithm.SPARSIFIED_SGD, 0.01),
    "selection": (Algorithm.SPARSIFIED_SGD, Selection.TOP_K),
}


class AlgorithmParameters(ApiModel):
    """Knobs of the compressing and decentralized algorithms; each field belongs to one algorithm only."""

    rank: Annotated[int, Field(ge=1, le=64)] | None = None
    """powersgd: rank r of the low-rank approximation P Q^T of each gradient matrix (1 to 64, default 2)."""
    warm_start: bool | None = None
    """powersgd: start each step's power iteration from the previous step's Q (default true), as the paper does."""
    topology: Topology | None = None
    """decentralized-sgd: ring (default; gossip with the two ring neighbours) or complete (average with every rank)."""
    density: Annotated[float, Field(gt=0, le=1)] | None = None
    """sparsified-sgd: fraction of each step's gradient entries sent, k = ceil(density x parameters) (default 0.01)."""
    selection: Selection | None = None
    """sparsified-sgd: top-k (default) or random-k."""

    def misplaced(self, *algorithms: Algorithm) -> list[str]:
        """Wire names of the fields set that belong to none of ``algorithms``."""
        given = self.model_dump(by_alias=True, exclude_none=True)
        return [name for name in PARAMETER_DEFAULTS if name in given and PARAMETER_DEFAULTS[name][0] not in algorithms]

    def for_algorithm(self, algorithm: Algorithm) -> AlgorithmParameters:
        """These parameters with ``algorithm``'s defaults filled in (the others stay unset)."""
        data = self.model_dump(by_alias=True, exclude_none=True)
        for name, (owner, default) in PARAMETER_DEFAULTS.items():
            if owner is algorithm:
                data.setdefault(name, default)
        return AlgorithmParameters.model_validate(data)
