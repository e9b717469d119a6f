"""MLBench reference runners: PyTorch training for the closed-division tasks.

``mlbench-runner train`` trains one rank from a :class:`mlbench_api.RunConfig`;
``mlbench-runner launch`` is the launcher pod's entrypoint (mpirun over the hostfile);
:mod:`mlbench_runner.tools.local` is ``mlbench run --local`` and :mod:`mlbench_runner.tools.report`
is ``mlbench results``.
"""

__version__ = "0.1.0"
