"""The launcher's results collection: best source per file, fallbacks when worker 0 is gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlbench_api import bundle
from mlbench_runner.pod import collect
from tests import factories


def test_local_files_win(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(factories.summary().model_dump_json(by_alias=True))
    (tmp_path / "events.jsonl").write_text('{"event": "run_start", "rank": 0}\n')
    config = tmp_path / "config.json"
    config.write_text("{}")
    files = collect.gather(
        str(tmp_path), str(config), None, ssh_port=2222, ssh_key=None, seen_events=["ignored"], seen_summary=None
    )
    assert files == {
        bundle.SUMMARY: (tmp_path / "summary.json").read_bytes(),
        bundle.EVENTS: b'{"event": "run_start", "rank": 0}\n',
        bundle.CONFIG: b"{}",
    }


@pytest.mark.multiproc
def test_worker_0_unreachable_falls_back_to_what_mpirun_printed(tmp_path: Path) -> None:
    seen = ['{"event": "run_start", "rank": 0}', '{"event": "epoch_start", "rank": 0}']
    files = collect.gather(
        str(tmp_path / "nowhere"),
        str(tmp_path / "no-config.json"),
        "host.invalid",  # ssh fails fast: no such host
        ssh_port=1,
        ssh_key=None,
        seen_events=seen,
        seen_summary=factories.summary(),
    )
    assert files[bundle.EVENTS].decode().splitlines() == seen
    assert json.loads(files[bundle.SUMMARY])["run"] == "r1"
    assert bundle.CONFIG not in files
    line = collect.results_line(files)
    assert line is not None
    assert bundle.parse_line(line) is not None


def test_rank0_event_lines() -> None:
    assert collect.rank0_event('{"event": "epoch_stop", "rank": 0}') is not None
    assert collect.rank0_event('{"event": "run_error", "rank": 1, "level": "error"}') is None
    assert collect.rank0_event("plain text") is None
    assert collect.rank0_event('{"no": "event", "rank": 0}') is None
    assert collect.results_line({}) is None


def test_ssh_options_check_the_run_host_key() -> None:
    """With known_hosts (what the operator configures): strict checking against that file only, under
    the run's alias; timeouts; only the run's key. ssh takes an option's first value: none repeats."""
    opts = collect.ssh_options(2222, "/k/ssh-privatekey", "/k/known_hosts", "mlbench-workers.r.ns")
    pairs = [opts[i + 1] for i, o in enumerate(opts) if o == "-o"]
    assert opts[:2] == ["-p", "2222"]
    assert opts[-2:] == ["-i", "/k/ssh-privatekey"]
    assert {
        "StrictHostKeyChecking=yes",
        "UserKnownHostsFile=/k/known_hosts",
        "GlobalKnownHostsFile=/dev/null",
        "HostKeyAlias=mlbench-workers.r.ns",
        "CheckHostIP=no",
        "BatchMode=yes",
        "ConnectTimeout=10",
        "ServerAliveInterval=15",
        "ServerAliveCountMax=4",
        "IdentitiesOnly=yes",
    } <= set(pairs)
    assert len({p.split("=")[0] for p in pairs}) == len(pairs)
    assert "StrictHostKeyChecking=no" not in pairs
    assert "ConnectTimeout=5" in collect.ssh_options(2222, None, "/k/known_hosts", None, connect_timeout=5)


def test_ssh_options_without_known_hosts_do_not_check() -> None:
    """Local runs and hand-made hostfiles: nothing to check against, and nothing written to ~/.ssh."""
    opts = collect.ssh_options(2222, None)
    pairs = [opts[i + 1] for i, o in enumerate(opts) if o == "-o"]
    assert "StrictHostKeyChecking=no" in pairs
    assert "UserKnownHostsFile=/dev/null" in pairs
    assert not any(p.startswith("HostKeyAlias=") for p in pairs)
    assert "-i" not in opts
    assert "HostKeyAlias=a" not in collect.ssh_options(2222, None, None, "a")  # an alias alone checks nothing


@pytest.mark.parametrize(
    ("network", "delay"),
    [
        (None, 0),
        ({"bandwidthMbit": 100}, 0),
        ({"latencyMs": 5}, 1),  # 40 ms of round trips: a second more
        ({"latencyMs": 5000}, 40),  # 4 round trips, 2 delays each
        ({"latencyMs": 2000, "jitterMs": 500}, 20),
    ],
)
def test_the_ssh_connect_timeout_grows_with_the_emulated_latency(network: dict[str, float] | None, delay: int) -> None:
    """5 s of spec.network latency made every launch fail within the 10 s ConnectTimeout (banner exchange)."""
    from mlbench_api.network import NetworkConditions
    from mlbench_runner.pod import launch

    conditions = None if network is None else NetworkConditions.model_validate(network)
    assert collect.handshake_delay(conditions) == delay
    cmd = launch.mpirun_command(world_size=2, hostfile="/h", config_path="/c", ssh_delay=delay)
    assert f"ConnectTimeout={10 + delay}" in " ".join(cmd)
