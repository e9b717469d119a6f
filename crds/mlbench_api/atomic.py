"""Write a file whole or not at all.

A reader (``mlbench results``, ``mlbench sweep --resume``, the launcher collecting results) may look
at a result file at any moment, and a rank may be killed while writing it: a half-written
``summary.json`` would read as a broken run. Writing to a temporary file in the same folder (same
file system, so the rename is atomic) and renaming it over the target means a reader sees the old
file or the new one, never part of one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: The mode of a written file: readable by all, as ``write_text`` would leave it under the usual umask
#: (mkstemp's 0600 would hide the results from a launcher or a sidecar running as another user).
MODE = 0o644


def write_text(path: Path, text: str) -> None:
    """``path.write_text(text)`` (UTF-8), atomically: see :func:`write_bytes`."""
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes, *, durable: bool = False) -> None:
    """``path.write_bytes(data)``, atomically: a temporary file next to it, then ``os.replace``; the
    temporary file is removed on any failure (a full disk's ENOSPC too), and the error raised.

    The temporary file is named ``.<name>.tmp-<random>``: hidden, and what the dataset fetcher's tests
    look for as a leftover (``.tmp-``), as they did when it wrote its marker by hand.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:  # on disk before the rename makes it visible (a checkpoint must survive a node's crash)
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, MODE)
        os.replace(tmp, path)
        if durable:
            _fsync_dir(path.parent)  # the rename itself
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
