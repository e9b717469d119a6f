"""The figures of ``mlbench results``: matplotlib when installed, the hand-written SVG otherwise; captions."""

from __future__ import annotations

import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from mlbench_api import BenchmarkRun
from mlbench_api.catalog import load_catalog
from mlbench_api.config import effective_config
from mlbench_runner.tools import plots, report
from mlbench_runner.tools.runs import LoadedRun, load_run, load_summary

from .helpers import resnet_task, run_doc
from .test_report import fake_run, sweep

SVG = "{http://www.w3.org/2000/svg}"
DC = "{http://purl.org/dc/elements/1.1/}"
ALL = ("accuracy-vs-time", "phase-split", "speedup-vs-workers", "cost-vs-workers")


def texts(path: Path) -> list[str]:
    root = ElementTree.parse(path).getroot()  # well-formed XML
    assert root.tag == f"{SVG}svg"
    return [" ".join(t.itertext()) for t in root.iter(f"{SVG}text")]  # a wrapped name: its lines joined


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import matplotlib`` fails, as where the optional extra is not installed."""
    monkeypatch.delenv(plots.BACKEND_ENV, raising=False)
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.fixture
def with_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib", reason="the optional 'plots' extra (make install) is not installed")
    monkeypatch.delenv(plots.BACKEND_ENV, raising=False)


def test_matplotlib_draws_every_figure_with_its_caption(
    tmp_path: Path, with_matplotlib: None, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sweep(tmp_path / "sweep")
    assert plots.backend() == "matplotlib"
    assert report.main([str(root), "--price-per-worker-hour", "2.5"]) == 0
    out = capsys.readouterr().out
    for name in ALL:
        path = root / f"{name}.svg"
        assert f"wrote {path}" in out
        text = path.read_text()
        assert "Matplotlib" in text  # drawn by matplotlib, not the fallback
        lines = texts(path)
        assert any(t.startswith("Data: test-task: SYNTHETIC epsilon stand-in (not epsilon") for t in lines), lines
        assert any("(open division)" in t for t in lines)
        assert any(t.startswith("This machine's measurement (cpu Test CPU; 8 runs)") for t in lines)
        meta = ElementTree.parse(path).getroot().find(f".//{DC}description")
        assert meta is not None
        assert meta.text is not None
        assert meta.text.startswith("Data: test-task: SYNTHETIC epsilon stand-in")
    assert "ideal (linear)" in texts(root / "speedup-vs-workers.svg")
    assert "communication" in texts(root / "phase-split.svg")


def test_matplotlib_png_carries_the_caption_in_its_metadata(tmp_path: Path, with_matplotlib: None) -> None:
    from PIL import Image

    root = sweep(tmp_path / "sweep")
    assert report.main([str(root), "--plots", str(tmp_path / "png"), "--plot-format", "png"]) == 0
    names = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert names == ["accuracy-vs-time.png", "phase-split.png", "speedup-vs-workers.png"]  # no price: no cost plot
    with Image.open(tmp_path / "png" / "accuracy-vs-time.png") as image:
        assert image.info["Description"].startswith("Data: test-task: SYNTHETIC epsilon stand-in")
        assert image.size[0] > 600


def test_the_svg_fallback_without_matplotlib(
    tmp_path: Path, no_matplotlib: None, capsys: pytest.CaptureFixture[str]
) -> None:
    root = sweep(tmp_path / "sweep")
    assert plots.backend() == "svg"
    assert report.main([str(root), "--price-per-worker-hour", "2.5", "--plot-format", "png"]) == 0
    captured = capsys.readouterr()
    assert "matplotlib is not installed: writing SVG instead of png" in captured.err
    for name in ALL:
        path = root / f"{name}.svg"
        assert path.stat().st_size > 500
        assert "Matplotlib" not in path.read_text()
        lines = texts(path)
        assert any(t.startswith("Data: test-task: SYNTHETIC epsilon stand-in") for t in lines), lines
        assert any(t.startswith("This machine's measurement") for t in lines)
    assert any(t.startswith("ideal") for t in texts(root / "speedup-vs-workers.svg"))


@pytest.mark.parametrize("backend", ["svg", "matplotlib"])
def test_one_local_run_as_mlbench_run_local_plots_it(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``mlbench run --local`` calls (report.write_plots) and what tests/runner/test_local.py checks."""
    if backend == "matplotlib":
        pytest.importorskip("matplotlib")
    monkeypatch.setenv(plots.BACKEND_ENV, backend)
    out = fake_run(tmp_path, "one", ttg=4.0, task=resnet_task(tmp_path / "data", subset=64))
    paths = report.write_plots([(out, load_summary(out))], out)
    assert [p.name for p in paths] == ["accuracy-vs-time.svg", "phase-split.svg"]  # one world size: no speedup
    lines = texts(out / "accuracy-vs-time.svg")
    assert any(
        t.startswith("Data: test-task: cifar10-fake (cifar10-python format), first 64 train samples (open division)")
        for t in lines
    ), lines


