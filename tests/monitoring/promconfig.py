"""Translate a PodMonitor or ServiceMonitor into the plain Prometheus ``scrape_config`` the Prometheus
Operator would generate for it, so a stock Prometheus (Debian's) scrapes exactly what the shipped
manifests select, without running the operator.

Modelled on prometheus-operator's ``pkg/prometheus/promcfg.go`` (``generatePodMonitorConfig``,
``generateServiceMonitorConfig``, ``generateK8SSDConfig``, ``generateRelabelConfig``,
``generateRunningFilter``, ``initRelabelings``): the same job name, the same relabelings in the same
order, then the monitor's own ``relabelings``.  Left out on purpose: the sharding rules (with one shard
they keep every target) and scrape classes / enforced limits (properties of a ``Prometheus`` object, not of
the monitor).  Fields that change scraping but are not translated here (TLS, auth, proxies, ...) raise
:class:`Unsupported` instead of being dropped silently.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

Obj = dict[str, Any]

#: endpoint fields this translation understands (anything else raises Unsupported)
_POD_ENDPOINT_FIELDS = {
    "port",
    "portNumber",
    "targetPort",
    "path",
    "scheme",
    "params",
    "interval",
    "scrapeTimeout",
    "honorLabels",
    "honorTimestamps",
    "filterRunning",
    "relabelings",
    "metricRelabelings",
}
_SERVICE_ENDPOINT_FIELDS = _POD_ENDPOINT_FIELDS - {"portNumber"}
_MONITOR_SPEC_FIELDS = {
    "selector",
    "namespaceSelector",
    "podMetricsEndpoints",
    "endpoints",
    "podTargetLabels",
    "targetLabels",
    "jobLabel",
    "sampleLimit",
    "targetLimit",
}
#: RelabelConfig (CRD, camelCase) -> relabel_config (Prometheus, snake_case), in promcfg.go's key order
_RELABEL_KEYS = (
    ("sourceLabels", "source_labels"),
    ("separator", "separator"),
    ("targetLabel", "target_label"),
    ("regex", "regex"),
    ("modulus", "modulus"),
    ("replacement", "replacement"),
    ("action", "action"),
)
_INVALID_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


class Unsupported(ValueError):
    """The monitor uses a field this translation does not implement; its name is in the message."""


def sanitize_label_name(name: str) -> str:
    """How Kubernetes SD names a label: ``mlbench.io/run`` -> ``mlbench_io_run`` (promcfg.go's sanitizeLabelName)."""
    return _INVALID_LABEL_CHARS.sub("_", name)


def scrape_config(
    monitor: Obj,
    *,
    kubeconfig: str | None = None,
    api_server: str | None = None,
    http_sd_url: str | None = None,
) -> Obj:
    """The scrape_config for ``monitor`` (a PodMonitor or ServiceMonitor dict with exactly one endpoint).

    Service discovery reaches the cluster through ``kubeconfig`` (Prometheus' ``kubeconfig_file``) or
    ``api_server`` (in-cluster credentials), or, for a Prometheus built without Kubernetes SD (Debian's),
    through ``http_sd_url``: a tests/monitoring/k8s_sd.py DiscoveryServer emulating it.  Exactly one is required.
    """
    if sum(x is not None for x in (kubeconfig, api_server, http_sd_url)) != 1:
        raise ValueError("scrape_config: give exactly one of kubeconfig=, api_server= or http_sd_url=")
    kind = monitor.get("kind")
    meta = monitor.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if not name or not namespace:
        raise ValueError(f"{kind}: metadata.name and metadata.namespace are required (got {name!r}, {namespace!r})")
    spec = monitor.get("spec") or {}
    _reject_unknown(f"{kind} {namespace}/{name} spec", spec, _MONITOR_SPEC_FIELDS)
    sd: Obj = {"role": "pod" if kind == "PodMonitor" else "endpoints"}
    namespaces = _namespaces(spec.get("namespaceSelector") or {}, namespace)
    if namespaces:
        sd["namespaces"] = {"names": namespaces}
    if kubeconfig is not None:
        sd["kubeconfig_file"] = kubeconfig
    elif api_server is not None:
        sd["api_server"] = api_server
    if kind == "PodMonitor":
        endpoints, fields, generate = spec.get("podMetricsEndpoints") or [], _POD_ENDPOINT_FIELDS, _pod_relabelings
        job_name = f"podMonitor/{namespace}/{name}/0"
    elif kind == "ServiceMonitor":
        endpoints, fields, generate = spec.get("endpoints") or [], _SERVICE_ENDPOINT_FIELDS, _service_relabelings
        job_name = f"serviceMonitor/{namespace}/{name}/0"
    else:
        raise ValueError(f"kind must be PodMonitor or ServiceMonitor, not {kind!r}")
    if len(endpoints) != 1:
        raise Unsupported(f"{kind} {namespace}/{name}: exactly one endpoint is supported, found {len(endpoints)}")
    ep = endpoints[0]
    _reject_unknown(f"{kind} {namespace}/{name} endpoint 0", ep, fields)

    cfg: Obj = {"job_name": job_name, "honor_labels": bool(ep.get("honorLabels", False))}
    if "honorTimestamps" in ep:
        cfg["honor_timestamps"] = bool(ep["honorTimestamps"])
    if http_sd_url is None:
        cfg["kubernetes_sd_configs"] = [sd]
    else:
        query = urllib.parse.urlencode([("namespace", ns) for ns in namespaces])
        url = f"{http_sd_url.rstrip('/')}/{sd['role']}" + (f"?{query}" if query else "")
        # Kubernetes SD watches; 5 s polling is close enough for tests and cheap for the emulation.
        cfg["http_sd_configs"] = [{"url": url, "refresh_interval": "5s"}]
    for crd_key, prom_key in (
        ("interval", "scrape_interval"),
        ("scrapeTimeout", "scrape_timeout"),
        ("path", "metrics_path"),
        ("params", "params"),
        ("scheme", "scheme"),
    ):
        if ep.get(crd_key):
            cfg[prom_key] = ep[crd_key]
    cfg["relabel_configs"] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        *generate(monitor, ep),
        *relabel_configs(ep.get("relabelings") or []),
    ]
    for crd_key, prom_key in (("sampleLimit", "sample_limit"), ("targetLimit", "target_limit")):
        if spec.get(crd_key):
            cfg[prom_key] = spec[crd_key]
    if ep.get("metricRelabelings"):
        cfg["metric_relabel_configs"] = relabel_configs(ep["metricRelabelings"])
    return cfg


