"""The BenchmarkRun wing: admission, status, policies, lifecycle, outcome, results, executor, handlers."""
