"""Figures as a person reads them at a glance: the strings of ``kubectl get br``'s columns and of ``mlbench watch``.

Printer columns select with JSONPath only and a ``number`` column prints every digit (``6.497854486000506``),
so the operator writes these strings next to the exact figures, which stay in the status.
"""

from __future__ import annotations

import math


def percent(fraction: float) -> str:
    """``81.2%``: an accuracy (a fraction of 1) with one decimal."""
    return f"{fraction * 100:.1f}%"


def duration(seconds: float) -> str:
    """``6.5s``, ``4m07s``, ``2h03m09s``: seconds rounded to tenths under a minute, to whole seconds above.

    A negative figure (a clock that stepped back) shows as ``0.0s``; NaN and infinities are refused (ValueError).
    """
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be a finite number of seconds, got {seconds}")
    seconds = max(seconds, 0.0)
    if round(seconds, 1) < 60:
        return f"{seconds:.1f}s"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
