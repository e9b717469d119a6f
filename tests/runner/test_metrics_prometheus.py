"""The metrics endpoint, scraped by a real Prometheus server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from mlbench_runner.metrics import METRIC_NAMES
from mlbench_runner.world import free_port

from .helpers import env, logreg_task, make_config

PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


@pytest.mark.multiproc
@pytest.mark.timeout(240)
@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not installed on this machine")
def test_prometheus_scrapes_runner_metrics(tmp_path: Path) -> None:
    metrics_port, prom_port = free_port(), free_port()
    task = logreg_task(batch=10, epochs=3, train=600, features=20)
    config = make_config(task, tmp_path / "out", 1).model_copy(update={"metrics_port": metrics_port})
    (tmp_path / "config.json").write_text(config.dump())
    runner = subprocess.Popen(
        [sys.executable, "-m", "mlbench_runner.cli", "train", "--config", str(tmp_path / "config.json")],
        env=env(MLBENCH_METRICS_LINGER_SECONDS="60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: mlbench\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    prom = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 150
        exposition = ""
        while time.monotonic() < deadline and not (tmp_path / "out" / "summary.json").exists():
            assert runner.poll() is None, runner.stdout.read() if runner.stdout else ""
            time.sleep(0.5)
        exposition = _get(f"http://127.0.0.1:{metrics_port}/metrics")
        for name in METRIC_NAMES:
            assert name in exposition, f"{name} missing from the endpoint"
        query = "mlbench_samples_total"
        result: list = []
        while time.monotonic() < deadline:
            try:
                body = json.loads(_get(f"http://127.0.0.1:{prom_port}/api/v1/query?query=" + urllib.parse.quote(query)))
                result = body["data"]["result"]
                if result and float(result[0]["value"][1]) >= 3 * 60 * 10:
                    break
            except OSError:
                pass
            time.sleep(1)
        assert result, "Prometheus never stored mlbench_samples_total"
        assert float(result[0]["value"][1]) == 3 * 60 * 10  # 3 epochs x 60 steps x batch 10
        info = json.loads(_get(f"http://127.0.0.1:{prom_port}/api/v1/query?query=mlbench_run_info"))["data"]["result"]
        assert info[0]["metric"]["backend"] == "gloo"
        assert info[0]["metric"]["world_size"] == "1"
        phases = json.loads(_get(f"http://127.0.0.1:{prom_port}/api/v1/query?query=mlbench_phase_seconds_total"))
        assert {r["metric"]["phase"] for r in phases["data"]["result"]} >= {"forward", "backward", "communication"}
    finally:
        prom.terminate()
        runner.terminate()
        prom.wait(10)
        runner.wait(10)


@pytest.mark.parametrize(
    ("faster", "slower"),
    [
        pytest.param(1.68e-3, 1.96e-3, id="the GPU paths: compiled and fast step of task 1a on an H100"),
        pytest.param(0.4e-3, 0.6e-3, id="logistic regression on one rank"),
        pytest.param(0.10, 0.14, id="ResNet-20 on CPU"),
    ],
)
def test_the_step_times_of_the_measured_paths_fall_in_different_buckets(faster: float, slower: float) -> None:
    """The dashboard's p50/p90/p99 are interpolated within a bucket: two step times in one bucket draw the same
    curve, however different they are."""
    import bisect

    from mlbench_runner.metrics import STEP_BUCKETS

    assert STEP_BUCKETS[0] <= 1e-4
    assert STEP_BUCKETS[-1] >= 10.0
    assert bisect.bisect_left(STEP_BUCKETS, faster) != bisect.bisect_left(STEP_BUCKETS, slower)
