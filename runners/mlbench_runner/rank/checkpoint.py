"""Epoch-end checkpoints: one file, written by rank 0 atomically, read back by every rank after a restart.

A checkpoint holds every rank's own state (model, optimizer, the algorithm's error-feedback buffers and RNGs,
the augmentation generator, torch's RNGs), gathered to rank 0, and a JSON header: the run's identity, the
epoch and step it ends, the run clock's origin (wall-clock seconds since the epoch, so a restarted process
continues the clock from it: the lost time and the restart count, as MLPerf's time to accuracy wants), how
often the run has resumed, and what the result needs of the epochs before (history, scores).

The file: :data:`MAGIC`, one line of header JSON, then the body (each rank's ``torch.save`` blob, one after
the other). The header carries the body's length and SHA-256 and each blob's: a truncated or damaged file is
refused before anything of it is unpickled, and a blob is read with ``torch.load(weights_only=True)`` (tensors,
numbers, strings, containers: no code). A checkpoint of another run, task, world size or division is refused
too (:func:`check_identity`). Refused means the rank raises :class:`CheckpointRefused` (a ValueError: the
runner exits 2, InvalidInput, never restarted) naming the file and the reason; nothing is loaded and the file
is kept, so a mistake loses nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from mlbench_api import atomic
from mlbench_api.config import RunConfig
from mlbench_runner.comm import Communicator

MAGIC = b"MLBENCH-CHECKPOINT/1\n"
#: The checkpoint's file name in the run's checkpoint directory (RunConfig.checkpoint_dir).
FILE = "checkpoint.mlbc"


class CheckpointRefused(ValueError):
    """A checkpoint that must not be loaded; the message names the file and why."""


@dataclass(frozen=True)
class Identity:
    """What makes a checkpoint this run's own: any difference refuses it."""

    run: str
    namespace: str
    uid: str
    task_sha256: str
    world_size: int
    division: str


def task_digest(config: RunConfig) -> str:
    """SHA-256 of the effective task (overrides applied), canonical JSON: the same task, the same digest."""
    text = json.dumps(config.task.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def identity_of(config: RunConfig) -> Identity:
    return Identity(
        run=config.run_name,
        namespace=config.namespace,
        uid=config.run_uid,
        task_sha256=task_digest(config),
        world_size=config.world_size,
        division=config.task.division.value,
    )


def check_identity(found: Any, expected: Identity) -> None:
    """Refuse a checkpoint whose identity differs from this run's, naming every field that differs."""
    if not isinstance(found, dict):
        raise CheckpointRefused("it has no identity")
    wanted = asdict(expected)
    differ = [f"{k} {found.get(k)!r} (this run: {v!r})" for k, v in wanted.items() if found.get(k) != v]
    if differ:
        raise CheckpointRefused("it belongs to another run: " + "; ".join(differ))


def _sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(header: dict[str, Any], blobs: list[bytes]) -> bytes:
    """The file's bytes: the header gains the body's and each blob's length and digest."""
    body = b"".join(blobs)
    full = {
        **header,
        "blobs": [{"length": len(b), "sha256": _sha256(b)} for b in blobs],
        "bodyLength": len(body),
        "bodySha256": _sha256(body),
    }
    return MAGIC + json.dumps(full, sort_keys=True).encode() + b"\n" + body


def decode(data: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """Header and blobs of a checkpoint's bytes; :class:`CheckpointRefused` if it is not a whole, intact one."""
    if not data.startswith(MAGIC):
        raise CheckpointRefused("not an MLBench checkpoint (wrong magic)" if data else "empty file")
    head, newline, body = data[len(MAGIC) :].partition(b"\n")
    try:
        header = json.loads(head) if newline else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise CheckpointRefused("truncated or damaged header")
    if len(body) != header.get("bodyLength"):
        raise CheckpointRefused(f"truncated: body of {len(body)} bytes, the header says {header.get('bodyLength')}")
    if _sha256(body) != header.get("bodySha256"):
        raise CheckpointRefused("checksum mismatch: the body's SHA-256 is not the header's")
    blobs, offset = [], 0
    for entry in header.get("blobs", []):
        blobs.append(body[offset : offset + entry["length"]])
        offset += entry["length"]
    return header, blobs


def to_blob(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def from_blob(blob: bytes) -> dict[str, Any]:
    """A rank's state, loaded safely (``weights_only``: no code runs); maps tensors to the CPU."""
    state = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise CheckpointRefused("a rank's state is not a mapping")
    return state


def write(path: Path, data: bytes) -> None:
    """Atomically and durably: a temporary file, fsync, rename, fsync of the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(path, data, durable=True)


def gather_blobs(comm: Communicator, blob: bytes, device: torch.device) -> list[bytes]:
    """Every rank's ``blob`` on every rank, in rank order (two all-gathers: the lengths, then padded bytes)."""
    if comm.alone():
        return [blob]
    lengths = comm.all_gather(torch.tensor([len(blob)], dtype=torch.int64, device=device)).reshape(-1).tolist()
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else padded[:0]
    rows = comm.all_gather(padded).reshape(len(lengths), -1).cpu()
    return [rows[r, :n].numpy().tobytes() for r, n in enumerate(lengths)]


def share(comm: Communicator, data: bytes, device: torch.device) -> bytes:
    """Rank 0's ``data`` on every rank (empty: rank 0 has no checkpoint)."""
    if comm.alone():
        return data
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    comm.broadcast_(length, src=0)
    n = int(length.item())
    if n == 0:
        return b""
    buffer = torch.zeros(n, dtype=torch.uint8, device=device)
    if comm.rank == 0:
        buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    comm.broadcast_(buffer, src=0)
    return buffer.cpu().numpy().tobytes()


def read_shared(comm: Communicator, path: Path, device: torch.device) -> bytes:
    """The checkpoint file as rank 0 reads it, on every rank (only rank 0 needs the volume); empty if none."""
    data = b""
    if comm.rank == 0 and path.is_file():
        data = path.read_bytes()
    return share(comm, data, device)


def refused(path: Path, reason: str) -> CheckpointRefused:
    return CheckpointRefused(f"checkpoint {path} refused, not loaded: {reason} (remove it to start over)")


def open_checkpoint(data: bytes, path: Path, expected: Identity, rank: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header and this rank's state of a checkpoint's bytes, after every check; raises :func:`refused`."""
    try:
        header, blobs = decode(data)
        check_identity(header.get("identity"), expected)
        if len(blobs) != expected.world_size:
            raise CheckpointRefused(f"{len(blobs)} ranks' state for a world of {expected.world_size}")
        return header, from_blob(blobs[rank])
    except CheckpointRefused as exc:
        raise refused(path, str(exc)) from None
    except (KeyError, TypeError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise refused(path, f"unreadable: {type(exc).__name__}: {exc}") from None
