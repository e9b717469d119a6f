"""A real (Debian's) Prometheus for tests: started on a config, queried over its HTTP API, stopped."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.cluster import free_port


class Prometheus:
    """The HTTP API of a running Prometheus."""

    def __init__(self, url: str) -> None:
        self.url = url

    def get(self, path: str, **params: str) -> Any:
        """``data`` of a GET on the API (``/api/v1/...``)."""
        with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
            return json.load(r)["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at now: the result vector."""
        return list(self.get("/api/v1/query", query=expr)["result"])


@contextmanager
def running(config: dict[str, Any], workdir: Path, timeout: float = 60) -> Iterator[Prometheus]:
    """Prometheus on ``config`` (data and log in ``workdir``), ready to answer; skips without the binary."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (Debian: prometheus; make system-deps)")
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            prom = Prometheus(f"http://127.0.0.1:{port}")
            deadline = time.monotonic() + timeout
            while True:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                try:
                    prom.get("/api/v1/status/buildinfo")
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"Prometheus did not start in {timeout}s"
                    time.sleep(0.5)
            yield prom
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