def test_the_environment_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plots.BACKEND_ENV, "svg")
    assert plots.backend() == "svg"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setenv(plots.BACKEND_ENV, "matplotlib")
    with pytest.raises(ImportError):
        plots.backend()


def test_captions_name_the_data_of_the_catalog_tasks() -> None:
    catalog = load_catalog()

    def describe(task: str) -> str:
        run = BenchmarkRun.model_validate(run_doc("r", task, 2))
        return plots.dataset_description(effective_config(run, task, catalog[task].spec))

    assert describe("cifar10-resnet20-smoke") == "CIFAR-10 (JPEG copy), first 5000 train samples"
    assert describe("cifar10-resnet20") == "CIFAR-10 (python version)"
    assert describe("epsilon-logreg-synthetic") == (
        "SYNTHETIC epsilon stand-in (not epsilon, 20000 train samples x 2000 features)"
    )
    assert describe("epsilon-logreg") == "epsilon (libsvm)"


def test_a_caption_without_config_says_so(tmp_path: Path) -> None:
    out = fake_run(tmp_path, "bare", ttg=1.0, with_config=False)
    s = load_summary(out)
    assert plots.caption([(s, None)]) == (
        "Data: test-task: dataset unknown (no config.json)\n"
        "This machine's measurement (cpu Test CPU; 1 run), not a reference result."
    )


