"""The per-file manifest of fetched data: written by the fetcher into the marker, checked by every rank.

``[{"path": "a/b", "size": 123, "sha256": "..."}, {"path": "l", "link": "a/b"}]``, paths relative to the data
(``.`` when the data is one file), sorted. The fetch Job writes it after unpacking, from the files as they lie
on the volume; a rank compares the files it is about to read with it: sizes always (a ``stat`` per file), the
sha256 of every byte only when asked (``MLBENCH_DATASET_VERIFY=sha256``: each rank rereads the whole dataset
from the shared volume, which the fetcher has already hashed on its way in).

Only the standard library: the fetch Job must not depend on torch or numpy being importable.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlbench_api.datasets import MANIFEST_KEY, MARKER_SUFFIX

CHUNK = 1 << 20
#: ``MLBENCH_DATASET_VERIFY`` values: what a rank checks against the manifest before it loads.
SIZES = "sizes"
SHA256 = "sha256"


class ManifestError(ValueError):
    """The data does not match its marker or manifest; the message names the file and the difference."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _walk(root: Path) -> list[Path]:
    """Every file and symlink under ``root`` (folders are not listed: an empty one holds no data)."""
    out = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder)
        out += [base / d for d in dirs if (base / d).is_symlink()]
        out += [base / f for f in files]
    return sorted(out)


def build(root: Path, known_sha256: str | None = None) -> list[dict[str, Any]]:
    """The manifest of ``root`` (a file or a folder); ``known_sha256``: a single file's already-verified digest."""
    if root.is_file():
        return [{"path": ".", "size": root.stat().st_size, "sha256": known_sha256 or file_sha256(root)}]
    entries: list[dict[str, Any]] = []
    for path in _walk(root):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            entries.append({"path": rel, "link": os.readlink(path)})
        else:
            entries.append({"path": rel, "size": path.stat().st_size, "sha256": file_sha256(path)})
    return entries


def _entries(record: Mapping[str, Any], where: Path) -> list[Mapping[str, Any]]:
    files = record.get(MANIFEST_KEY)
    if not isinstance(files, list) or not files or not all(isinstance(e, dict) and "path" in e for e in files):
        raise ManifestError(f"the marker of {where} has no per-file manifest ({MANIFEST_KEY!r}): not a complete fetch")
    return files


def _inside(root: Path, rel: object) -> Path:
    """``root/rel`` for a manifest path; a path that leaves ``root`` is a forged manifest."""
    text = str(rel)
    if text.startswith("/") or ".." in text.split("/"):
        raise ManifestError(f"the manifest of {root} names {text!r}, outside the data")
    return root / text


def _check_one(root: Path, entry: Mapping[str, Any], hashes: bool) -> None:
    path = _inside(root, entry["path"])
    if "link" in entry:
        if not path.is_symlink() or os.readlink(path) != entry["link"]:
            raise ManifestError(f"{path}: not the symlink to {entry['link']!r} the manifest lists")
        return
    if path.is_symlink() or not path.is_file():
        raise ManifestError(f"{path}: missing (or not a regular file), but listed in the manifest")
    size = path.stat().st_size
    if size != entry.get("size"):
        raise ManifestError(f"{path}: {size} bytes, the manifest says {entry.get('size')}")
    if hashes:
        got = file_sha256(path)
        if got != entry.get("sha256"):
            raise ManifestError(f"{path}: sha256 {got}, the manifest says {entry.get('sha256')}")


def check(root: Path, record: Mapping[str, Any], hashes: bool = False) -> None:
    """``root`` holds exactly the manifest's files, at its sizes (and sha256s with ``hashes``); else ManifestError."""
    entries = _entries(record, root)
    for entry in entries:
        _check_one(root, entry, hashes)
    if root.is_dir() and not root.is_symlink():
        listed = {str(e["path"]) for e in entries}
        extra = [p.relative_to(root).as_posix() for p in _walk(root)]
        unlisted = sorted(set(extra) - listed)
        if unlisted:
            raise ManifestError(f"{root}: {len(unlisted)} file(s) the manifest does not list, e.g. {unlisted[0]!r}")


def marker_of(data: Path) -> Path:
    """The marker lives next to the data (not inside: a plain file has no inside)."""
    return data.with_name(data.name + MARKER_SUFFIX)


def summary(entries: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(files, bytes) of a manifest, for the fetcher's log line."""
    return len(entries), sum(int(e.get("size") or 0) for e in entries)
