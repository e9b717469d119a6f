"""Prometheus' Kubernetes service discovery (roles ``pod`` and ``endpoints``) in Python, served as HTTP SD.

Why: Debian's Prometheus (2.42+ds) is built WITHOUT ``kubernetes_sd_configs`` (``promtool check config`` says
"field kubernetes_sd_configs not found in type config.ScrapeConfig").  To scrape a real cluster with it, this
module lists the objects with kubectl and produces the target groups Kubernetes SD would (same
``__meta_kubernetes_*`` labels, one target per declared container port / endpoint port), and
:class:`DiscoveryServer` serves them to Prometheus' ``http_sd_configs``.  The monitors' relabelings (the part
that encodes the PodMonitor / ServiceMonitor) then run in the real Prometheus, unchanged:
``promconfig.scrape_config(monitor, http_sd_url=server.url)``.

Follows Prometheus' ``discovery/kubernetes/pod.go`` and ``endpoints.go``; node metadata
(``attach_metadata``) and EndpointSlices are not emulated.
"""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.monitoring.promconfig import sanitize_label_name

Labels = dict[str, str]
Obj = dict[str, Any]
#: one HTTP SD / file SD target group: {"targets": [address], "labels": {...}}
Group = dict[str, Any]


def pod_targets(pod: Obj) -> list[Labels]:
    """What role ``pod`` discovers for ``pod``: one label set (``__address__`` included) per container port.

    A pod without an IP yields nothing (Prometheus skips it); a container without ports yields one target on
    the bare pod IP.
    """
    ip = (pod.get("status") or {}).get("podIP", "")
    if not ip:
        return []
    common = _pod_labels(pod)
    out: list[Labels] = []
    for container, port in _container_ports(pod):
        labels = {**common, **_container_labels(container, port)}
        labels["__address__"] = _join_host_port(ip, port["containerPort"]) if port else ip
        out.append(labels)
    return out


def endpoints_targets(
    endpoints: Obj, services: dict[tuple[str, str], Obj], pods: dict[tuple[str, str], Obj]
) -> list[Labels]:
    """What role ``endpoints`` discovers for one Endpoints object (services and pods keyed by (namespace, name)).

    One target per (address, port) of every subset, with the Service's and, for Pod addresses, the pod's and
    the matching container port's labels; then, as Prometheus does, one target for every other declared
    container port of those pods.
    """
    meta = endpoints["metadata"]
    ns = meta.get("namespace", "")
    group: Labels = {"__meta_kubernetes_namespace": ns, "__meta_kubernetes_endpoints_name": meta["name"]}
    group.update(_object_labels("endpoints", meta))
    service = services.get((ns, meta["name"]))
    if service is not None:
        group["__meta_kubernetes_service_name"] = service["metadata"]["name"]
        group.update(_object_labels("service", service["metadata"]))
    out: list[Labels] = []
    seen: dict[tuple[str, str], set[tuple[str, int]]] = {}
    for subset in endpoints.get("subsets") or []:
        for port in subset.get("ports") or []:
            for ready, key in (("true", "addresses"), ("false", "notReadyAddresses")):
                for addr in subset.get(key) or []:
                    labels = {
                        **group,
                        "__address__": _join_host_port(addr["ip"], port["port"]),
                        "__meta_kubernetes_endpoint_port_name": port.get("name", ""),
                        "__meta_kubernetes_endpoint_port_protocol": port.get("protocol", "TCP"),
                        "__meta_kubernetes_endpoint_ready": ready,
                    }
                    if addr.get("hostname"):
                        labels["__meta_kubernetes_endpoint_hostname"] = addr["hostname"]
                    if addr.get("nodeName"):
                        labels["__meta_kubernetes_endpoint_node_name"] = addr["nodeName"]
                    ref = addr.get("targetRef") or {}
                    if ref:
                        labels["__meta_kubernetes_endpoint_address_target_kind"] = ref.get("kind", "")
                        labels["__meta_kubernetes_endpoint_address_target_name"] = ref.get("name", "")
                    pod = (
                        pods.get((ref.get("namespace", ns), ref.get("name", ""))) if ref.get("kind") == "Pod" else None
                    )
                    if pod is not None:
                        labels.update(_pod_labels(pod))
                        used = seen.setdefault((ns, pod["metadata"]["name"]), set())
                        for container, cport in _container_ports(pod):
                            if (
                                cport
                                and cport["containerPort"] == port["port"]
                                and cport.get("protocol", "TCP") == port.get("protocol", "TCP")
                            ):
                                labels.update(_container_labels(container, cport))
                                used.add((container["name"], cport["containerPort"]))
                                break
                    out.append(labels)
    for (ns_, name), used in seen.items():
        pod = pods[(ns_, name)]
        ip = (pod.get("status") or {}).get("podIP", "")
        for container, cport in _container_ports(pod):
            if cport and ip and (container["name"], cport["containerPort"]) not in used:
                labels = {**group, **_pod_labels(pod), **_container_labels(container, cport)}
                labels["__address__"] = _join_host_port(ip, cport["containerPort"])
                out.append(labels)
    return out