def test_configurations_differing_in_a_setting_get_distinct_labels(
    tmp_path: Path, no_matplotlib: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two batch sizes at the same world size: their bars and legend entries must say which is which, whole."""
    from .helpers import logreg_task

    task = logreg_task()
    for seed in (1, 2):
        fake_run(tmp_path / "s", f"b10-{seed}", ttg=10.0, seed=seed, task=task)
        big = {**task, "training": {**task["training"], "batchSizePerWorker": 40}}
        fake_run(tmp_path / "s", f"b40-{seed}", ttg=20.0, seed=seed, task=big)
    assert report.main([str(tmp_path / "s"), "--plots", str(tmp_path / "p")]) == 0
    bars = texts(tmp_path / "p" / "phase-split.svg")
    assert any("batchSizePerWorker=10" in t for t in bars), bars
    assert any("batchSizePerWorker=40" in t for t in bars), bars


@pytest.mark.parametrize("name", ["a-configuration-name-longer-than-the-legend-is-wide [batchSizePerWorker=64]"])
def test_the_svg_never_cuts_a_name(name: str) -> None:
    from mlbench_runner.tools import svg

    for chart in (
        svg.line_chart("t", "x", "y", [(name, [(1.0, 1.0)])]),
        svg.stacked_bars("t", "x", [(name, {"compute": 1.0})]),
    ):
        root = ElementTree.fromstring(chart)
        shown = [" ".join(t.itertext()) for t in root.iter(f"{SVG}text")]
        assert any(t.replace(" ", "") == name.replace(" ", "") for t in shown), shown


def test_accuracy_colour_groups_carry_the_variant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With many runs the accuracy plot colours by configuration: two batch sizes must not merge into one."""
    from .helpers import logreg_task

    task = logreg_task()
    big = {**task, "training": {**task["training"], "batchSizePerWorker": 40}}
    runs = [fake_run(tmp_path, f"b10-{i}", ttg=10.0, seed=i, task=task) for i in (1, 2)]
    runs += [fake_run(tmp_path, f"b40-{i}", ttg=10.0, seed=i, task=big) for i in (1, 2)]
    seen: list[plots.PlotInput] = []

    def capture(data: plots.PlotInput, dest: Path, fmt: str = "svg") -> list[Path]:
        seen.append(data)
        return []

    monkeypatch.setattr(plots, "write_plots", capture)
    loaded = [load_run(r) for r in runs]
    report.write_plots([r for r in loaded if isinstance(r, LoadedRun)], tmp_path / "p")
    groups = {c.label: c.group for c in seen[0].curves}
    assert groups["b10-1 (1xgloo)"] == groups["b10-2 (1xgloo)"]
    assert groups["b10-1 (1xgloo)"] != groups["b40-1 (1xgloo)"]
    assert "batchSizePerWorker=40" in groups["b40-1 (1xgloo)"]


def test_the_svg_colours_a_sweep_by_configuration_as_matplotlib_does(tmp_path: Path, no_matplotlib: None) -> None:
    """More than GROUPED_ABOVE runs: one colour and one legend entry per configuration, in both back ends
    (the SVG coloured each run, cycling 8 colours: two configurations shared one)."""
    curves = [
        plots.Curve(f"w{w}-s{s}", f"{w} ranks", [(1.0 + s, 0.5), (2.0 + s, 0.8)])
        for w in (1, 2)
        for s in range(plots.GROUPED_ABOVE // 2 + 1)
    ]
    (path,) = [p for p in plots.write_plots(plots.PlotInput("caption", curves), tmp_path) if "accuracy" in p.name]
    root = ElementTree.parse(path).getroot()
    strokes = [line.get("stroke") for line in root.iter(f"{SVG}polyline")]
    assert len(strokes) == len(curves)
    assert len(set(strokes[: len(curves) // 2])) == len(set(strokes[len(curves) // 2 :])) == 1
    assert strokes[0] != strokes[-1]
    assert "1 ranks" in texts(path)
    assert not any(t.startswith("w1-s") for t in texts(path))


@pytest.mark.parametrize("backend", ["svg", "matplotlib"])
def test_figures_this_report_does_not_draw_are_not_left_from_an_earlier_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """With a price the study has all four figures; without one (and in the other format) the cost figure of
    the earlier report would contradict the new tables: it goes. Files not ours stay."""
    if backend == "matplotlib":
        pytest.importorskip("matplotlib", reason="the optional 'plots' extra (make install) is not installed")
    monkeypatch.setenv(plots.BACKEND_ENV, backend)
    root = sweep(tmp_path / "sweep")
    dest = tmp_path / "figures"
    dest.mkdir()
    (dest / "notes.svg").write_text("<svg/>")
    (dest / "phase-split.png").write_text("an earlier report's, in the other format")
    assert report.main([str(root), "--plots", str(dest), "--price-per-worker-hour", "2.5"]) == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted([*(f"{name}.svg" for name in ALL), "notes.svg"])
    assert report.main([str(root), "--plots", str(dest)]) == 0
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [*(f"{name}.svg" for name in ALL if name != "cost-vs-workers"), "notes.svg"]
    )


@pytest.mark.parametrize("rows", [1, 9, 14, 40])
def test_every_bar_and_its_name_lie_inside_the_svg_above_the_axis_label(rows: int) -> None:
    """Many configurations (a 14-point scaling study): the image grows instead of bars falling off its end."""
    from mlbench_runner.tools import svg

    bars = [(f"{n} ({n}x1)", {"compute": 1.0, "communication": 0.5}) for n in range(1, rows + 1)]
    root = ElementTree.fromstring(svg.stacked_bars("t", "seconds per run", bars, "a caption"))
    height = float(root.attrib["height"])
    label_y = next(float(t.attrib["y"]) for t in root.iter(f"{SVG}text") if t.text == "seconds per run")
    bottoms = [
        float(r.attrib["y"]) + float(r.attrib["height"])
        for r in root.iter(f"{SVG}rect")
        if r.find(f"{SVG}title") is not None
    ]
    assert len(bottoms) == 2 * rows
    assert max(bottoms) < label_y - 12 < height
    names = [float(t.attrib["y"]) for t in root.iter(f"{SVG}text") if t.text and "x1)" in t.text]
    assert len(names) == rows
    assert max(names) < label_y
