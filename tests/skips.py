"""Pytest plugin: in CI a skip is a failure, unless this machine cannot run the test at all.

``.ci/run`` sets ``MLBENCH_NO_SKIP=1``. Then a test that skips (``pytest.skip``, a ``skipif`` mark,
``importorskip``) is reported as failed, with its reason, unless the reason starts with one of
:data:`MACHINE_LIMITS`: what no package, ``make`` target or test cluster of this project can provide on
a CI machine. A missing dataset, image builder, Prometheus, ``mpirun`` or real node is not such a limit:
``make install`` and ``make test`` provide them, and a test that skips for want of them would hide that
they broke. Expected failures (``xfail``) are not skips and are left alone.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

#: the environment variable that turns skips into failures (set by .ci/run)
NO_SKIP = "MLBENCH_NO_SKIP"

#: skip reasons allowed under NO_SKIP (a reason must start with one), each with why the machine cannot lift it
MACHINE_LIMITS: dict[str, str] = {
    "needs a GPU": "CI machines have no GPU; the GPU paths run on the device machine (hack/gpu-run.sh)",
    "this kernel has no netem qdisc": "a kernel module (sch_netem) that a container cannot load",
    "this promtool is built without Kubernetes SD": (
        "Debian's promtool; the service discovery is tested through http_sd_url (tests/monitoring/k8s_sd.py)"
    ),
}


def allowed(reason: str) -> bool:
    """Whether a skip with this reason is allowed in CI."""
    return reason.startswith(tuple(MACHINE_LIMITS))


def skip_reason(report: pytest.TestReport) -> str:
    """The reason pytest recorded for a skipped report (its longrepr is (path, line, reason))."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # pytest's (path, lineno, message)
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not os.environ.get(NO_SKIP) or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    if allowed(reason):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped in CI ({NO_SKIP}=1): {reason}\n"
        f"A skip is allowed here only when the machine cannot run the test: {sorted(MACHINE_LIMITS)} (tests/skips.py)."
    )
