"""OperatorConfig: parsed once from the environment, handed to kopf in the memo, read by the handlers.

(The ``MLBENCH_DATASET_*`` rules themselves are in test_datasets.py, the admission policy's in
test_policy.py, the leader election's in test_leader.py.)
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import kopf
import pytest

from mlbench_api import contract
from mlbench_operator.env import SettingsError
from mlbench_operator.policy import AdmissionPolicy
from mlbench_operator.settings import DatasetSettings, OperatorConfig

#: Every variable OperatorConfig reads (plus POD_NAMESPACE): cleared so the developer's shell does not leak in.
VARIABLES = (
    "MLBENCH_DATASET_VOLUME",
    "MLBENCH_DATASET_STORAGE_CLASS",
    "MLBENCH_DATASET_VOLUME_SIZE",
    "MLBENCH_DATASET_ACCESS_MODE",
    "MLBENCH_DATASET_FETCH_DEADLINE_SECONDS",
    "MLBENCH_DATASET_JOB_TTL_SECONDS",
    "MLBENCH_DATASET_BACKOFF_LIMIT",
    "MLBENCH_FETCH_IMAGE",
    "MLBENCH_RUNNER_IMAGE",
    "MLBENCH_METRICS_LINGER_SECONDS",
    "MLBENCH_RESULTS_WAIT_SECONDS",
    "MLBENCH_RESULTS_MAX_BYTES",
    "MLBENCH_ALLOWED_IMAGES",
    "MLBENCH_ALLOWED_PRIORITY_CLASSES",
    "MLBENCH_ALLOWED_VOLUME_TYPES",
    "MLBENCH_ALLOW_CONTROL_PLANE",
    "MLBENCH_ALLOW_NETWORK_EMULATION",
    "MLBENCH_ALLOWED_ENV",
    "MLBENCH_ALLOWED_POD_ANNOTATIONS",
    "MLBENCH_ALLOWED_POD_LABELS",
    "MLBENCH_ALLOWED_EXTENDED_RESOURCES",
    "MLBENCH_ALLOW_HOST_NETWORK",
    "MLBENCH_ALLOW_HOST_IPC",
    "MLBENCH_METRICS_NAMESPACES",
    "MLBENCH_METRICS_CIDRS",
    "MLBENCH_FETCH_EGRESS_CIDRS",
    "POD_NAMESPACE",
    "MLBENCH_RUNNER_UID",
    "MLBENCH_RUN_SELECTOR",
    "MLBENCH_METRICS_PORT",
    "MLBENCH_RESYNC_SECONDS",
    "MLBENCH_NAMESPACE_SYNC_SECONDS",
    "MLBENCH_DEBOUNCE_SECONDS",
    "MLBENCH_CREATE_SLOTS",
    "MLBENCH_SHM_SIZE_LIMIT",
    "MLBENCH_OUTPUT_SIZE_LIMIT",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in VARIABLES:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_defaults_are_an_empty_environment() -> None:
    """The handlers' fallback (no memo config: unit tests) is what an unset environment means."""
    config = OperatorConfig.from_env({})
    assert config == OperatorConfig()
    assert config.datasets == DatasetSettings()
    assert config.policy == AdmissionPolicy()
    assert config.runner_uid == contract.RUNNER_UID
    assert config.metrics_linger_seconds == contract.METRICS_LINGER_SECONDS
    assert (config.metrics_port, config.run_selector) == (8080, "")
    assert (config.resync_seconds, config.debounce_seconds) == (300.0, 0.3)
    assert config.create_slots == 16
    assert config.scraper_namespaces == ("mlbench-system", "monitoring")


def test_from_env() -> None:
    config = OperatorConfig.from_env(
        {
            "MLBENCH_DATASET_ACCESS_MODE": "ReadWriteMany",
            "MLBENCH_METRICS_LINGER_SECONDS": "0",
            "MLBENCH_RESULTS_WAIT_SECONDS": "1",
            "MLBENCH_ALLOW_CONTROL_PLANE": "true",
            "MLBENCH_METRICS_NAMESPACES": "prom, grafana",
            "POD_NAMESPACE": "ops",
            "MLBENCH_RUNNER_UID": " image ",
            "MLBENCH_RUN_SELECTOR": " team=a ",
            "MLBENCH_METRICS_PORT": "0",
            "MLBENCH_RESYNC_SECONDS": "60",
            "MLBENCH_NAMESPACE_SYNC_SECONDS": "5",
            "MLBENCH_DEBOUNCE_SECONDS": "0",
            "MLBENCH_CREATE_SLOTS": "3",
        }
    )
    assert config.create_slots == 3
    assert config.namespace_sync_seconds == 5.0
    assert config.datasets.access_mode == "ReadWriteMany"
    assert (config.metrics_linger_seconds, config.results_wait_seconds) == (0, 1.0)
    assert config.policy.allow_control_plane
    assert config.scraper_namespaces == ("grafana", "ops", "prom")
    assert config.runner_uid is None
    assert (config.run_selector, config.metrics_port) == ("team=a", 0)
    assert (config.resync_seconds, config.debounce_seconds) == (60.0, 0.0)
    assert OperatorConfig.from_env({"MLBENCH_RUNNER_UID": "1"}).runner_uid == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.metrics_port = 1  # type: ignore[misc]


