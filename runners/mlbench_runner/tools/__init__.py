"""The user's programs on a workstation, dispatched by the ``mlbench`` CLI: local runs (``mlbench run --local``),
results and their report (``mlbench results``: scoring, tables, plots, mllog), sweeps (``mlbench sweep --local``),
and the benchmarks' recipes."""
