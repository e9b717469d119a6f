"""Registers the pytest plugins: the local Kubernetes (fixtures + ``cluster`` marker), the test layers, the
skips that fail in CI (tests/skips.py), and pytester (tests/test_layers.py runs small test files through the
layers' guard)."""

pytest_plugins = ["tests.cluster.plugin", "tests.layers", "tests.skips", "pytester"]
