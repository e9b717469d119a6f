"""The MLBench API: pydantic models for the ``mlbench.io/v1alpha1`` resources.

These models are the single definition of the API. The CRD YAML under ``crds/bases``
is generated from them (``mlbench crds``), the operator validates and renders from them,
and the runner reads its configuration through them. Nothing here imports torch or kopf.
"""

from mlbench_api.common import API_VERSION, GROUP, VERSION
from mlbench_api.config import RunConfig
from mlbench_api.results import RunSummary
from mlbench_api.run import BenchmarkRun, BenchmarkRunSpec
from mlbench_api.runstatus import BenchmarkRunStatus
from mlbench_api.sweep import BenchmarkSweep, BenchmarkSweepSpec, BenchmarkSweepStatus
from mlbench_api.task import BenchmarkTask, BenchmarkTaskSpec

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "BenchmarkRun",
    "BenchmarkRunSpec",
    "BenchmarkRunStatus",
    "BenchmarkSweep",
    "BenchmarkSweepSpec",
    "BenchmarkSweepStatus",
    "BenchmarkTask",
    "BenchmarkTaskSpec",
    "RunConfig",
    "RunSummary",
]
