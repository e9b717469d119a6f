"""Figures as a person reads them at a glance: the strings of ``kubectl get br``'s columns and of ``mlbench watch``.

Printer columns select with JSONPath only and a ``number`` column prints every digit (``6.497854486000506``),
so the operator writes these strings next to the exact figures, which stay in the status.
"""

from __future__ import annotations

import math

from mlbench_api.goal import ACCURACY_METRICS, GoalMetric

#: Above this a perplexity or BLEU figure is written in exponent form, so a column's string stays short.
_LARGE = 1e6


def percent(fraction: float) -> str:
    """``81.2%``: an accuracy (a fraction of 1) with one decimal."""
    return f"{fraction * 100:.1f}%"


def score(metric: GoalMetric, value: float, *, target: bool = False) -> str:
    """A value of a goal metric as a column shows it: ``81.2%`` (an accuracy), ``24.3 BLEU``, ``ppl 71.2``,
    ``loss 0.412``; a goal's target (``target=True``) with its own digits: ``80%``, ``25 BLEU``, ``ppl 4.5``."""
    if metric in ACCURACY_METRICS:
        return f"{value:.0%}" if target else percent(value)
    if target:
        number = f"{value:g}"
    elif metric is GoalMetric.LOSS or abs(value) >= _LARGE:
        number = f"{value:.3g}"
    else:
        number = f"{value:.1f}"
    if metric is GoalMetric.BLEU:
        return f"{number} BLEU"
    return f"{'ppl' if metric is GoalMetric.PERPLEXITY else 'loss'} {number}"


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


def _short(value: float, decimals: str) -> str:
    """``value`` with ``decimals`` (a format), or in exponent form from :data:`_LARGE` on, so a column stays short."""
    return f"{value:.3g}" if abs(value) >= _LARGE else format(value, decimals)


def epoch(value: float) -> str:
    """``2.3``, ``8``: epochs done, cut (not rounded) to tenths, so a column never shows an epoch not yet done."""
    return _short(math.floor(value * 10) / 10 if abs(value) < _LARGE else value, ".1f").removesuffix(".0")


def ratio(value: float) -> str:
    """``71.9x``, ``1.0x``: a compression ratio (uncompressed bytes / bytes sent) with one decimal."""
    return _short(value, ".1f") + "x"
