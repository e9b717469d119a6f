"""The leader election's settings: who competes for which Lease, and client-go's three durations, parsed from
the environment and validated like :mod:`.settings` (a :class:`SettingsError` names the variable).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from mlbench_api.common import DNS1123_LABEL, DNS1123_SUBDOMAIN
from mlbench_operator.env import SettingsError

JITTER_FACTOR = 1.2
DEFAULT_NAME = "mlbench-operator"
DEFAULT_NAMESPACE = "mlbench-system"


_DNS1123_LABEL = re.compile(DNS1123_LABEL)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def default_identity() -> str:
    """``POD_NAME`` in a pod (stable across container restarts), else ``<hostname>_<pid>``."""
    return f"{socket.gethostname()}_{os.getpid()}"


@dataclass(frozen=True)
class LeaderSettings:
    """Who competes for which Lease, and client-go's three durations (defaults: 15 s, 10 s, 2 s)."""

    enabled: bool = True
    name: str = DEFAULT_NAME
    namespace: str = DEFAULT_NAMESPACE
    identity: str = "operator"
    #: How long a Lease whose record stopped changing still counts as held (written to the Lease).
    lease_duration: int = 15
    #: The leader gives up (stops reconciling, exits non-zero) after failing to renew this long.
    renew_deadline: float = 10.0
    #: Between two tries (acquire: jittered by up to 1.2x more; renew: not).
    retry_period: float = 2.0

    @classmethod
    def from_env(cls, env: Mapping[str, str], enabled: bool | None = None) -> LeaderSettings:
        """``MLBENCH_LEADER_*``, ``POD_NAME``, ``POD_NAMESPACE``; raises :class:`SettingsError` naming the variable.

        ``enabled`` (the ``--[no-]leader-elect`` flag) wins over ``MLBENCH_LEADER_ELECT``.
        """
        d = cls()
        if enabled is None:
            raw = env.get("MLBENCH_LEADER_ELECT", "").strip().lower()
            if raw and raw not in _TRUE + _FALSE:
                raise SettingsError(f"MLBENCH_LEADER_ELECT={raw!r} is not one of true, false")
            enabled = raw not in _FALSE
        name = env.get("MLBENCH_LEADER_ELECTION_ID", "").strip() or d.name
        if not _DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
            raise SettingsError(f"MLBENCH_LEADER_ELECTION_ID={name!r} is not a valid Lease name")
        key = "MLBENCH_LEADER_ELECTION_NAMESPACE"
        namespace = env.get(key, "").strip()
        if not namespace:
            key, namespace = "POD_NAMESPACE", env.get("POD_NAMESPACE", "").strip() or d.namespace
        if not _DNS1123_LABEL.match(namespace) or len(namespace) > 63:
            raise SettingsError(f"{key}={namespace!r} is not a valid namespace name")
        identity = env.get("POD_NAME", "").strip() or default_identity()
        lease = _seconds(env, "MLBENCH_LEADER_ELECTION_LEASE_DURATION_SECONDS", d.lease_duration, whole=True)
        renew = _seconds(env, "MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS", d.renew_deadline)
        retry = _seconds(env, "MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS", d.retry_period)
        # client-go's NewLeaderElector checks, with the variables named
        if lease <= renew:
            raise SettingsError(
                f"MLBENCH_LEADER_ELECTION_LEASE_DURATION_SECONDS={lease:g} must be greater than "
                f"MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS={renew:g}"
            )
        if renew <= JITTER_FACTOR * retry:
            raise SettingsError(
                f"MLBENCH_LEADER_ELECTION_RENEW_DEADLINE_SECONDS={renew:g} must be greater than "
                f"{JITTER_FACTOR} x MLBENCH_LEADER_ELECTION_RETRY_PERIOD_SECONDS={retry:g}"
            )
        return cls(
            enabled=enabled,
            name=name,
            namespace=namespace,
            identity=identity,
            lease_duration=int(lease),
            renew_deadline=renew,
            retry_period=retry,
        )


def _seconds(env: Mapping[str, str], key: str, default: float, whole: bool = False) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        kind = "a whole number of seconds" if whole else "a number of seconds"
        raise SettingsError(f"{key}={raw!r} is not {kind}") from None
    if not 0 < value < float("inf"):  # NaN fails both
        raise SettingsError(f"{key}={raw!r} must be greater than 0")
    return value
