"""The fenced status write both daemons use (:func:`mlbench_operator.runtime.write_fenced`, issue 33): written at
the version the pass planned from, a 409 reads the object again and raises. No cluster needed."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from mlbench_operator import runtime
from mlbench_operator.kube import ApiError
from mlbench_operator.logs import get_logger


class _Kube:
    """An object at ``version`` whose status writes are refused (409) unless made at that version."""

    def __init__(self, version: str, status: Mapping[str, Any] | None = None) -> None:
        self.version = version
        self.status = dict(status or {"message": "the new leader's"})
        self.reads: list[tuple[str, str]] = []

    async def run(self, fn: Any, *args: Any) -> Any:
        return fn(*args)

    def write(self, namespace: str, name: str, changes: dict[str, Any], resource_version: str) -> str:
        if resource_version != self.version:
            raise ApiError(409, "PATCH", "/status", '{"reason": "Conflict"}')
        self.version = str(int(self.version) + 1)
        return self.version

    def read(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads.append((namespace, name))
        return {"metadata": {"resourceVersion": self.version}, "status": self.status}


@dataclass
class _Owner:
    kube: Any
    version: str
    status: Mapping[str, Any] = field(default_factory=lambda: {"phase": "Running"})
    reread: Mapping[str, Any] | None = None
    namespace: str = "team"
    name: str = "r1"
    log: Any = field(default_factory=get_logger)

    @property
    def body(self) -> Mapping[str, Any]:
        return {"metadata": {"resourceVersion": self.version}, "status": self.status}


def test_a_write_at_the_current_version_lands_and_moves_the_fence() -> None:
    kube = _Kube("5")
    owner = _Owner(kube, "5")
    asyncio.run(runtime.write_fenced(owner, kube.write, kube.read, {"phase": "Succeeded"}))
    assert owner.version == "6"
    assert owner.reread is None
    assert kube.reads == []


def test_a_stale_write_is_refused_and_the_object_read_again() -> None:
    kube = _Kube("9")
    owner = _Owner(kube, "3")
    with pytest.raises(runtime.StatusConflict, match=r"resourceVersion 3 was refused \(409\): read again"):
        asyncio.run(runtime.write_fenced(owner, kube.write, kube.read, {"phase": "Succeeded"}))
    assert kube.reads == [("team", "r1")]
    assert (owner.version, owner.reread) == ("9", {"message": "the new leader's"})
    asyncio.run(runtime.write_fenced(owner, kube.write, kube.read, {"phase": "Succeeded"}))  # the next pass lands
    assert owner.version == "10"


def test_a_version_moved_by_metadata_only_is_written_at_again() -> None:
    """kopf's finalizer patch the watch has not delivered yet: the status read is the one planned from, so the
    write is made once more at the version read, without a conflict (no reconcile error on a new run)."""
    kube = _Kube("4", status={"phase": "Running"})
    owner = _Owner(kube, "3")
    asyncio.run(runtime.write_fenced(owner, kube.write, kube.read, {"phase": "Succeeded"}))
    assert kube.reads == [("team", "r1")]
    assert (owner.version, owner.reread) == ("5", None)


def test_a_second_refusal_after_the_refence_is_a_conflict() -> None:
    """The version read moved again before the second write (another writer, or kopf once more): no third try;
    the object is read again and the pass ends in a StatusConflict, its reread kept for the next pass."""

    class _Busy(_Kube):
        def read(self, namespace: str, name: str) -> dict[str, Any]:
            body = super().read(namespace, name)
            self.version = str(int(self.version) + 1)  # moved again right after this read
            return body

    kube = _Busy("4", status={"phase": "Running"})
    owner = _Owner(kube, "3")
    with pytest.raises(runtime.StatusConflict, match=r"resourceVersion 4 was refused \(409\): read again"):
        asyncio.run(runtime.write_fenced(owner, kube.write, kube.read, {"phase": "Succeeded"}))
    assert len(kube.reads) == 2
    assert (owner.version, owner.reread) == ("5", {"phase": "Running"})


def test_an_empty_change_writes_nothing() -> None:
    kube = _Kube("9")
    owner = _Owner(kube, "3")
    asyncio.run(runtime.write_fenced(owner, kube.write, kube.read, {}))
    assert (owner.version, kube.reads) == ("3", [])
