"""The dataset-fetch contract shared by the fetcher (runner image) and the operator.

The fetch Job's container (``mlbench-runner fetch-dataset``) reports a failure twice: as its exit
code, which the Job's ``podFailurePolicy`` reads (a checksum mismatch is permanent, an unreachable
source is retried), and as a JSON termination message ``{"reason": ..., "message": ...}``, which
the operator copies into the run's status. One module, so both sides agree on names and numbers.
"""

from __future__ import annotations

import json
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


@dataclass(frozen=True)
class FetchFailure:
    """A failed fetch as the termination message carries it."""

    reason: FetchReason
    message: str

    def termination_message(self) -> str:
        """JSON for ``/dev/termination-log`` (the kubelet keeps at most 4 KiB: the message is cut)."""
        return json.dumps({"reason": self.reason.value, "message": self.message[:3500]})

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
            return cls(FetchReason(str(data.get("reason"))), data["message"])
        except ValueError:
            return None
