"""One rank of a run (``mlbench-runner train`` / ``collectives``): the Trainer, its step, its state and checkpoints,
the models and task kernels, and the RunSummary it writes. The task kinds that train on tokens are in
``mlbench_runner.translation`` and ``mlbench_runner.language``."""
