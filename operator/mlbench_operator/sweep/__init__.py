"""The BenchmarkSweep wing: the plan (pure) and the handlers."""