#: One bad value per setting OperatorConfig gathers: the message names the variable.
BAD = [
    ({"MLBENCH_DATASET_ACCESS_MODE": "ReadWriteMani"}, "MLBENCH_DATASET_ACCESS_MODE='ReadWriteMani'"),
    ({"MLBENCH_METRICS_LINGER_SECONDS": "-1"}, "MLBENCH_METRICS_LINGER_SECONDS='-1' must be at least 0"),
    ({"MLBENCH_RESULTS_WAIT_SECONDS": "a while"}, "MLBENCH_RESULTS_WAIT_SECONDS='a while' is not an integer"),
    ({"MLBENCH_RESULTS_MAX_BYTES": "1000"}, "MLBENCH_RESULTS_MAX_BYTES='1000' must be at least 65536"),
    ({"MLBENCH_ALLOW_CONTROL_PLANE": "maybe"}, "MLBENCH_ALLOW_CONTROL_PLANE='maybe'"),
    ({"MLBENCH_METRICS_NAMESPACES": "Bad_NS"}, "MLBENCH_METRICS_NAMESPACES: 'Bad_NS'"),
    ({"MLBENCH_RUNNER_UID": "runner"}, "MLBENCH_RUNNER_UID='runner' is not a UID"),
    ({"MLBENCH_RUNNER_UID": "-5"}, "MLBENCH_RUNNER_UID='-5' must be at least 1"),
    # root with runAsNonRoot: pods the kubelet refuses forever ('image' is how to run as root)
    ({"MLBENCH_RUNNER_UID": "0"}, "MLBENCH_RUNNER_UID=0 is root, but runner pods run with runAsNonRoot"),
    ({"MLBENCH_METRICS_PORT": "http"}, "MLBENCH_METRICS_PORT='http' is not an integer"),
    ({"MLBENCH_METRICS_PORT": "70000"}, "MLBENCH_METRICS_PORT=70000 is not a TCP port"),
    ({"MLBENCH_RESYNC_SECONDS": "0"}, "MLBENCH_RESYNC_SECONDS='0' must be greater than 0"),
    ({"MLBENCH_NAMESPACE_SYNC_SECONDS": "0"}, "MLBENCH_NAMESPACE_SYNC_SECONDS='0' must be greater than 0"),
    ({"MLBENCH_RESYNC_SECONDS": "inf"}, "MLBENCH_RESYNC_SECONDS='inf' must be greater than 0"),
    ({"MLBENCH_DEBOUNCE_SECONDS": "-0.1"}, "MLBENCH_DEBOUNCE_SECONDS='-0.1' must be at least 0"),
    ({"MLBENCH_CREATE_SLOTS": "0"}, "MLBENCH_CREATE_SLOTS='0' must be at least 1"),
    ({"MLBENCH_CREATE_SLOTS": "many"}, "MLBENCH_CREATE_SLOTS='many' is not an integer"),
    ({"MLBENCH_DEBOUNCE_SECONDS": "short"}, "MLBENCH_DEBOUNCE_SECONDS='short' is not a number of seconds"),
]


@pytest.mark.parametrize(("env", "needle"), BAD)
def test_bad_settings_name_the_variable(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError) as info:
        OperatorConfig.from_env(env)
    assert needle in str(info.value)


# -- mlbench-operator (main.py): validates, then hands the config to kopf in the memo -------------------
@pytest.mark.parametrize(("env", "needle"), BAD)
def test_main_refuses_a_bad_setting_with_exit_2(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], env: dict[str, str], needle: str
) -> None:
    from mlbench_operator import main

    for key, value in env.items():
        clean_env.setenv(key, value)
    assert main.main(["--liveness=", "--no-leader-elect"]) == 2
    assert needle in capsys.readouterr().err


