"""The dataset-fetch contract shared by the fetcher (runner image) and the operator.

The fetch Job's container (``mlbench-runner fetch-dataset``) reports a failure twice: as its exit
code, which the Job's ``podFailurePolicy`` reads (a checksum mismatch is permanent, an unreachable
source is retried), and as a JSON termination message ``{"reason": ..., "message": ...}``, which
the operator copies into the run's status. One module, so both sides agree on names and numbers.

A failure message names the URL by its scheme, host, port and path only (:func:`redact_urls`): userinfo, a
query string (a presigned URL's signature, a token) and a fragment never reach the run's status, its events or
the Job's log. The fetcher scrubs what it writes, the operator what it reads (an older fetcher's words too).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from enum import IntEnum, StrEnum


class FetchReason(StrEnum):
    """Why a fetch failed; becomes the run's ``Failed``/``DatasetReady`` reason verbatim."""

    SOURCE_UNREACHABLE = "SourceUnreachable"  #: DNS, connection refused, timeout, HTTP 4xx/5xx
    CHECKSUM_MISMATCH = "ChecksumMismatch"  #: the bytes are not the ones the task names
    VOLUME_FULL = "VolumeFull"  #: ENOSPC on the dataset volume
    FETCH_FAILED = "DatasetFetchFailed"  #: anything else (a corrupt archive, a bug)


class FetchExit(IntEnum):
    """Exit codes of ``fetch-dataset``; 0 is success (fetched, or already there)."""

    SOURCE_UNREACHABLE = 10
    CHECKSUM_MISMATCH = 11
    VOLUME_FULL = 12
    FETCH_FAILED = 13


EXIT_FOR_REASON = {
    FetchReason.SOURCE_UNREACHABLE: FetchExit.SOURCE_UNREACHABLE,
    FetchReason.CHECKSUM_MISMATCH: FetchExit.CHECKSUM_MISMATCH,
    FetchReason.VOLUME_FULL: FetchExit.VOLUME_FULL,
    FetchReason.FETCH_FAILED: FetchExit.FETCH_FAILED,
}
#: Failures a retry cannot fix: the Job fails at once (podFailurePolicy FailJob), no backoff.
PERMANENT_EXITS = (FetchExit.CHECKSUM_MISMATCH, FetchExit.VOLUME_FULL)
#: Suffix of the marker file written next to the data once it is complete and verified.
MARKER_SUFFIX = ".mlbench-dataset.json"
#: Fetched data is content-addressed: it lives in the dataset volume at ``<volume>/<store name>``
#: (:func:`store_name`), a name derived from what the fetch produces, never from a path a task or run chose.
STORE_PREFIX = "sha256-"
#: The marker's per-file manifest: a list of ``{"path", "size", "sha256"}`` (``path`` relative to the data,
#: ``.`` for a single file), written by the fetcher after unpacking and checked by every rank before it loads.
MANIFEST_KEY = "files"


def store_name(sha256: str, unpack: bool, strip_components: int) -> str:
    """``sha256-<digest>`` for a stored file, ``sha256-<digest>-x<strip>`` for an unpacked archive: the bytes
    and how they were laid out, so two tasks get the same folder exactly when they would fetch the same files."""
    return f"{STORE_PREFIX}{sha256}" + (f"-x{strip_components}" if unpack else "")


def reserved_path(path: str) -> str | None:
    """Why a sourced dataset's ``path`` may not be used (it names the store or a marker), or None.

    The path is only where the workers see the data (the operator mounts the store entry there), but a
    path that looks like the store or a marker would read as another dataset's files in messages and docs."""
    segments = [s for s in path.split("/") if s]
    if any(s.startswith(STORE_PREFIX) for s in segments):
        return f"{path} names the dataset store ({STORE_PREFIX}*): its folders are the operator's, named by checksum"
    if any(s.endswith(MARKER_SUFFIX) for s in segments):
        return f"{path} names a dataset marker (*{MARKER_SUFFIX}): markers are written by the fetcher only"
    return None


#: A URL inside free text: a scheme, ``://`` and everything up to whitespace or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
#: Punctuation a message puts right after a URL (``GET <url>: HTTP 404``), kept outside the URL.
_TRAILING = ":;,.)]'\""
#: What stands for a query string or fragment that was left out.
OMITTED = "?…"


def redact_url(url: str) -> str:
    """``url`` without userinfo, query string or fragment (``OMITTED`` marks a query or fragment left out): what a
    message may say about a URL, which may carry a password, a token or a presigned signature."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:  # an unparseable URL (a bad port, an unclosed bracket): its scheme only
        return url.split("://", 1)[0] + "://…"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    tail = OMITTED if parts.query or parts.fragment or url.endswith(("?", "#")) else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")) + tail


def _redact_match(match: re.Match[str]) -> str:
    url = match.group(0)
    kept = url.rstrip(_TRAILING)
    return redact_url(kept) + url[len(kept) :]


def redact_urls(text: str) -> str:
    """``text`` with every URL in it redacted (:func:`redact_url`)."""
    return _URL_IN_TEXT.sub(_redact_match, text)


@dataclass(frozen=True)
class FetchFailure:
    """A failed fetch as the termination message carries it."""

    reason: FetchReason
    message: str

    def termination_message(self) -> str:
        """JSON for ``/dev/termination-log`` (the kubelet keeps at most 4 KiB: the message is cut)."""
        return json.dumps({"reason": self.reason.value, "message": redact_urls(self.message)[:3500]})

    @classmethod
    def parse(cls, text: str | None) -> FetchFailure | None:
        """The failure from a termination message; None when it is not one of ours (e.g. log tail)."""
        try:
            data = json.loads(text or "")
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("message"), str):
            return None
        try:
            return cls(FetchReason(str(data.get("reason"))), redact_urls(data["message"]))
        except ValueError:
            return None
