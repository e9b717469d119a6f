"""``mlbench-runner fetch-dataset``: download a dataset into the dataset volume, verified, once.

Runs in the operator's fetch Job with the namespace's dataset PVC mounted read-write at /data:

* content-addressed: the operator names the destination after the source's checksum
  (``/data/sha256-<digest>[-x<strip>]``, :func:`mlbench_api.datasets.store_name`), so no path a task or
  run chooses names another dataset's files;
* idempotent: a marker file next to the data (``<dest>.mlbench-dataset.json``) records the sha256
  it was verified against and a per-file manifest (:mod:`mlbench_runner.manifest`: path, size, sha256, written after
  unpacking); when both match what is on the volume, the fetch is a no-op (N runs, one download);
* streaming: the body is hashed while it is written to a temporary file in the destination's
  folder (same filesystem), then renamed into place, so readers never see half a file and a
  checksum mismatch leaves nothing behind;
* safe unpacking: members with absolute names, ``..`` segments, links pointing outside the
  destination, devices or FIFOs are refused before anything is extracted;
* failures are classified (:class:`~mlbench_api.datasets.FetchReason`), written as JSON to the
  termination log and reflected in the exit code, which the Job's podFailurePolicy reads.

Only the standard library: the fetch Job must not depend on torch being importable.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from mlbench_api import atomic
from mlbench_api.contract import TERMINATION_LOG
from mlbench_api.datasets import (
    EXIT_FOR_REASON,
    MANIFEST_KEY,
    STORE_PREFIX,
    FetchFailure,
    FetchReason,
    redact_url,
    redact_urls,
    store_name,
)
from mlbench_runner import manifest, stopping

CHUNK = 1 << 20
TIMEOUT_SECONDS = 60.0


class FetchError(Exception):
    """A classified failure: the reason becomes the run's condition reason; the message names URLs without
    userinfo, query string or fragment (:func:`mlbench_api.datasets.redact_urls`)."""

    def __init__(self, reason: FetchReason, message: str) -> None:
        message = redact_urls(message)
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class FetchRequest:
    """What to fetch and where; ``volume`` names the PVC in messages (VolumeFull)."""

    url: str
    sha256: str
    dest: Path
    unpack: bool = False
    strip_components: int = 0
    volume: str = ""

    @property
    def marker(self) -> Path:
        return marker_path(self.dest)

    def marker_record(self) -> dict[str, object]:
        """What the marker stores; a different sha256, unpack or strip means "fetch again"."""
        return {"sha256": self.sha256, "unpack": self.unpack, "stripComponents": self.strip_components}


def marker_path(dest: Path) -> Path:
    """The marker lives next to the data (not inside: a plain file has no inside)."""
    return manifest.marker_of(dest)


def already_there(req: FetchRequest) -> bool:
    """The data is complete and was verified against this sha256 (the marker is written last), and the files
    are still the manifest's (a marker is not trusted alone: files changed or removed since mean fetch again)."""
    try:
        record = json.loads(req.marker.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict):
        return False
    wanted = req.marker_record()
    if not all(record.get(k) == v for k, v in wanted.items()) or not req.dest.exists():
        return False
    try:
        manifest.check(req.dest, record)
    except (manifest.ManifestError, OSError) as exc:
        print(json.dumps({"event": "dataset_manifest_mismatch", "dest": str(req.dest), "error": str(exc)}), flush=True)
        return False
    return True


# -- download ----------------------------------------------------------------------------------------------
def _describe_url_error(url: str, exc: BaseException) -> str:
    """One line naming the URL and the real cause (DNS, refused, timeout, HTTP status)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"GET {url}: HTTP {exc.code} {exc.reason}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, socket.gaierror):
        return f"GET {url}: cannot resolve host ({reason.strerror or reason})"
    if isinstance(reason, ConnectionRefusedError):
        return f"GET {url}: connection refused"
    if isinstance(reason, TimeoutError):
        return f"GET {url}: timed out"
    return f"GET {url}: {reason}"


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http and https only (urllib also follows them to ftp)."""

    def redirect_request(  # noqa: PLR0917 - urllib's signature
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise urllib.error.URLError(f"redirected to {newurl}: only http and https URLs are fetched")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpOnlyRedirects)


