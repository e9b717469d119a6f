"""The leader election's one Lease: GET/POST/PUT over the kubernetes client's transport. Writes carry the
resourceVersion read, so of two replicas writing at once one gets 409 Conflict and stays standby.
"""

from __future__ import annotations

import json
from typing import Any, Protocol
from urllib.parse import quote

from kubernetes import client as k8s

from mlbench_operator.env import SettingsError
from mlbench_operator.kube import USER_AGENT, ApiError, load_configuration
from mlbench_operator.leasedecision import Spec


class LeaseClient(Protocol):
    """One Lease's GET/POST/PUT, blocking (what :class:`Elector` needs; a fake in the unit tests)."""

    def get(self) -> dict[str, Any] | None: ...
    def create(self, spec: Spec) -> dict[str, Any] | None: ...
    def update(self, spec: Spec, resource_version: str) -> dict[str, Any] | None: ...
    def close(self) -> None: ...


class LeaseNamespaceMissing(SettingsError):
    """The Lease's namespace does not exist (a create answered 404): no replica can ever lead there. Not a
    lost race (409): standing by would reconcile nothing, for ever, in silence."""

    def __init__(self, namespace: str) -> None:
        super().__init__(
            f"the leader-election Lease's namespace {namespace!r} does not exist: create it "
            "(manifests/operator/namespace.yaml), set MLBENCH_LEADER_ELECTION_NAMESPACE to a namespace where the "
            "operator may create Leases, or run one replica with --no-leader-elect"
        )
        self.namespace = namespace


class LeaseApi:
    """The Lease over the kubernetes client's transport (configured like :mod:`.kube`).

    Its own client and a request timeout of half the renew deadline (at least 1 s), as
    controller-runtime does: a hung request must not eat the whole renew deadline. Not counted in
    ``mlbench_operator_api_requests_total`` (the reconciler's requests).
    """

    def __init__(self, namespace: str, name: str, timeout: float, configuration: Any = None) -> None:
        self.api = k8s.ApiClient(configuration or load_configuration())
        self.api.user_agent = f"{USER_AGENT} leader-election"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
        self.namespace = namespace
        self.name = name
        self.timeout = max(1.0, timeout)

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        _, url, headers, data, post = self.api.param_serialize(
            method=method,
            resource_path=path,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(method, url, headers, data, post, _request_timeout=(self.timeout, self.timeout))
        except k8s.ApiException as exc:  # the client's own error for an HTTP status
            status, text = int(exc.status or 0), str(exc.body or exc.reason or "")
        else:
            raw = resp.read()
            status, text = resp.status, raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
        if status in (404, 409):
            return status, None
        if not 200 <= status < 300:
            raise ApiError(status, method, path, text)
        return status, json.loads(text) if text else None

    def _body(self, spec: Spec, resource_version: str = "") -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def get(self) -> dict[str, Any] | None:
        """The Lease; None when it does not exist."""
        _, lease = self._request("GET", f"{self.collection}/{quote(self.name)}")
        return lease

    def create(self, spec: Spec) -> dict[str, Any] | None:
        """The created Lease; None when another replica created it first (409). A 404 is not that: the
        namespace does not exist (:class:`LeaseNamespaceMissing`)."""
        status, lease = self._request("POST", self.collection, self._body(spec))
        if status == 404:
            raise LeaseNamespaceMissing(self.namespace)
        return lease

    def update(self, spec: Spec, resource_version: str) -> dict[str, Any] | None:
        """The written Lease; None on a conflict (someone wrote since we read) or when it is gone."""
        _, lease = self._request("PUT", f"{self.collection}/{quote(self.name)}", self._body(spec, resource_version))
        return lease

    def close(self) -> None:
        self.api.close()
