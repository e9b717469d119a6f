"""A run's results bundle: how a cluster run's full results travel from the launcher to a ConfigMap.

Rank 0 writes ``summary.json`` (with the per-epoch history) and ``events.jsonl`` to worker 0's
emptyDir, which the run's cleanup deletes. The launcher therefore collects them (with the
effective ``config.json``) when ``mpirun`` ends and prints them as its *last* log line, a
``run_results`` event whose files are gzip-compressed and base64-encoded. The operator reads that
line from the launcher's log (``pods/log``: read-only, no write access for runner pods) and keeps
the files in a ConfigMap ``<run>-results`` owned by the run, so deleting the run deletes them and
``mlbench results <namespace>/<run>`` can download them.

Why a ConfigMap and not a results volume: it works on every cluster (no ReadWriteMany storage, no
StorageClass), it is readable with plain ``kubectl``, and owner references garbage-collect it. Its
cost is the 1 MiB object limit, hence :data:`BUDGET_BYTES` and :func:`fit`: a long run's event log
loses its ``train_progress`` lines first, then its middle; the summary is never cut.
"""

from __future__ import annotations

import base64
import binascii
import functools
import gzip
import hashlib
import json
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mlbench_api.results import RunSummary
from mlbench_api.runstatus import MAX_RESULT_FILES

EVENT = "run_results"
SCHEMA = "mlbench.io/results/v1"
SUMMARY = "summary.json"
EVENTS = "events.jsonl"
CONFIG = "config.json"
#: The files a bundle may carry, in the order they are written.
FILES = (SUMMARY, EVENTS, CONFIG)
#: Compressed bytes of all files together: a ConfigMap holds at most 1 MiB, metadata included.
BUDGET_BYTES = 900 * 1024
#: Files larger than this together once decompressed are refused (a corrupt or hostile log line: 65 KB of
#: gzip inflate to 64 MiB). The operator first *counts* the decompressed bytes of every file, keeping none,
#: and decompresses for keeping only a bundle within this; :func:`fit` keeps the launcher's bundle within it.
MAX_TOTAL_BYTES = 16 * 1024 * 1024
#: ... and so is any one file larger than this.
MAX_FILE_BYTES = MAX_TOTAL_BYTES
#: Decompressed bytes produced (and dropped) per step while counting.
_COUNT_CHUNK = 64 * 1024
#: A results line longer than this cannot be the launcher's (its files fit :data:`BUDGET_BYTES` compressed,
#: then base64): refused before it is decoded.
MAX_LINE_CHARS = BUDGET_BYTES * 4 // 3 + 64 * 1024
#: Key suffix of each file in the ConfigMap's ``binaryData``.
GZ = ".gz"
#: A file's key: a ConfigMap key (no path), gzip suffix.
_FILE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}\.gz$")
#: Files a bundle may carry: what ``status.results`` may list (:data:`mlbench_api.runstatus.MAX_RESULT_FILES`).
MAX_FILES = MAX_RESULT_FILES
#: Events that say the least per byte; dropped first when the event log is over budget.
CHATTY_EVENTS = ("train_progress",)


class BundleError(ValueError):
    """A results line or ConfigMap that cannot be read; the message says which part."""


@dataclass(frozen=True)
class Bundle:
    """The files of one run (raw bytes, uncompressed) and what was cut to fit the budget."""

    files: dict[str, bytes]
    truncated: tuple[str, ...] = field(default=())

    @property
    def summary(self) -> RunSummary | None:
        raw = self.files.get(SUMMARY)
        return RunSummary.model_validate_json(raw) if raw is not None else None

    @functools.cached_property
    def _gzipped(self) -> dict[str, bytes]:
        return {name + GZ: gzip.compress(data, mtime=0) for name, data in self.files.items()}

    def compressed(self) -> dict[str, bytes]:
        """``name.gz`` -> gzip bytes (``mtime=0``: the same files give the same bytes); compressed once."""
        return dict(self._gzipped)

    def compressed_size(self) -> int:
        return sum(len(v) for v in self._gzipped.values())