@contextlib.contextmanager
def _open(url: str, timeout: float) -> Iterator[http.client.HTTPResponse]:
    """The response body; any network or HTTP failure is a SourceUnreachable FetchError."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):  # urllib would also read file:// URLs
        raise FetchError(FetchReason.SOURCE_UNREACHABLE, f"GET {url}: only http and https URLs are fetched")
    request = urllib.request.Request(url, headers={"User-Agent": "mlbench-runner fetch-dataset"})
    try:
        resp = _OPENER.open(request, timeout=timeout)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise FetchError(FetchReason.SOURCE_UNREACHABLE, _describe_url_error(url, exc)) from exc
    with resp:
        yield resp


def _volume_full(req: FetchRequest, what: Path) -> FetchError:
    where = f"volume {req.volume}" if req.volume else f"the volume holding {req.dest.parent}"
    return FetchError(FetchReason.VOLUME_FULL, f"no space left on {where} while writing {what} (ENOSPC)")


def cut_short(content_length: str | None, size: int) -> str | None:
    """Why a body of ``size`` bytes is incomplete (the server announced more), or None.

    ``http.client`` ends a body whose connection closed early with an empty read, not an error, so a cut
    download would otherwise reach the checksum and be reported as a permanent ``ChecksumMismatch``.
    """
    try:
        announced = int(content_length) if content_length is not None else None
    except ValueError:
        return None
    if announced is None or size >= announced:
        return None
    return f"the connection closed after {size} of {announced} bytes"


def download(req: FetchRequest, into: Path, timeout: float = TIMEOUT_SECONDS) -> None:
    """Stream ``req.url`` into ``into`` (a temporary file) and verify its sha256 on the way."""
    digest = hashlib.sha256()
    size = 0
    with _open(req.url, timeout) as body, into.open("wb") as out:
        while True:
            try:
                chunk = body.read(CHUNK)
            except (OSError, http.client.HTTPException) as exc:  # a reset, timeout or truncation mid-body
                raise FetchError(FetchReason.SOURCE_UNREACHABLE, _describe_url_error(req.url, exc)) from exc
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            try:
                out.write(chunk)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise _volume_full(req, req.dest) from exc
                raise
        try:
            out.flush()
            os.fsync(out.fileno())
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise _volume_full(req, req.dest) from exc
            raise
    short = cut_short(body.headers.get("Content-Length"), size)
    if short:  # not the data's fault: a retry may get it whole, a checksum failure would be for good
        raise FetchError(FetchReason.SOURCE_UNREACHABLE, f"GET {req.url}: {short}")
    got = digest.hexdigest()
    if got != req.sha256:
        raise FetchError(
            FetchReason.CHECKSUM_MISMATCH,
            f"sha256 of {req.url} ({size} bytes): expected {req.sha256}, got {got}",
        )


# -- safe unpacking ----------------------------------------------------------------------------------------
def _stripped(name: str, strip: int) -> str | None:
    """The member's name below the destination after dropping ``strip`` components; None: skip it."""
    parts = [p for p in PurePosixPath(name).parts if p not in ("", ".")]
    if PurePosixPath(name).is_absolute() or ".." in parts:
        raise FetchError(FetchReason.FETCH_FAILED, f"archive member {name!r} escapes the destination")
    parts = parts[strip:]
    return "/".join(parts) if parts else None


def _link_stays_inside(member_name: str, target: str, hard: bool) -> bool:
    """Symlink targets are relative to the member's folder, hard links to the archive root."""
    if PurePosixPath(target).is_absolute():
        return False
    base = PurePosixPath() if hard else PurePosixPath(member_name).parent
    depth = 0
    for part in (base / target).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return True


