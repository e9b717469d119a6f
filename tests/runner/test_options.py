"""The ``MLBENCH_*`` execution knobs: one declaration, parsed, forwarded by the launcher and documented."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mlbench_runner.options import KNOBS, TRACE_GOSSIP, Knob, Options, knob_names, knob_table
from mlbench_runner.pod.launch import FORWARD_ENV, LAUNCHER_ENV

from .helpers import env

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runner.md"


def knob(name: str) -> Knob:
    return next(k for k in KNOBS if k.env == name)


def test_defaults_without_environment() -> None:
    assert Options.from_env({}) == Options()
    assert Options().dtype is torch.float32


def test_empty_values_are_the_defaults() -> None:
    assert Options.from_env({k.env: "" for k in KNOBS}) == Options()


def test_every_field_has_one_knob_and_the_declared_defaults_are_the_fields() -> None:
    fields = {f.name: f for f in dataclasses.fields(Options)}
    declared = [k.field for k in KNOBS if k.field is not None]
    assert sorted(declared) == sorted(fields), "Options' fields and the knobs that set them differ"
    assert len(set(knob_names())) == len(KNOBS)
    defaults = Options()
    for k in KNOBS:
        if k.field is not None:
            assert k.read({}) == getattr(defaults, k.field), k.env
        assert k.env.startswith("MLBENCH_"), k.env
        assert k.doc, k.env
        assert "|" not in k.doc, f"{k.env}: a | would split the docs table's row"
        assert k.choices or k.values, f"{k.env}: the table needs its allowed values"
        if k.default is not None:
            k.parse(k.default)  # the declared default is itself a valid value


#: (variable, value, the field's value): every knob that sets a field, at least once.
PARSED: list[tuple[str, str, object]] = [
    ("MLBENCH_DTYPE", "float64", torch.float64),
    ("MLBENCH_DTYPE", "float32", torch.float32),
    ("MLBENCH_PRECISION", "bf16", "bf16"),
    ("MLBENCH_CHANNELS_LAST", "1", True),
    ("MLBENCH_CHANNELS_LAST", "0", False),
    ("MLBENCH_FAST_PATH", "auto", "auto"),
    ("MLBENCH_FAST_PATH", "on", "on"),
    ("MLBENCH_FAST_PATH", "off", "off"),
    ("MLBENCH_COMPILE", "1", "1"),
    ("MLBENCH_COMPILE", "0", "0"),
    ("MLBENCH_COMPILE", "auto", "auto"),
    ("MLBENCH_CUDNN_BENCHMARK", "0", False),
    ("MLBENCH_PROCESS_GROUP", "1", True),
    ("MLBENCH_PHASE_TIMING", "0", False),
    ("MLBENCH_MAX_STEPS", "7", 7),
    ("MLBENCH_TRACE_PARAMS", "1", True),
    ("MLBENCH_THREADS", "3", 3),
    ("MLBENCH_METRICS_LINGER_SECONDS", "2.5", 2.5),
    ("MLBENCH_METRICS_LINGER_SECONDS", "0", 0.0),
]


@pytest.mark.parametrize(("name", "raw", "value"), PARSED)
def test_each_knob_sets_its_field(name: str, raw: str, value: object) -> None:
    field = knob(name).field
    assert field is not None
    opts = Options.from_env({name: raw})
    assert getattr(opts, field) == value
    assert dataclasses.replace(opts, **{field: getattr(Options(), field)}) == Options(), "only its own field"


def test_every_knob_with_a_field_is_covered_above() -> None:
    covered = {name for name, _, _ in PARSED}
    assert covered == {k.env for k in KNOBS if k.field is not None}


def test_trace_gossip_is_read_where_it_is_used() -> None:
    assert TRACE_GOSSIP in KNOBS
    assert TRACE_GOSSIP.field is None
    assert TRACE_GOSSIP.read({}) is None
    assert TRACE_GOSSIP.read({"MLBENCH_TRACE_GOSSIP": "/tmp/g"}) == "/tmp/g"


def test_from_env_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLBENCH_FAST_PATH", "off")
    monkeypatch.setenv("MLBENCH_MAX_STEPS", "4")
    opts = Options.from_env()
    assert (opts.fast_path, opts.max_steps) == ("off", 4)


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("MLBENCH_DTYPE", "float16", "MLBENCH_DTYPE: 'float16' is not float32 or float64"),
        ("MLBENCH_PRECISION", "fp16", "MLBENCH_PRECISION: 'fp16' is not fp32 or bf16"),
        ("MLBENCH_CHANNELS_LAST", "yes", "MLBENCH_CHANNELS_LAST: 'yes' is not 0 or 1"),
        ("MLBENCH_FAST_PATH", "maybe", "MLBENCH_FAST_PATH: 'maybe' is not auto or on or off"),
        ("MLBENCH_FAST_PATH", "ON", "MLBENCH_FAST_PATH: 'ON' is not auto or on or off"),
        ("MLBENCH_PHASE_TIMING", "off", "MLBENCH_PHASE_TIMING: 'off' is not 0 or 1"),
        ("MLBENCH_MAX_STEPS", "ten", "MLBENCH_MAX_STEPS: 'ten' is not an integer"),
        ("MLBENCH_MAX_STEPS", "2.5", "MLBENCH_MAX_STEPS: '2.5' is not an integer"),
        ("MLBENCH_MAX_STEPS", "0", "MLBENCH_MAX_STEPS: '0' is below 1"),
        ("MLBENCH_TRACE_PARAMS", "true", "MLBENCH_TRACE_PARAMS: 'true' is not 0 or 1"),
        ("MLBENCH_THREADS", "-1", "MLBENCH_THREADS: '-1' is below 1"),
        ("MLBENCH_METRICS_LINGER_SECONDS", "-1", "MLBENCH_METRICS_LINGER_SECONDS: '-1' is below 0"),
        ("MLBENCH_METRICS_LINGER_SECONDS", "soon", "MLBENCH_METRICS_LINGER_SECONDS: 'soon' is not a number"),
        ("MLBENCH_METRICS_LINGER_SECONDS", "inf", "MLBENCH_METRICS_LINGER_SECONDS: 'inf' is not a finite number"),
    ],
)
def test_a_bad_value_names_the_variable(name: str, raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}: ") as err:
        Options.from_env({name: raw})
    assert str(err.value) == message


def test_the_launcher_forwards_every_knob_and_its_own_variables() -> None:
    for name in knob_names():
        assert name in FORWARD_ENV, f"{name} would not reach the ranks under mpirun"
    for name in ("MLBENCH_RUN_CONFIG", "MASTER_ADDR", "MASTER_PORT", "MLBENCH_HOSTFILE", "MLBENCH_CACHE"):
        assert name in LAUNCHER_ENV
        assert name in FORWARD_ENV
    assert "MLBENCH_DATA_DIR" in FORWARD_ENV
    assert not set(LAUNCHER_ENV) & set(knob_names()), "a launcher variable is declared as a knob as well"
    assert len(set(FORWARD_ENV)) == len(FORWARD_ENV)


@pytest.mark.multiproc
def test_the_launcher_and_the_declaration_do_not_import_torch() -> None:
    """The launcher pod (and ``mlbench-runner fetch-dataset``/``netem``, whose parsers it builds) stays light."""
    code = "import sys, mlbench_runner.pod.launch, mlbench_runner.options; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], env=env(), check=True, timeout=60)


def test_the_docs_table_is_the_declaration() -> None:
    text = DOCS.read_text()
    start = text.index("<!-- knobs:start")
    table = text[text.index("\n", start) + 1 : text.index("<!-- knobs:end -->")]
    assert table == knob_table(), (
        "docs/runner.md's knob table differs from mlbench_runner.options.KNOBS: "
        "replace it with the output of `python -m mlbench_runner.options`"
    )
    for name in knob_names():
        assert f"| `{name}` |" in table, f"{name} is missing from docs/runner.md"