def _event_name(line: bytes) -> str | None:
    try:
        data = json.loads(line)
    except ValueError:
        return None
    return data.get("event") if isinstance(data, dict) else None


def _head_and_tail(lines: list[bytes], keep: int) -> bytes:
    """``keep`` of ``lines``: the first and the last half, with a line saying how many were left out."""
    if keep < len(lines):
        head, tail = keep - keep // 2, keep // 2
        marker = json.dumps({"event": "events_omitted", "count": len(lines) - keep}).encode()
        lines = [*lines[:head], marker, *(lines[-tail:] if tail else [])]
    return b"".join(ln + b"\n" for ln in lines)


def fit(files: Mapping[str, bytes], budget: int = BUDGET_BYTES) -> Bundle:
    """The bundle of ``files`` within ``budget`` compressed bytes, cutting only the event log:
    its chatty events first, then (halving until it fits) its middle.

    Raises :class:`BundleError` when even the other files alone do not fit.
    """
    bundle = Bundle(dict(files))
    if _fits(bundle, budget):
        return bundle
    lines = bundle.files.get(EVENTS, b"").splitlines()
    kept = [ln for ln in lines if _event_name(ln) not in CHATTY_EVENTS]
    keep = len(kept)
    while keep > 0:
        candidate = Bundle({**bundle.files, EVENTS: _head_and_tail(kept, keep)}, truncated=(EVENTS,))
        if _fits(candidate, budget):
            return candidate
        keep //= 2
    rest = {k: v for k, v in bundle.files.items() if k != EVENTS}
    candidate = Bundle(rest, truncated=(EVENTS,))
    if _fits(candidate, budget):
        return candidate
    raise BundleError(f"the summary and config alone need {candidate.compressed_size()} compressed bytes (> {budget})")


def _fits(bundle: Bundle, budget: int) -> bool:
    """Within ``budget`` compressed and :data:`MAX_TOTAL_BYTES` decompressed (what the operator accepts)."""
    return sum(map(len, bundle.files.values())) <= MAX_TOTAL_BYTES and bundle.compressed_size() <= budget


def results_line(bundle: Bundle) -> str:
    """The launcher's last log line: one JSON object, files gzip+base64 encoded."""
    payload = {
        "event": EVENT,
        "schema": SCHEMA,
        "truncated": list(bundle.truncated),
        "files": {name: base64.b64encode(data).decode() for name, data in bundle.compressed().items()},
    }
    return json.dumps(payload, separators=(",", ":"))


def inflated_size(name: str, data: bytes, limit: int) -> int:
    """The decompressed size of gzip ``data`` (every member), counted ``_COUNT_CHUNK`` bytes at a time and
    kept nowhere; a :class:`BundleError` as soon as it passes ``limit`` (a gzip bomb costs one chunk of memory
    and the time to inflate ``limit`` bytes, not its size)."""
    total, rest = 0, data
    try:
        while rest:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # one gzip member
            while not inflater.eof:
                out = inflater.decompress(rest, _COUNT_CHUNK)
                rest = inflater.unconsumed_tail
                if not out and not rest and not inflater.eof:
                    raise BundleError(f"{name}: not gzip data: truncated")
                total += len(out)
                if total > limit:
                    raise BundleError(f"{name}: more than {limit} bytes once decompressed (the results allow {limit})")
            rest = inflater.unused_data
    except zlib.error as exc:
        raise BundleError(f"{name}: not gzip data: {exc}") from exc
    return total


def _gunzip(name: str, data: bytes) -> bytes:
    """The file, once :func:`inflated_size` has counted it within the limits."""
    try:
        return gzip.decompress(data)
    except (OSError, EOFError) as exc:
        raise BundleError(f"{name}: not gzip data: {exc}") from exc


