"""Prometheus' target relabeling in pure Python, for unit tests.

Why: with the discovery in tests/monitoring/k8s_sd.py, the scrape targets (and their labels) that the shipped
PodMonitor yields for a worker pod are computed from the pod the operator builds, without a cluster.
Follows Prometheus' ``model/relabel/relabel.go``
(anchored RE2 regexes, Go ``Regexp.Expand`` replacements) and ``scrape/target.go`` ``PopulateLabels`` (the
initial ``job``/``__scheme__``/... labels, meta labels removed, ``instance`` defaulted to ``__address__``).
The test suite checks this evaluator against a real Prometheus (file SD) so it cannot drift silently.
"""

from __future__ import annotations

import re
from typing import Any

Labels = dict[str, str]
Obj = dict[str, Any]

_DEFAULT_REGEX = "(.*)"
_EXPAND = re.compile(r"\$(\$|\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")


def scrape_target(cfg: Obj, discovered: Labels) -> Labels | None:
    """The target labels Prometheus builds from ``discovered`` under scrape config ``cfg``; None if dropped."""
    labels: Labels = {
        "job": cfg["job_name"],
        "__scheme__": cfg.get("scheme", "http"),
        "__metrics_path__": cfg.get("metrics_path", "/metrics"),
        "__scrape_interval__": cfg.get("scrape_interval", "1m"),
        "__scrape_timeout__": cfg.get("scrape_timeout", "10s"),
        **discovered,
    }
    result = relabel(labels, cfg.get("relabel_configs") or [])
    if result is None or not result.get("__address__"):
        return None
    final = {k: v for k, v in result.items() if not k.startswith("__") and v != ""}
    final.setdefault("instance", result["__address__"])
    return final


def relabel(labels: Labels, configs: list[Obj]) -> Labels | None:
    """Apply Prometheus relabel_configs (snake_case) in order; None when a keep/drop rule drops the target."""
    lset = dict(labels)
    for cfg in configs:
        action = cfg.get("action", "replace")
        regex = re.compile(str(cfg.get("regex", _DEFAULT_REGEX)))
        value = cfg.get("separator", ";").join(lset.get(name, "") for name in cfg.get("source_labels", []))
        if action == "keep":
            if not regex.fullmatch(value):
                return None
        elif action == "drop":
            if regex.fullmatch(value):
                return None
        elif action == "replace":
            m = regex.fullmatch(value)
            if m is None:
                continue
            target = _expand(m, cfg["target_label"])
            result = _expand(m, str(cfg.get("replacement", "$1")))
            if result:
                lset[target] = result
            else:
                lset.pop(target, None)
        elif action == "labelmap":
            for name, val in list(lset.items()):
                m = regex.fullmatch(name)
                if m:
                    lset[_expand(m, str(cfg.get("replacement", "$1")))] = val
        elif action in ("labeldrop", "labelkeep"):
            keep = action == "labelkeep"
            lset = {k: v for k, v in lset.items() if bool(regex.fullmatch(k)) == keep}
        else:
            raise NotImplementedError(f"relabel action {action!r} is not implemented by tests/monitoring/relabel.py")
    return lset


def _expand(m: re.Match[str], template: str) -> str:
    """Go's Regexp.Expand: ``$1``, ``${1}``, ``$name``, ``${name}``, ``$$``; unknown or unmatched groups are empty."""

    def one(ref: re.Match[str]) -> str:
        if ref.group(1) == "$":
            return "$"
        name = ref.group(2) or ref.group(3)
        if name.isdigit():
            idx = int(name)
            return (m.group(idx) or "") if idx <= (m.re.groups) else ""
        return (m.groupdict().get(name) or "") if name in m.re.groupindex else ""

    return _EXPAND.sub(one, template)