def relabel_configs(relabelings: list[Obj]) -> list[Obj]:
    """CRD RelabelConfigs -> Prometheus relabel_configs (promcfg.go's generateRelabelConfig)."""
    out: list[Obj] = []
    for rc in relabelings:
        unknown = set(rc) - {k for k, _ in _RELABEL_KEYS}
        if unknown:
            raise Unsupported(f"relabeling {rc}: unknown field(s) {sorted(unknown)}")
        item: Obj = {}
        for crd_key, prom_key in _RELABEL_KEYS:
            value = rc.get(crd_key)
            # Go: separator and replacement are pointers (an empty string is kept); the rest are omitted when zero
            omitted = value is None if crd_key in ("separator", "replacement") else not value
            if not omitted:
                item[prom_key] = str(value).lower() if crd_key == "action" else value
        out.append(item)
    return out


def _reject_unknown(where: str, obj: Obj, known: set[str]) -> None:
    unknown = set(obj) - known
    if unknown:
        raise Unsupported(f"{where}: field(s) {sorted(unknown)} are not translated by tests/monitoring/promconfig.py")


def _namespaces(selector: Obj, own_namespace: str) -> list[str]:
    """promcfg.go's getNamespacesFromNamespaceSelector: any -> all (empty list), none -> the monitor's own."""
    if selector.get("any"):
        return []
    return list(selector.get("matchNames") or []) or [own_namespace]


