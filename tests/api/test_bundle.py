"""The results bundle: launcher line -> operator ConfigMap -> ``mlbench fetch`` directory."""

from __future__ import annotations

import base64
import gzip
import json
import random
import time
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from mlbench_api import bundle
from mlbench_api.download import ResultsUnavailable, default_dir, from_config_map, parse_ref, results_ref, write
from mlbench_api.results import EpochRecord
from tests import factories


def _summary_bytes(epochs: int = 3) -> bytes:
    history = [
        EpochRecord(epoch=e, accuracy=0.1 * e, loss=2.0 / e, wall_seconds=10.0 * e, lr=0.1)
        for e in range(1, epochs + 1)
    ]
    return factories.summary().model_copy(update={"history": history}).model_dump_json(by_alias=True).encode()


def _events(n: int, chatty_every: int = 2) -> bytes:
    rng = random.Random(0)  # incompressible-ish payloads, so the budget is really tested
    lines = []
    for i in range(n):
        name = "train_progress" if chatty_every and i % chatty_every else "epoch_stop"
        lines.append(json.dumps({"event": name, "i": i, "noise": rng.getrandbits(256).to_bytes(32, "big").hex()}))
    return "".join(line + "\n" for line in lines).encode()


def test_round_trip_through_a_log_line_and_a_config_map() -> None:
    files = {bundle.SUMMARY: _summary_bytes(), bundle.EVENTS: _events(10), bundle.CONFIG: b'{"runName": "r1"}'}
    line = bundle.results_line(bundle.fit(files))
    log = f"noise\n[1,0]<stdout>:{{}}\n{line}\n"
    found = bundle.from_log(log)
    assert found is not None
    assert found.files == files
    assert found.summary is not None
    assert len(found.summary.history) == 3
    # the ConfigMap's binaryData (base64 of the gzip files, as the API returns it) gives the same files
    binary = {k: base64.b64encode(v).decode() for k, v in found.compressed().items()}
    assert from_config_map(binary).files == files


