"""MLBench test suite."""
