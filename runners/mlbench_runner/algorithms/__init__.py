"""Distributed training algorithms, looked up by name (``RunConfig.algorithm``).

Importing the package registers every algorithm module; :func:`make_algorithm` builds one.
The contract (phases, declared bytes) is in :mod:`mlbench_runner.algorithms.base`.
"""

from mlbench_runner.algorithms import (
    allreduce,  # noqa: F401 - registers its algorithms
    compressed,  # noqa: F401 - registers sign-sgd and sparsified-sgd
    decentralized,  # noqa: F401 - registers decentralized-sgd
    powersgd,  # noqa: F401 - registers powersgd
)
from mlbench_runner.algorithms.base import (
    CommunicationPlan,
    DistributedAlgorithm,
    broadcast_state,
    make_algorithm,
    register,
    registered,
)

__all__ = [
    "CommunicationPlan",
    "DistributedAlgorithm",
    "broadcast_state",
    "make_algorithm",
    "register",
    "registered",
]