def _through_symlink(name: str, symlinks: set[str]) -> str | None:
    """The earlier symlink member that ``name``'s folder path runs through, if any."""
    parts = PurePosixPath(name).parts
    return next(("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in symlinks), None)


def safe_members(tar: tarfile.TarFile, strip: int) -> list[tarfile.TarInfo]:
    """Every member renamed for ``strip``, after refusing anything that could write outside the destination.

    A link's target is checked as text (:func:`_link_stays_inside`), which cannot see symlinks that earlier
    members made along the way; so no member may be written through a symlink of the archive, and a
    symlink may not point up (``..``): together no chain of links leaves the folder, whatever the Python
    (the ``data`` filter underneath was bypassed by such chains before CPython 3.11.13)."""
    out = []
    symlinks: set[str] = set()
    for member in tar.getmembers():
        name = _stripped(member.name, strip)
        if name is None:
            continue
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise FetchError(FetchReason.FETCH_FAILED, f"archive member {member.name!r} is a device or FIFO")
        through = _through_symlink(name, symlinks)
        if through is not None:
            raise FetchError(
                FetchReason.FETCH_FAILED, f"archive member {member.name!r} lies under the symlink {through!r}"
            )
        if member.issym() or member.islnk():
            target = _stripped(member.linkname, strip) if member.islnk() else member.linkname
            if target is None or not _link_stays_inside(name, target, member.islnk()):
                raise FetchError(
                    FetchReason.FETCH_FAILED,
                    f"archive member {member.name!r} links to {member.linkname!r}, outside the destination",
                )
            if member.issym() and ".." in PurePosixPath(target).parts:
                raise FetchError(
                    FetchReason.FETCH_FAILED,
                    f"archive member {member.name!r} links to {member.linkname!r}: a symlink may not point up",
                )
            if member.islnk() and _through_symlink(target, symlinks) is not None:
                raise FetchError(
                    FetchReason.FETCH_FAILED, f"archive member {member.name!r} links to a file under a symlink"
                )
            if member.issym():
                symlinks.add(name)
            if member.islnk():
                member.linkname = target
        member.name = name
        member.mode &= 0o755  # no set-uid/gid or world-writable bits: the volume is shared by every run
        out.append(member)
    return out


#: Python's ``data`` extraction filter (PEP 706: 3.12, and the 3.8 to 3.11 point releases of June 2023 on);
#: the runner image's Python (Debian bookworm's 3.11.2) has none, and :func:`safe_members` is then the only check.
HAS_FILTER = hasattr(tarfile, "data_filter")
FILTER_ERRORS: tuple[type[Exception], ...] = (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()


def unpack(req: FetchRequest, archive: Path, into: Path) -> None:
    """Extract ``archive`` (tar, tar.gz, tar.bz2, tar.xz) into the empty folder ``into``.

    Our own checks (:func:`safe_members`) give clear messages; Python's ``data`` filter (PEP 706)
    stays on underneath as a second line of defence where this Python has it (:data:`HAS_FILTER`).
    """
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = safe_members(tar, req.strip_components)
            if not members:
                raise FetchError(
                    FetchReason.FETCH_FAILED,
                    f"{req.url} holds no files below {req.strip_components} stripped path components",
                )
            if HAS_FILTER:
                tar.extractall(into, members=members, filter="data")
            else:
                tar.extractall(into, members=members)
    except FILTER_ERRORS as exc:
        raise FetchError(FetchReason.FETCH_FAILED, f"{req.url}: unsafe archive member refused: {exc}") from exc
    except tarfile.TarError as exc:
        raise FetchError(FetchReason.FETCH_FAILED, f"{req.url} is not a readable tar archive: {exc}") from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _volume_full(req, req.dest) from exc
        raise


# -- putting it in place ---------------------------------------------------------------------------------------
def _replace(src: Path, dest: Path) -> None:
    """Move ``src`` to ``dest``; an old folder there is moved aside first and removed after, and an old file
    (or link) under a new folder is removed first (``os.replace`` cannot put a folder over a file)."""
    if dest.is_dir() and not dest.is_symlink():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        dest.rename(old)
        src.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    elif src.is_dir() and (dest.exists() or dest.is_symlink()):
        dest.unlink()
        src.rename(dest)
    else:
        os.replace(src, dest)


def _write_marker(req: FetchRequest, files: list[dict[str, Any]]) -> None:
    """The marker, last and whole (:mod:`mlbench_api.atomic`): its presence is what says the data is complete;
    ``files`` is the manifest of the data as it lies in place. The source URL is kept redacted (it is only
    shown: :func:`already_there` and the loader compare the sha256, the layout and the manifest)."""
    record = {
        **req.marker_record(),
        "url": redact_url(req.url),  # mounted into every worker: no token or signature of the URL's
        "fetchedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        MANIFEST_KEY: files,
    }
    try:
        atomic.write_text(req.marker, json.dumps(record, indent=1) + "\n")  # removes its temporary file on failure
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _volume_full(req, req.marker) from exc
        raise


def leftovers(dest: Path) -> list[Path]:
    """What earlier fetches of ``dest`` left beside it: their work folders (``.<name>.fetch-*``) and old trees
    moved aside (``.<name>.old-*``). A fetch killed outright (SIGKILL at the end of a pod's grace period, a
    node lost) never reaches its clean-up, and on a shared volume a big dataset's partial download would
    stay for good, until the retry itself fails with VolumeFull."""
    if not dest.parent.is_dir():
        return []
    prefixes = (f".{dest.name}.fetch-", f".{dest.name}.old-")
    return sorted(p for p in dest.parent.iterdir() if p.name.startswith(prefixes))


@contextlib.contextmanager
def only_fetch_of(dest: Path) -> Iterator[None]:
    """An exclusive lock on ``.<name>.lock`` beside ``dest`` for the block. The operator runs one Job per
    dataset and namespace, whose pods do not overlap, but two Jobs may still fetch one path (two dataset
    names for the same data, an open-division override naming an existing path): the second waits for
    the first. The kernel (or the NFS server, after its lease) releases a killed holder's lock."""
    with dest.with_name(f".{dest.name}.lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            # a volume without locks (some NFS mounts): fetch unlocked, as before locks were taken
            print(json.dumps({"event": "dataset_lock_unsupported", "dest": str(dest), "error": str(exc)}), flush=True)
        yield


def fetch(req: FetchRequest, timeout: float = TIMEOUT_SECONDS) -> bool:
    """Make ``req.dest`` hold the verified data. Returns False when it was already there.

    Under :func:`only_fetch_of`, so what earlier fetches of the path left beside it is removed first. A store
    entry (``sha256-*``) is only ever filled with the data its name says (:func:`mlbench_api.datasets.store_name`).
    """
    wanted = store_name(req.sha256, req.unpack, req.strip_components)
    if req.dest.name.startswith(STORE_PREFIX) and req.dest.name != wanted:
        raise FetchError(FetchReason.FETCH_FAILED, f"{req.dest} is a store entry of other data (this is {wanted})")
    if already_there(req):
        return False
    parent = req.dest.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with only_fetch_of(req.dest):
            return _fetch_alone(req, timeout)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _volume_full(req, parent) from exc
        raise FetchError(FetchReason.FETCH_FAILED, f"cannot prepare {parent}: {exc}") from exc


def _fetch_alone(req: FetchRequest, timeout: float) -> bool:
    for stale in leftovers(req.dest):
        shutil.rmtree(stale, ignore_errors=True)
    if already_there(req):  # the fetch this one waited for put the same data there
        return False
    parent = req.dest.parent
    try:
        work = Path(tempfile.mkdtemp(prefix=f".{req.dest.name}.fetch-", dir=parent))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _volume_full(req, parent) from exc
        raise FetchError(FetchReason.FETCH_FAILED, f"cannot prepare {parent}: {exc}") from exc
    try:
        archive = work / "download"
        download(req, archive, timeout)
        if req.unpack:
            tree = work / "tree"
            tree.mkdir()
            unpack(req, archive, tree)
            archive.unlink()
        made = tree if req.unpack else archive
        files = manifest.build(made, None if req.unpack else req.sha256)  # after unpacking: what ranks will read
        # only now, with the new data verified, is the old data (and its marker) given up
        req.marker.unlink(missing_ok=True)
        _replace(made, req.dest)
        _write_marker(req, files)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _volume_full(req, req.dest) from exc
        raise FetchError(FetchReason.FETCH_FAILED, f"writing {req.dest}: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return True


# -- the subcommand ------------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="http(s) URL of the file")
    parser.add_argument("--sha256", required=True, help="expected SHA-256 (64 lowercase hex digits)")
    parser.add_argument(
        "--dest", required=True, type=Path, help="the dataset's path (a file, or a folder with --unpack)"
    )
    parser.add_argument("--unpack", action="store_true", help="extract the tar archive into --dest")
    parser.add_argument("--strip-components", type=int, default=0, help="with --unpack: drop leading path components")
    parser.add_argument("--volume", default="", help="name of the volume (PVC) for error messages")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_SECONDS, help="socket timeout in seconds")
    parser.add_argument("--termination-log", default=TERMINATION_LOG, help="where the JSON failure goes")


def write_termination_log(path: str, failure: FetchFailure) -> None:
    """Best effort: outside a pod /dev/termination-log does not exist."""
    with contextlib.suppress(OSError):
        Path(path).write_text(failure.termination_message())


def run(args: argparse.Namespace) -> int:
    """Exit 0 when the data is in place; else the reason's exit code, with the JSON termination message."""
    req = FetchRequest(
        url=args.url,
        sha256=args.sha256.lower(),
        dest=args.dest,
        unpack=args.unpack,
        strip_components=args.strip_components,
        volume=args.volume,
    )
    started = time.monotonic()
    try:
        with stopping.interrupt_on((signal.SIGTERM,)):  # a deleted pod or a deadline: the work folder is removed
            fetched = fetch(req, args.timeout)
    except FetchError as exc:
        failure = FetchFailure(exc.reason, exc.message)
    except KeyboardInterrupt:  # SIGTERM or Ctrl-C, after fetch's clean-up
        failure = FetchFailure(FetchReason.FETCH_FAILED, "stopped by a signal; the partial download was removed")
    except Exception as exc:  # a bug or an unforeseen OS error: still one classified line
        failure = FetchFailure(FetchReason.FETCH_FAILED, redact_urls(f"{type(exc).__name__}: {exc}"))
    else:
        what = "fetched" if fetched else "already present"
        print(
            json.dumps(
                {
                    "event": "dataset_" + what.replace(" ", "_"),
                    "dest": str(req.dest),
                    "sha256": req.sha256,
                    "seconds": round(time.monotonic() - started, 3),
                }
            )
        )
        return 0
    print(json.dumps({"event": "dataset_fetch_failed", "reason": failure.reason.value, "message": failure.message}))
    write_termination_log(args.termination_log, failure)
    return int(EXIT_FOR_REASON[failure.reason])