def test_compression_is_deterministic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same files give the same bytes at any time: gzip stamps the current second into its header
    unless told not to (two calls within one second would agree anyway)."""
    files = {bundle.SUMMARY: _summary_bytes()}
    first = bundle.results_line(bundle.fit(files))
    monkeypatch.setattr(time, "time", lambda: 2_000_000_000.0)
    assert bundle.results_line(bundle.fit(files)) == first
    assert all(data[4:8] == bytes(4) for data in bundle.fit(files).compressed().values())  # MTIME 0


def test_over_budget_drops_chatty_events_first_and_never_the_summary() -> None:
    files = {bundle.SUMMARY: _summary_bytes(164), bundle.EVENTS: _events(4000)}
    full = bundle.Bundle(files).compressed_size()
    budget = full // 3
    fitted = bundle.fit(files, budget=budget)
    assert fitted.compressed_size() <= budget
    assert fitted.truncated == (bundle.EVENTS,)
    assert fitted.files[bundle.SUMMARY] == files[bundle.SUMMARY]
    names = [json.loads(line)["event"] for line in fitted.files[bundle.EVENTS].splitlines()]
    assert "train_progress" not in names
    assert names.count("epoch_stop") > 0


def test_a_long_log_keeps_its_head_and_tail() -> None:
    files = {bundle.SUMMARY: _summary_bytes(), bundle.EVENTS: _events(6000, chatty_every=0)}
    fitted = bundle.fit(files, budget=bundle.Bundle(files).compressed_size() // 4)
    lines = [json.loads(line) for line in fitted.files[bundle.EVENTS].splitlines()]
    omitted = [e for e in lines if e["event"] == "events_omitted"]
    assert len(omitted) == 1
    assert omitted[0]["count"] > 0
    assert lines[0]["i"] == 0
    assert lines[-1]["i"] == 5999


def test_chatty_events_alone_go_when_that_is_enough() -> None:
    files = {bundle.SUMMARY: _summary_bytes(), bundle.EVENTS: _events(1000, chatty_every=10)}  # 900 chatty
    without = bundle.Bundle(
        {
            **files,
            bundle.EVENTS: b"".join(
                line + b"\n" for line in files[bundle.EVENTS].splitlines() if b"train_progress" not in line
            ),
        }
    )
    fitted = bundle.fit(files, budget=without.compressed_size())
    assert fitted.files[bundle.EVENTS] == without.files[bundle.EVENTS]  # all 100 epoch_stop lines kept


def test_a_newer_runner_s_results_are_kept_as_they_are() -> None:
    """An extra summary field or file (a runner newer than the operator) is kept, not refused."""
    summary = json.loads(_summary_bytes())
    summary["newField"] = 1
    files = {bundle.SUMMARY: json.dumps(summary).encode(), "profile.json": b"{}"}
    found = bundle.parse_line(bundle.results_line(bundle.fit(files)))
    assert found is not None
    assert found.files == files
    with pytest.raises(ValueError, match="newField"):
        found.summary  # noqa: B018 - a reader of this operator's version says what it cannot read


def test_summary_too_big_for_any_budget_is_an_error() -> None:
    with pytest.raises(bundle.BundleError, match="summary and config alone"):
        bundle.fit({bundle.SUMMARY: _summary_bytes(500)}, budget=100)


def _line(**overrides: Any) -> str:
    payload = {"event": bundle.EVENT, "schema": bundle.SCHEMA, "truncated": [], "files": {}}
    payload.update(overrides)
    return json.dumps(payload)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (_line(schema="mlbench.io/results/v9"), "unknown results schema"),
        (_line(files=None), "no files"),
        (_line(files={"summary.json.gz": "@@@"}), "not base64"),
        (_line(files={"summary.json.gz": base64.b64encode(b"plain").decode()}), "not gzip"),
        (_line(files={"../summary.json.gz": base64.b64encode(gzip.compress(b"x")).decode()}), "unexpected file"),
        (_line(files={"summary.json": base64.b64encode(gzip.compress(b"{}")).decode()}), "unexpected file"),
        ('{"event": "run_results", "schema": ', "not JSON"),
        # truncated becomes status.results.truncated after the run finished: what the CRD refuses never passes
        (_line(truncated=[bundle.EVENTS] * 9), "truncated: 9 entries"),
        (_line(truncated=[bundle.EVENTS, bundle.EVENTS]), "named twice"),
        (_line(truncated=["other.txt"]), "'other.txt' is not a file"),
        (_line(truncated="events.jsonl"), "list of file names"),
        (_line(truncated=[1]), "list of file names"),
    ],
)
def test_malformed_results_lines_say_what_is_wrong(line: str, error: str) -> None:
    with pytest.raises(bundle.BundleError, match=error):
        bundle.parse_line(line)


def _zeros(megabytes: int) -> str:
    """A results file of zeros: a few KiB compressed, ``megabytes`` MiB once decompressed."""
    return base64.b64encode(gzip.compress(bytes(megabytes << 20))).decode()


def _peak(fn: Any) -> tuple[BaseException | None, int, float]:
    """(what ``fn`` raised, its peak of traced memory, its seconds)."""
    tracemalloc.start()
    start = time.perf_counter()
    raised: BaseException | None = None
    try:
        fn()
    except Exception as exc:
        raised = exc
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return raised, peak, seconds


def test_a_65_kb_line_inflating_to_64_mib_is_refused_quickly_and_kept_nowhere() -> None:
    """Issue 33: one file of 64 MiB of zeros is a 65 KB line; it is refused with a reason, its bytes counted
    a chunk at a time (never held: the peak is a few MiB, not 64), in well under a second of CPU."""
    line = _line(files={"events.jsonl.gz": _zeros(64)})
    assert len(line) < 100_000
    raised, peak, seconds = _peak(lambda: bundle.parse_line(line))
    assert isinstance(raised, bundle.BundleError), raised
    assert f"events.jsonl.gz: more than {bundle.MAX_FILE_BYTES} bytes once decompressed" in str(raised)
    assert peak < 4 << 20, f"{peak >> 20} MiB held"
    assert seconds < 5, seconds  # generous for a shared CI machine; the count stops at the limit


def test_a_gzip_bomb_is_refused_at_the_total_limit_without_keeping_any_file() -> None:
    """Eight files of 10 MiB of zeros (each within the per-file limit) fit the compressed budget; together
    they are refused once the count passes MAX_TOTAL_BYTES, before any file is decompressed for keeping."""
    files = {f"f{i}.json.gz": _zeros(10) for i in range(8)}
    line = _line(files=files)
    assert len(line) < bundle.MAX_LINE_CHARS  # the budget is no defence by itself
    raised, peak, _ = _peak(lambda: bundle.parse_line(line))
    assert isinstance(raised, bundle.BundleError), raised
    assert f"more than {bundle.MAX_TOTAL_BYTES} bytes together" in str(raised)
    assert peak < 4 << 20, f"{peak >> 20} MiB held (the eight files are 80 MiB)"
    assert bundle.parse_line(_line(files={"f0.json.gz": _zeros(10)})) is not None  # one file of 10 MiB is fine


@pytest.mark.parametrize("size", [0, 1, 65536, 65537, 3 * 65536 + 7])
def test_the_count_is_the_decompressed_size(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    assert bundle.inflated_size("f", gzip.compress(data), size) == size
    with pytest.raises(bundle.BundleError, match="more than"):
        bundle.inflated_size("f", gzip.compress(data + b"!"), size)
    two = gzip.compress(data) + gzip.compress(b"more")  # every member counts (gzip.decompress reads them all)
    assert bundle.inflated_size("f", two, size + 4) == size + 4
    with pytest.raises(bundle.BundleError, match="not gzip data"):
        bundle.inflated_size("f", gzip.compress(data + b"tail")[:-12], size + 4)


def test_fit_keeps_the_bundle_within_what_the_operator_accepts() -> None:
    """A launcher's event log of repetitive lines compresses far below the budget but may inflate past the
    operator's limit: fit() cuts it (middle first) so that the operator never refuses the launcher's own line."""
    line = b'{"event": "epoch_end", "loss": 0.5}\n'
    events = line * ((bundle.MAX_TOTAL_BYTES // len(line)) + 1000)
    fitted = bundle.fit({bundle.SUMMARY: _summary_bytes(), bundle.EVENTS: events})
    assert fitted.truncated == (bundle.EVENTS,)
    assert sum(map(len, fitted.files.values())) <= bundle.MAX_TOTAL_BYTES
    assert bundle.parse_line(bundle.results_line(fitted)) is not None


def test_a_results_line_longer_than_any_launcher_writes_is_refused_before_decoding() -> None:
    line = _line(files={"summary.json.gz": "A" * (bundle.MAX_LINE_CHARS + 4)})
    with pytest.raises(bundle.BundleError, match="characters"):
        bundle.parse_line(line)


def test_the_largest_bundle_the_launcher_writes_is_read_back() -> None:
    """What fit() lets through at the budget (incompressible events) is under the line limit."""
    import random as rnd

    noise = rnd.Random(0).randbytes(bundle.BUDGET_BYTES)
    events = b"".join(
        b'{"event": "x", "n": "%s"}\n' % noise[i : i + 64].hex().encode() for i in range(0, len(noise), 64)
    )
    fitted = bundle.fit({bundle.SUMMARY: _summary_bytes(), bundle.EVENTS: events})
    line = bundle.results_line(fitted)
    assert len(line) <= bundle.MAX_LINE_CHARS
    found = bundle.parse_line(line)
    assert found is not None
    assert found.files == fitted.files


@pytest.mark.parametrize(
    ("truncated", "files"),
    [
        ([], {}),
        ([bundle.EVENTS], {bundle.EVENTS: b"{}\n"}),
        ([bundle.EVENTS], {bundle.SUMMARY: b"{}"}),  # fit() dropped the whole event log
        (list(bundle.FILES), {}),
    ],
)
def test_valid_truncation_lists_fit_the_status(truncated: list[str], files: dict[str, bytes]) -> None:
    """Whatever parse_line accepts, status.results can store (the bound is the API type's)."""
    from mlbench_api.runstatus import ResultsRef

    compressed = {k + bundle.GZ: base64.b64encode(gzip.compress(v)).decode() for k, v in files.items()}
    found = bundle.parse_line(_line(truncated=truncated, files=compressed))
    assert found is not None
    assert found.truncated == tuple(truncated)
    ResultsRef.model_validate({"files": sorted(found.files), "truncated": list(found.truncated)})


@pytest.mark.parametrize("line", ["", "plain output", '{"event": "epoch_stop"}', '{"event": "run_summary"}'])
def test_other_lines_are_not_results(line: str) -> None:
    assert bundle.parse_line(line) is None


def test_the_last_results_line_wins() -> None:
    first = bundle.results_line(bundle.fit({bundle.SUMMARY: _summary_bytes(1)}))
    last = bundle.results_line(bundle.fit({bundle.SUMMARY: _summary_bytes(2)}))
    found = bundle.from_log(f"{first}\n{last}\n")
    assert found is not None
    assert found.summary is not None
    assert len(found.summary.history) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ns/run-1", ("ns", "run-1")),
        ("team-a/r", ("team-a", "r")),
        ("results/run1/summary.json", None),
        ("./ns/run", None),
        ("ns/1run", None),  # run names are DNS-1035 labels
        ("NS/run", None),
        ("run", None),
    ],
)
def test_cluster_run_references(text: str, expected: tuple[str, str] | None) -> None:
    assert parse_ref(text) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"phase": "Succeeded", "results": {"configMap": "r1-results"}}, "r1-results"),
        (
            {"phase": "Failed", "results": {"message": "the launcher's log is gone"}},
            "has no kept results: the launcher",
        ),
        ({"phase": "Running"}, "is Running: results are kept once it has finished"),
        ({}, "is Pending"),
        ({"phase": "Succeeded"}, "not collected yet"),
        ({"phase": "Succeeded", "completionTime": "2026-11-23T11:59:00Z"}, "not collected yet"),
        ({"phase": "Succeeded", "completionTime": "2026-11-23T11:00:00Z"}, "and no results were kept"),
        (  # collection failed and is being retried: long after the end too, it is not "none were kept"
            {
                "phase": "Failed",
                "completionTime": "2026-11-23T11:00:00Z",
                "results": {"failingSince": "2026-11-23T11:59:30Z"},
            },
            r"still retrying .*failing since 2026-11-23T11:59:30Z.*try again shortly",
        ),
    ],
)
def test_results_ref_says_why_there_is_nothing(status: dict[str, Any], expected: str) -> None:
    obj = {"metadata": {"namespace": "ns", "name": "r1"}, "status": status}
    if expected == "r1-results":
        assert results_ref(obj) == expected
    else:
        with pytest.raises(ResultsUnavailable, match=expected):
            results_ref(obj, now=datetime(2026, 11, 23, 12, 0, tzinfo=UTC))


