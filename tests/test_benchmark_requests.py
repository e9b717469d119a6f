"""The benchmarks' request counts (benchmarks/operator_scale.py, benchmarks/tenant_load.py) keep the status code: a
pod create answered 409 (the pod was there already) is told apart from one answered 201 (issue 33's tenant load
made 2050 pod creates for 1050 pods, and only the code says how many were wasted)."""

from __future__ import annotations

from tests.scripts import load_script

#: The API server's and the operator's counters, as their /metrics say them.
APISERVER = """\
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",resource="pods",subresource="",verb="POST"} 1050
apiserver_request_total{code="409",resource="pods",subresource="",verb="POST"} 1000
apiserver_request_total{code="201",resource="pods",subresource="binding",verb="POST"} 1050
apiserver_request_total{code="200",resource="pods",subresource="status",verb="PATCH"} 7
apiserver_request_total{code="200",resource="pods",subresource="status",verb="PATCH",scope="resource"} 3
apiserver_request_total{code="200",resource="",subresource="",verb="GET"} 99
"""
OPERATOR = """\
# TYPE mlbench_operator_api_requests_total counter
mlbench_operator_api_requests_total{verb="POST",resource="pods",code="201"} 1050.0
mlbench_operator_api_requests_total{verb="POST",resource="pods",code="409"} 1000.0
mlbench_operator_api_requests_total{verb="GET",resource="pods",code="200"} 1033.0
"""


def test_the_api_servers_requests_are_keyed_by_code() -> None:
    scale = load_script("benchmarks/operator_scale.py")
    assert scale.apiserver_requests(APISERVER) == {
        "POST pods 201": 1050.0,
        "POST pods 409": 1000.0,
        "POST pods/binding 201": 1050.0,
        "PATCH pods/status 200": 10.0,  # summed over the labels not kept (scope)
    }


def test_the_operators_requests_are_keyed_by_code() -> None:
    scale = load_script("benchmarks/operator_scale.py")
    counts = scale.metric_sums(OPERATOR, "mlbench_operator_api_requests_total", *scale.REQUEST_LABELS)
    assert counts == {"POST pods 201": 1050.0, "POST pods 409": 1000.0, "GET pods 200": 1033.0}


def test_the_tenant_loads_pod_creates_by_code() -> None:
    load = load_script("benchmarks/tenant_load.py")
    scale = load_script("benchmarks/operator_scale.py")
    requests = scale.apiserver_requests(APISERVER)
    assert load.by_code(requests, "POST pods") == {"201": 1050, "409": 1000}  # not pods/binding
    assert load.by_code(requests, "PATCH pods") == {}
    assert load.by_verb(requests) == {"PATCH": 10, "POST": 3100}