@pytest.fixture
def no_kopf(clean_env: pytest.MonkeyPatch) -> dict[str, Any]:
    """main() with kopf's task spawning replaced: what it would have been given."""
    from mlbench_operator import logs
    from mlbench_operator import metrics as m

    given: dict[str, Any] = {}

    async def spawn_tasks(**kwargs: Any) -> list[Any]:
        given.update(kwargs)
        return []

    async def run_tasks(tasks: Any, ignored: Any = None) -> None:
        return None

    clean_env.setattr(kopf, "spawn_tasks", spawn_tasks)
    clean_env.setattr(kopf, "run_tasks", run_tasks)
    clean_env.setattr(logs, "configure", lambda: None)  # it would take over the root logger (pytest's capture)
    clean_env.setattr(m, "LEADER", type("Gauge", (), {"set": lambda self, v: None})())
    return given


def test_main_passes_the_config_in_the_memo(no_kopf: dict[str, Any], clean_env: pytest.MonkeyPatch) -> None:
    from mlbench_operator import main

    clean_env.setenv("MLBENCH_RUNNER_UID", "image")
    clean_env.setenv("MLBENCH_RUN_SELECTOR", "from=env")
    clean_env.setenv("MLBENCH_METRICS_PORT", "0")
    clean_env.setenv("MLBENCH_DEBOUNCE_SECONDS", "0.2")
    assert main.main(["--liveness=", "--no-leader-elect", "-n", "team-a"]) == 0
    memo = no_kopf["memo"]
    assert isinstance(memo, kopf.Memo)
    config = memo.config
    assert isinstance(config, OperatorConfig)
    assert config == dataclasses.replace(
        OperatorConfig(),
        runner_uid=None,
        run_selector="from=env",
        metrics_port=0,
        debounce_seconds=0.2,
        namespaces=("team-a",),  # for the pod watches, as kopf's namespaces
    )
    assert memo.metrics_started is False
    # kopf itself watches no namespace (a pattern none matches); the gate (nsgate) hands it the readable ones
    assert no_kopf["namespaces"] == [main.NO_NAMESPACE]
    assert not main.NO_NAMESPACE.search("team-a")
    assert no_kopf["insights"] is memo.insights
    assert not memo.insights.namespaces


def test_main_flags_win_over_the_environment(no_kopf: dict[str, Any], clean_env: pytest.MonkeyPatch) -> None:
    from mlbench_operator import main

    clean_env.setenv("MLBENCH_RUN_SELECTOR", "from=env")
    clean_env.setenv("MLBENCH_METRICS_PORT", "9999")
    assert main.main(["--liveness=", "--no-leader-elect", "--metrics-port=0", "--selector= from=flag "]) == 0
    config = no_kopf["memo"].config
    assert (config.metrics_port, config.run_selector) == (0, "from=flag")


# -- the startup handler: uses the memo's config, or parses the environment (kopf run without main.py) --------
class _SyncedWatch:
    """Stands in for podwatch.PodWatch (as handlers.configure sees it): no thread, no API; listed at once."""

    started: list[str | None] = []

    def __init__(self, *args: Any, namespace: str | None, timeout_seconds: int) -> None:
        self.namespace = namespace
        self.synced = asyncio.Event()
        self.error: int | None = None  # the latest failure's HTTP status (nsgate reads it)

    def start(self) -> None:
        _SyncedWatch.started.append(self.namespace)
        self.synced.set()


def _configure(memo: kopf.Memo, monkeypatch: pytest.MonkeyPatch) -> kopf.OperatorSettings:
    from mlbench_operator import handlers, logs

    monkeypatch.setattr(logs, "configure", lambda: None)
    monkeypatch.setattr(handlers, "PodWatch", _SyncedWatch)
    _SyncedWatch.started.clear()
    settings = kopf.OperatorSettings()
    fn: Any = getattr(handlers.configure, "__wrapped__", handlers.configure)
    asyncio.run(fn(settings=settings, memo=memo))
    return settings


def _selector(settings: kopf.OperatorSettings) -> str | None:
    from mlbench_api.common import GROUP

    return settings.watching.label_selectors.get((GROUP, "benchmarkruns"))


