"""The BenchmarkRun wing: admission, status, policies (by family), lifecycle, outcome, results, executor, handlers."""
