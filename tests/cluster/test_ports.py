"""The test cluster's port chooser: outside the kernel's ephemeral range (where an outgoing connection
could take a chosen port before its component binds it), and never the same port twice in one process
(a cluster's ports are all chosen before its components start). No cluster needed."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.cluster import cluster


def test_ports_are_below_the_ephemeral_range_and_distinct(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    port_range = tmp_path / "ip_local_port_range"
    port_range.write_text("40000\t40999\n")
    monkeypatch.setattr(cluster._WORLD, "EPHEMERAL_PORTS_FILE", port_range)
    ports = [cluster.free_port() for _ in range(30)]
    assert len(set(ports)) == len(ports)
    assert all(20000 <= port < 40000 for port in ports), ports


def test_a_port_handed_out_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only two candidates: the second call must take the other one although the first is still unbound."""
    first = cluster.free_port()
    monkeypatch.setattr(cluster._WORLD, "rendezvous_ports", lambda _ephemeral: range(first, first + 2))
    with socket.socket() as s:  # the chooser checks that the port is free: make sure first+1 is
        try:
            s.bind((cluster.HOST, first + 1))
        except OSError:
            pytest.skip(f"port {first + 1} is in use here")
    assert cluster.free_port() == first + 1
    with pytest.raises(RuntimeError, match="handed out"):
        cluster.free_port()