def discover(kubectl: Sequence[str], role: str, namespaces: Sequence[str] = ()) -> list[Group]:
    """Target groups for ``role`` ("pod" or "endpoints") from the cluster ``kubectl`` (argv prefix) talks to."""
    items = _list(kubectl, "pods", namespaces)
    pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in items}
    if role == "pod":
        labels = [t for p in items for t in pod_targets(p)]
    elif role == "endpoints":
        services = {
            (s["metadata"]["namespace"], s["metadata"]["name"]): s for s in _list(kubectl, "services", namespaces)
        }
        labels = [t for e in _list(kubectl, "endpoints", namespaces) for t in endpoints_targets(e, services, pods)]
    else:
        raise ValueError(f"role must be pod or endpoints, not {role!r}")
    return [as_group(t) for t in labels]


def as_group(labels: Labels) -> Group:
    """One discovered label set as a file SD / HTTP SD target group."""
    return {"targets": [labels["__address__"]], "labels": {k: v for k, v in labels.items() if k != "__address__"}}


class DiscoveryServer:
    """HTTP SD endpoint on 127.0.0.1: ``GET /<role>?namespace=a&namespace=b`` -> target groups (JSON).

    ``with DiscoveryServer(lambda role, nss: discover(kubectl_argv, role, nss)) as sd: ... sd.url ...``
    The function is called on every request, so Prometheus (refresh_interval) sees pods come and go.
    """

    def __init__(self, groups: Callable[[str, list[str]], list[Group]]) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                role = url.path.strip("/")
                try:
                    body = json.dumps(groups(role, urllib.parse.parse_qs(url.query).get("namespace", []))).encode()
                    code = 200
                except Exception as err:  # reported to Prometheus (the target list stays as it was) and kept
                    outer.errors.append(f"{role}: {err}")
                    body, code = str(err).encode(), 500
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.errors: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> DiscoveryServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _list(kubectl: Sequence[str], resource: str, namespaces: Sequence[str]) -> list[Obj]:
    scopes = [["-n", ns] for ns in namespaces] or [["-A"]]
    items: list[Obj] = []
    for scope in scopes:
        res = subprocess.run(
            [*kubectl, "get", resource, *scope, "-o", "json"], check=False, capture_output=True, text=True, timeout=60
        )
        if res.returncode != 0:
            raise RuntimeError(f"kubectl get {resource} {' '.join(scope)}: {res.stderr.strip()}")
        items += json.loads(res.stdout)["items"]
    return items


def _object_labels(kind: str, meta: Obj) -> Labels:
    out: Labels = {}
    for what, values in (("label", meta.get("labels") or {}), ("annotation", meta.get("annotations") or {})):
        for key, value in values.items():
            out[f"__meta_kubernetes_{kind}_{what}_{sanitize_label_name(key)}"] = value
            out[f"__meta_kubernetes_{kind}_{what}present_{sanitize_label_name(key)}"] = "true"
    return out


def _pod_labels(pod: Obj) -> Labels:
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    ready = next((c.get("status", "") for c in status.get("conditions") or [] if c.get("type") == "Ready"), "unknown")
    labels: Labels = {
        "__meta_kubernetes_namespace": meta.get("namespace", ""),
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_ip": status.get("podIP", ""),
        "__meta_kubernetes_pod_ready": ready.lower(),
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        "__meta_kubernetes_pod_uid": meta.get("uid", ""),
        **_object_labels("pod", meta),
    }
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
    if owner:
        labels["__meta_kubernetes_pod_controller_kind"] = owner.get("kind", "")
        labels["__meta_kubernetes_pod_controller_name"] = owner.get("name", "")
    return labels


def _container_ports(pod: Obj) -> list[tuple[Obj, Obj | None]]:
    """(container, port) for every declared port, (container, None) for a container without ports; init last."""
    spec = pod.get("spec") or {}
    out: list[tuple[Obj, Obj | None]] = []
    for init, containers in ((False, spec.get("containers") or []), (True, spec.get("initContainers") or [])):
        for c in containers:
            c = {**c, "_init": init}
            ports = c.get("ports") or []
            out += [(c, p) for p in ports] if ports else [(c, None)]
    return out


def _container_labels(container: Obj, port: Obj | None) -> Labels:
    labels = {
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_image": container.get("image", ""),
        "__meta_kubernetes_pod_container_init": "true" if container.get("_init") else "false",
    }
    if port:
        labels["__meta_kubernetes_pod_container_port_name"] = port.get("name", "")
        labels["__meta_kubernetes_pod_container_port_number"] = str(port["containerPort"])
        labels["__meta_kubernetes_pod_container_port_protocol"] = port.get("protocol", "TCP")
    return labels


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