def test_startup_keeps_the_config_main_gave(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("MLBENCH_RUN_SELECTOR", "from=env")
    clean_env.setenv("MLBENCH_RUNNER_UID", "not read")  # would fail if the environment were parsed again
    given = OperatorConfig(run_selector="from=main", metrics_port=0)
    memo = kopf.Memo(kube=object(), config=given)
    settings = _configure(memo, clean_env)
    assert memo.config is given
    assert _selector(settings) == "from=main"


class _LateWatch(_SyncedWatch):
    """A pod watch whose first listing has not come back yet: the test says when it has."""

    def start(self) -> None:
        _SyncedWatch.started.append(self.namespace)


def test_startup_watches_the_pods_of_each_namespace(clean_env: pytest.MonkeyPatch) -> None:
    """One pod watch per namespace served (one cluster-wide without any), and startup ends only once every one
    has listed its pods (kopf starts the runs' daemons after it: they must find every pod)."""
    from mlbench_operator import handlers, logs

    clean_env.setattr(logs, "configure", lambda: None)
    clean_env.setattr(handlers, "PodWatch", _LateWatch)
    _SyncedWatch.started.clear()
    memo = kopf.Memo(kube=object(), config=OperatorConfig(metrics_port=0, namespaces=("a", "b")))
    fn: Any = getattr(handlers.configure, "__wrapped__", handlers.configure)

    async def startup() -> None:
        task = asyncio.create_task(fn(settings=kopf.OperatorSettings(), memo=memo))
        for _ in range(10):
            await asyncio.sleep(0)
        assert _SyncedWatch.started == ["a", "b"]
        assert not task.done()  # neither has listed
        memo.pod_watches[0].synced.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert not task.done()  # "b" has not
        memo.pod_watches[1].synced.set()
        await asyncio.wait_for(task, timeout=5)

    asyncio.run(startup())
    _configure(kopf.Memo(kube=object(), config=OperatorConfig(metrics_port=0)), clean_env)
    assert _SyncedWatch.started == [None]


def test_startup_without_main_parses_the_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("MLBENCH_RUN_SELECTOR", "from=env")
    clean_env.setenv("MLBENCH_METRICS_PORT", "0")
    clean_env.setenv("MLBENCH_RESYNC_SECONDS", "42")
    memo = kopf.Memo(kube=object())
    settings = _configure(memo, clean_env)
    from mlbench_operator.runtime import config_of

    assert config_of(memo) is memo.config
    assert (memo.config.run_selector, memo.config.resync_seconds) == ("from=env", 42.0)
    assert _selector(settings) == "from=env"


def test_startup_without_main_stops_on_a_bad_setting(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("MLBENCH_RESYNC_SECONDS", "soon")
    with pytest.raises(kopf.PermanentError, match="MLBENCH_RESYNC_SECONDS='soon'"):
        _configure(kopf.Memo(kube=object()), clean_env)


def test_handlers_without_a_configured_memo_use_the_defaults() -> None:
    from mlbench_operator.runtime import DEFAULT_CONFIG, config_of

    assert config_of(None) is DEFAULT_CONFIG
    assert config_of(kopf.Memo()) is DEFAULT_CONFIG
    assert config_of(type("Memo", (), {"kube": None})()) is DEFAULT_CONFIG
    assert OperatorConfig() == DEFAULT_CONFIG


@pytest.mark.parametrize(
    ("size", "valid"),
    [
        ("20Gi", True),
        ("500G", True),
        ("+20Gi", True),  # Kubernetes' quantity grammar (mlbench_api.common.QUANTITY), the CRDs' own
        (".5Gi", True),
        ("1.5Ti", True),
        ("1e9", True),
        ("20GB", False),
        ("20 Gi", False),
        ("-20Gi", False),
        ("lots", False),
        ("", False),
    ],
)
def test_the_dataset_volume_size_is_a_kubernetes_quantity(size: str, valid: bool) -> None:
    env = {"MLBENCH_DATASET_VOLUME_SIZE": size}
    if valid:
        assert DatasetSettings.from_env(env).size == size
    else:
        with pytest.raises(SettingsError, match="MLBENCH_DATASET_VOLUME_SIZE"):
            DatasetSettings.from_env(env)


def test_startup_lists_in_pages_and_hands_the_probe_to_kopf(clean_env: pytest.MonkeyPatch) -> None:
    """Issue 33: kopf's own listings are paginated like the operator's (kube.PAGE_SIZE), and the startup handler
    stops leader election's probe endpoint only once the pods are listed (kopf serves the probe next)."""
    from mlbench_operator import handlers
    from mlbench_operator.kube import PAGE_SIZE

    stopped: list[bool] = []

    async def stop_standby_probe() -> None:
        stopped.append(True)

    memo = kopf.Memo(kube=object(), config=OperatorConfig(metrics_port=0))
    setattr(memo, handlers.STANDBY_PROBE, stop_standby_probe)  # as main's handover does
    settings = _configure(memo, clean_env)
    assert settings.watching.chunk_size == PAGE_SIZE
    assert stopped == [True]
