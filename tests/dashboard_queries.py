"""The Grafana dashboards' panel queries, with their variables expanded as Grafana does.

``panel_queries(path)`` lists (panel title, expr) of a dashboard; ``expand(expr, ...)``
substitutes the dashboard variables so that the query can be sent to Prometheus' HTTP API
(``/api/v1/query``), for tests that run every panel against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

GRAFANA = Path(__file__).resolve().parents[1] / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))

#: ``$name``, ``${name}``, ``${name:format}`` and the deprecated ``[[name]]``
VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)(?::(\w+))?\}|\[\[(\w+)(?::(\w+))?\]\]")
#: characters Grafana's Prometheus data source escapes in values of multi-value variables
#: (prometheusSpecialRegexEscape): a regex escape that survives PromQL's string unquoting
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside (collapsed) rows included; the rows themselves too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries(path: Path | str) -> list[tuple[str, str]]:
    """(panel title, PromQL expression) of every visible Prometheus target of a dashboard."""
    dashboard = json.loads(Path(path).read_text())
    return [
        (panel["title"], target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
        if target.get("expr") and not target.get("hide", False)
    ]


def _regex_escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def _multi(values: str | Sequence[str], fmt: str | None) -> str:
    """A multi-value/include-All variable: what Grafana writes for the selected values."""
    vals = [values] if isinstance(values, str) else list(values)
    if not vals:
        raise ValueError("a variable needs at least one value")
    if fmt in (None, "regex"):
        escaped = [_regex_escape(v) for v in vals]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    if fmt == "pipe":
        return "|".join(vals)
    raise ValueError(f"variable format {fmt!r} is not handled")


def _single(value: str, fmt: str | None) -> str:
    """A single-value variable (textbox): Grafana escapes backslashes and single quotes."""
    if fmt not in (None, "raw"):
        raise ValueError(f"variable format {fmt!r} is not handled")
    return value.replace("\\", "\\\\").replace("'", "\\'")


def expand(
    expr: str,
    namespace: str | Sequence[str],
    run: str | Sequence[str],
    operator_namespace: str = "mlbench-system",
    rate_interval: str = "1m",
) -> str:
    """``expr`` with the dashboard variables replaced, as Grafana sends it to Prometheus.

    ``namespace`` and ``run`` are multi-value variables: a string or a list of selected
    values (several become ``(a|b)``, regex-escaped). An unknown variable is an error, so a
    dashboard that grows a variable cannot be queried half-expanded.
    """

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(5)
        if name == "namespace":
            return _multi(namespace, fmt)
        if name == "run":
            return _multi(run, fmt)
        if name == "operator_namespace":
            return _single(operator_namespace, fmt)
        if name in ("__rate_interval", "__interval"):
            return rate_interval
        raise ValueError(f"unknown variable {m.group(0)} in {expr!r}")

    return VARIABLE.sub(sub, expr)
