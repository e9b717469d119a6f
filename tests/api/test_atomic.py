"""Result files are written whole or not at all (mlbench_api.atomic)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from mlbench_api import atomic


@pytest.mark.parametrize("before", [None, "old summary"])
def test_write_text_replaces_the_file_whole(tmp_path: Path, before: str | None) -> None:
    target = tmp_path / "summary.json"
    if before is not None:
        target.write_text(before)
    atomic.write_text(target, "new summary")
    assert target.read_text() == "new summary"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "summary.json"
    target.write_text("old summary")

    def killed(src: str, dst: str) -> None:
        raise KeyboardInterrupt  # the rank stopped between writing and renaming

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        atomic.write_text(target, "new summary")
    assert target.read_text() == "old summary"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_the_file_is_readable_by_all_like_a_plain_write(tmp_path: Path) -> None:
    """Not mkstemp's 0600: the launcher or a sidecar may read the results as another user."""
    target = tmp_path / "summary.json"
    atomic.write_text(target, "{}")
    assert target.stat().st_mode & 0o777 == atomic.MODE


def test_a_full_disk_raises_enospc_and_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dataset fetcher turns ENOSPC into VolumeFull: the error must come through as it is, and the
    temporary file (named ``.<name>.tmp-*``, what tests/runner/test_fetch.py looks for) must be gone."""
    target = tmp_path / "x.mlbench-dataset.json"
    target.write_text("old marker")
    seen: list[str] = []

    def full(src: str, dst: str) -> None:
        seen.append(Path(src).name)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space left") as info:
        atomic.write_text(target, "new marker")
    assert info.value.errno == errno.ENOSPC
    assert seen[0].startswith(f".{target.name}.tmp-")
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