def from_compressed(
    compressed: Mapping[str, bytes], truncated: Iterable[str] = (), limit: int = MAX_TOTAL_BYTES
) -> Bundle:
    """A bundle from ``name.gz`` -> gzip bytes (a results line's or a ConfigMap's), at most ``limit`` bytes
    once decompressed (all files together, and each; the operator's ``MLBENCH_RESULTS_MAX_BYTES``).

    Checks only what keeping the files needs (safe names, gzip, size), not their content: a
    runner newer than the operator may add a summary field or a file, and its results are kept.
    :attr:`Bundle.summary` parses the summary when a reader needs it.
    """
    if len(compressed) > MAX_FILES:
        raise BundleError(f"{len(compressed)} files (at most {MAX_FILES})")
    for key in compressed:
        if not _FILE_KEY.match(key):
            raise BundleError(f"unexpected file {key!r} (expected names like {', '.join(f + GZ for f in FILES)})")
    total = 0
    for key, data in compressed.items():  # counted first, all of them, keeping nothing
        total += inflated_size(key, data, min(limit, MAX_FILE_BYTES))
        if total > limit:
            raise BundleError(f"the results files are more than {limit} bytes together once decompressed")
    files = {key.removesuffix(GZ): _gunzip(key, data) for key, data in compressed.items()}
    return Bundle(files, tuple(truncated))


def parse_line(line: str, limit: int = MAX_TOTAL_BYTES) -> Bundle | None:
    """The bundle of a ``run_results`` line; None for any other line; BundleError when it is malformed or its
    files are more than ``limit`` bytes decompressed (:func:`from_compressed`)."""
    text = line.strip()
    if not text.startswith("{") or f'"{EVENT}"' not in text[:40]:
        return None
    if len(text) > MAX_LINE_CHARS:
        raise BundleError(f"the {EVENT} line has {len(text)} characters (at most {MAX_LINE_CHARS})")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BundleError(f"the {EVENT} line is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("event") != EVENT:
        return None
    if data.get("schema") != SCHEMA:
        raise BundleError(f"unknown results schema {data.get('schema')!r} (expected {SCHEMA})")
    files = data.get("files")
    if not isinstance(files, dict):
        raise BundleError("the results line has no files")
    try:
        compressed = {str(k): base64.b64decode(str(v), validate=True) for k, v in files.items()}
    except binascii.Error as exc:
        raise BundleError(f"a results file is not base64: {exc}") from exc
    found = from_compressed(compressed, limit=limit)
    return Bundle(found.files, _truncated(data.get("truncated"), found.files))


def _truncated(value: object, files: Mapping[str, bytes]) -> tuple[str, ...]:
    """A results line's ``truncated``: distinct names of its files, or of a known file :func:`fit` dropped
    whole, at most :data:`MAX_FILES` (the CRD's bound on ``status.results.truncated``). Anything else would
    reach a status write that the API server refuses after the run has finished."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise BundleError("truncated: must be a list of file names")
    if len(value) > MAX_FILES:
        raise BundleError(f"truncated: {len(value)} entries (at most {MAX_FILES})")
    if len(set(value)) != len(value):
        raise BundleError("truncated: a file is named twice")
    unknown = sorted(set(value) - set(files) - set(FILES))
    if unknown:
        raise BundleError(f"truncated: {unknown[0]!r} is not a file of the results")
    return tuple(value)


def from_log(text: str, limit: int = MAX_TOTAL_BYTES) -> Bundle | None:
    """The last ``run_results`` bundle in a launcher's log; None when the log has none."""
    for line in reversed(text.splitlines()):
        bundle = parse_line(line, limit)
        if bundle is not None:
            return bundle
    return None


def digests(found: Bundle) -> dict[str, str]:
    """The SHA-256 (hex) of each file as kept (uncompressed), by name: ``status.results.sha256``."""
    return {name: hashlib.sha256(data).hexdigest() for name, data in sorted(found.files.items())}


def check_digests(found: Bundle, expected: Mapping[str, str]) -> None:
    """:class:`BundleError` naming the first file whose SHA-256 is not the one recorded (or that is missing or
    not recorded): files edited after the operator kept them are not the run's results."""
    have = digests(found)
    for name in sorted(set(have) | set(expected)):
        if name not in expected:
            raise BundleError(f"{name}: not a file the operator kept (no digest recorded for it)")
        if name not in have:
            raise BundleError(f"{name}: recorded by the operator but missing")
        if have[name] != expected[name]:
            raise BundleError(f"{name}: its SHA-256 is {have[name]}, the operator recorded {expected[name]}")
