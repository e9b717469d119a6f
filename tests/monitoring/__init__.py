"""Monitoring manifests (Prometheus Operator objects) and their alert rules."""
