"""The parsing of environment variables into settings: the one error, and the values every setting is made of.

A leaf: the settings of each part (:mod:`.settings`, :mod:`.policy`, :mod:`.leader`) parse with these and
raise :class:`SettingsError`, which names the variable.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping


class SettingsError(ValueError):
    """An environment variable holds an unusable value; the message names it."""


def port(env: Mapping[str, str], key: str, default: int) -> int:
    value = integer(env, key, default, minimum=0)
    if value > 65535:
        raise SettingsError(f"{key}={value} is not a TCP port (0 to 65535)")
    return value


def seconds(env: Mapping[str, str], key: str, default: float, positive: bool = False) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{key}={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise SettingsError(f"{key}={raw!r} must be {'greater than' if positive else 'at least'} 0")
    return value


def integer(env: Mapping[str, str], key: str, default: int, minimum: int = 1) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{key}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{key}={raw!r} must be at least {minimum}")
    return value


def cidrs(env: Mapping[str, str], key: str) -> tuple[str, ...] | None:
    """Comma-separated address blocks (``10.0.0.0/8,2001:db8::/32``), normalised; None when ``key`` is unset or
    empty. Raises :class:`SettingsError` naming ``key``."""
    blocks = [x.strip() for x in env.get(key, "").split(",") if x.strip()]
    try:
        return tuple(str(ipaddress.ip_network(block)) for block in blocks) or None
    except ValueError as e:
        raise SettingsError(f"{key}: {e}") from None