def test_write_lays_out_a_run_directory(tmp_path: Path) -> None:
    files = {bundle.SUMMARY: _summary_bytes(), bundle.CONFIG: b"{}"}
    paths = write(bundle.Bundle(files), tmp_path / "ns" / "r1")
    assert sorted(p.name for p in paths) == ["config.json", "summary.json"]
    assert (tmp_path / "ns" / "r1" / "summary.json").read_bytes() == files[bundle.SUMMARY]


def test_write_removes_an_earlier_fetchs_files_that_this_bundle_lacks(tmp_path: Path) -> None:
    """A run re-created under the same name that failed before writing a summary: the old summary.json
    must not stay behind to be scored as this run."""
    dest = tmp_path / "ns.r1"
    write(bundle.Bundle({bundle.SUMMARY: _summary_bytes(), bundle.EVENTS: b"{}\n", bundle.CONFIG: b"{}"}), dest)
    (dest / "notes.txt").write_text("the user's own file")
    write(bundle.Bundle({bundle.CONFIG: b'{"new": 1}'}), dest)
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "notes.txt"]
    assert (dest / "config.json").read_bytes() == b'{"new": 1}'


def test_fetched_runs_sit_next_to_local_ones() -> None:
    """``mlbench results mlbench-results/*`` reads both: a local run's directory is ``<run>`` (no dots)."""
    assert default_dir("team-a", "r1") == Path("mlbench-results/team-a.r1")
