"""Registers the local-Kubernetes pytest plugin (fixtures + ``cluster`` marker)."""

pytest_plugins = ["tests.cluster.plugin"]