def _selector_relabelings(selector: Obj, role: str) -> list[Obj]:
    """A label selector as keep/drop rules on ``__meta_kubernetes_<role>_label_*`` / ``labelpresent_*``."""
    label, present = f"__meta_kubernetes_{role}_label_", f"__meta_kubernetes_{role}_labelpresent_"
    out: list[Obj] = []
    for key in sorted(selector.get("matchLabels") or {}):
        k = sanitize_label_name(key)
        out.append(
            {
                "action": "keep",
                "source_labels": [label + k, present + k],
                "regex": f"({selector['matchLabels'][key]});true",
            }
        )
    for exp in selector.get("matchExpressions") or []:
        k, op = sanitize_label_name(exp["key"]), exp["operator"]
        values = "|".join(exp.get("values") or [])
        if op in ("In", "NotIn"):
            action = "keep" if op == "In" else "drop"
            out.append({"action": action, "source_labels": [label + k, present + k], "regex": f"({values});true"})
        elif op in ("Exists", "DoesNotExist"):
            action = "keep" if op == "Exists" else "drop"
            out.append({"action": action, "source_labels": [present + k], "regex": "true"})
        else:
            raise ValueError(f"selector.matchExpressions: unknown operator {op!r} for key {exp['key']!r}")
    return out


def _running_filter() -> Obj:
    """promcfg.go's generateRunningFilter (the default of ``filterRunning``)."""
    return {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}


def _target_label_rules(prefix: str, labels: list[str]) -> list[Obj]:
    return [
        {
            "source_labels": [prefix + sanitize_label_name(lbl)],
            "target_label": sanitize_label_name(lbl),
            "regex": "(.+)",
            "replacement": "${1}",
        }
        for lbl in labels
    ]


def _port_filter(ep: Obj, name_label: str, *, allow_number: bool) -> list[Obj]:
    if ep.get("port"):
        return [{"action": "keep", "source_labels": [name_label], "regex": ep["port"]}]
    if allow_number and ep.get("portNumber"):
        return [
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_number"],
                "regex": ep["portNumber"],
            }
        ]
    target = ep.get("targetPort")
    if isinstance(target, str) and target:
        return [{"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": target}]
    if isinstance(target, int) and target:
        return [{"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_number"], "regex": target}]
    return []


def _endpoint_label(ep: Obj) -> list[Obj]:
    if ep.get("port"):
        return [{"target_label": "endpoint", "replacement": ep["port"]}]
    if ep.get("targetPort") not in (None, ""):
        return [{"target_label": "endpoint", "replacement": str(ep["targetPort"])}]
    return []


def _job_label_rule(prefix: str, spec: Obj) -> list[Obj]:
    if not spec.get("jobLabel"):
        return []
    return [
        {
            "source_labels": [prefix + sanitize_label_name(spec["jobLabel"])],
            "target_label": "job",
            "regex": "(.+)",
            "replacement": "${1}",
        }
    ]


def _pod_relabelings(monitor: Obj, ep: Obj) -> list[Obj]:
    """generatePodMonitorConfig's rules, between initRelabelings and the endpoint's own relabelings."""
    spec, meta = monitor["spec"], monitor["metadata"]
    rules: list[Obj] = []
    if ep.get("filterRunning", True):
        rules.append(_running_filter())
    rules += _selector_relabelings(spec.get("selector") or {}, "pod")
    rules += _port_filter(ep, "__meta_kubernetes_pod_container_port_name", allow_number=True)
    rules += [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    rules += _target_label_rules("__meta_kubernetes_pod_label_", spec.get("podTargetLabels") or [])
    rules.append({"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"})
    rules += _job_label_rule("__meta_kubernetes_pod_label_", spec)
    rules += _endpoint_label(ep)
    return rules


def _service_relabelings(monitor: Obj, ep: Obj) -> list[Obj]:
    """generateServiceMonitorConfig's rules (role endpoints), between initRelabelings and the endpoint's own."""
    spec = monitor["spec"]
    rules = _selector_relabelings(spec.get("selector") or {}, "service")
    rules += _port_filter(ep, "__meta_kubernetes_endpoint_port_name", allow_number=False)
    target = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    rules += [
        {
            "source_labels": target,
            "separator": ";",
            "regex": "Node;(.*)",
            "replacement": "${1}",
            "target_label": "node",
        },
        {"source_labels": target, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    ]
    if ep.get("filterRunning", True):
        rules.append(_running_filter())
    rules += _target_label_rules("__meta_kubernetes_service_label_", spec.get("targetLabels") or [])
    rules += _target_label_rules("__meta_kubernetes_pod_label_", spec.get("podTargetLabels") or [])
    rules.append({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"})
    rules += _job_label_rule("__meta_kubernetes_service_label_", spec)
    rules += _endpoint_label(ep)
    return rules
