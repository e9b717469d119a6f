"""Progress scraping: rank 0's page comes from the user's image, so it is read bounded, parsed off the
event loop by a parser that never raises, and every number is clamped to what status.progress holds."""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from mlbench_api.common import MAX_SAFE_INT
from mlbench_api.goal import GoalMetric
from mlbench_api.runstatus import Progress
from mlbench_operator import progress

NOW = datetime(2026, 1, 1, tzinfo=UTC)
STAMP = "2026-01-01T00:00:00Z"


def _runner_page() -> str:
    reg = CollectorRegistry()
    Gauge("mlbench_epoch", "e", registry=reg).set(3.5)
    Counter("mlbench_steps", "s", registry=reg).inc(120)
    Gauge("mlbench_accuracy", "a", registry=reg).set(0.42)
    Gauge("mlbench_samples_per_second", "t", registry=reg).set(250.25)
    Gauge("mlbench_loss", "l", registry=reg).set(1.2)
    return generate_latest(reg).decode()


def test_parse_runner_metrics() -> None:
    assert progress.parse(_runner_page(), NOW) == {
        "epoch": 3.5,
        "epochRounded": "3.5",
        "step": 120,
        "lastAccuracy": 0.42,
        "accuracy": "42.0%",
        "samplesPerSecond": 250.25,
        "updatedAt": STAMP,
    }


def test_parse_nothing_useful() -> None:
    assert progress.parse("# nothing here\nother_metric 1\n", NOW) is None


# page -> the fields expected (updatedAt aside); None: no progress at all
HOSTILE_PAGES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("overflow to infinity is skipped", "mlbench_epoch 1e400\n", None),
    ("NaN is skipped", "mlbench_accuracy NaN\n", None),
    ("+Inf is skipped", "mlbench_samples_per_second +Inf\n", None),
    ("-Inf is skipped", "mlbench_epoch -Inf\n", None),
    ("a huge step is clamped to 2^53-1", "mlbench_steps_total 1e30\n", {"step": MAX_SAFE_INT}),
    ("a huge finite epoch stays finite", "mlbench_epoch 1e300\n", {"epoch": 1e300, "epochRounded": "1e+300"}),
    (
        "negative values are clamped to 0",
        "mlbench_steps_total -5\nmlbench_epoch -1.5\n",
        {"step": 0, "epoch": 0.0, "epochRounded": "0"},
    ),
    ("accuracy above 1 is clamped", "mlbench_accuracy 7\n", {"lastAccuracy": 1.0, "accuracy": "100.0%"}),
    ("accuracy below 0 is clamped", "mlbench_accuracy -0.25\n", {"lastAccuracy": 0.0, "accuracy": "0.0%"}),
    (
        "the first usable sample counts",
        "mlbench_epoch NaN\nmlbench_epoch 2\nmlbench_epoch 9\n",
        {"epoch": 2.0, "epochRounded": "2"},
    ),
    ("a malformed line does not hide the rest", "}{ garbage\nmlbench_epoch 3\n", {"epoch": 3.0, "epochRounded": "3"}),
    ("a value that is not a number", "mlbench_epoch abc\n", None),
    ("a name without a value", "mlbench_epoch\n", None),
    ("a longer name is another metric", "mlbench_epoch3\nmlbench_epochs 4\n", None),
    ("labels with braces and escapes", 'mlbench_epoch{a="}",b="\\"x\\""} 2\n', {"epoch": 2.0, "epochRounded": "2"}),
    ("an unterminated label set", 'mlbench_epoch{a="x 2\n', None),
    ("a timestamp after the value", "mlbench_steps_total 7 1700000000000\n", {"step": 7}),
    ("binary noise", "\x00\xff\ufffd\x1b[2J" * 100, None),
    ("an over-long line is skipped", "mlbench_epoch " + "9" * 10_000 + "\nmlbench_steps_total 1\n", {"step": 1}),
    ("an empty page", "", None),
]


@pytest.mark.parametrize(("page", "expected"), [c[1:] for c in HOSTILE_PAGES], ids=[c[0] for c in HOSTILE_PAGES])
def test_hostile_pages_never_raise_and_fit_the_schema(page: str, expected: dict[str, Any] | None) -> None:
    out = progress.parse(page, NOW)
    if expected is None:
        assert out is None
        return
    assert out == {**expected, "updatedAt": STAMP}
    Progress.model_validate(out)  # what the status patch carries is what the CRD accepts


def test_pathological_label_set_parses_in_linear_time() -> None:
    line = "mlbench_epoch{" + '\\"' * 1000 + '"' + "a" * 1000
    assert len(line) < 4096  # short enough to reach the regular expression
    start = time.monotonic()
    assert progress.parse((line + "\n") * 50, NOW) is None
    # a hang guard, not a timing claim: backtracking over 1000 escapes would take hours (it takes ms)
    assert time.monotonic() - start < 30


def test_bounds_follow_the_schema() -> None:
    schema = Progress.model_json_schema(by_alias=True)["properties"]
    for key, (low, high) in progress.BOUNDS.items():
        (arm,) = [a for a in schema[key]["anyOf"] if a.get("type") != "null"]
        assert arm.get("minimum") == low
        assert arm.get("maximum", float("inf")) == high


# -- a real HTTP endpoint serving hostile answers ------------------------------------------------------------
@contextmanager
def serve(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A local TCP server that reads the request and lets ``answer`` write the response; yields its port."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.settimeout(10)
            try:
                self.request.recv(4096)
                answer(self.request)
            except OSError:
                pass  # the client hung up (it read enough): expected

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def ok(body: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body)

    return answer


def scrape(port: int) -> dict[str, Any] | None:
    return asyncio.run(progress.scrape("127.0.0.1", port, NOW))


def test_scrape_a_runner_page() -> None:
    with serve(ok(_runner_page().encode())) as port:
        assert scrape(port) == {
            "epoch": 3.5,
            "epochRounded": "3.5",
            "step": 120,
            "lastAccuracy": 0.42,
            "accuracy": "42.0%",
            "samplesPerSecond": 250.25,
            "updatedAt": STAMP,
        }


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"mlbench_epoch 1e400\nmlbench_accuracy NaN\nmlbench_steps_total 1e30\n", {"step": MAX_SAFE_INT}),
        (b"\x00\x01garbage{{{\n\xff\xfe\nmlbench_epoch 2\n", {"epoch": 2.0, "epochRounded": "2"}),
        (b"<html>not metrics</html>", None),
    ],
    ids=["huge-and-non-finite", "malformed", "html"],
)
def test_scrape_hostile_pages(body: bytes, expected: dict[str, Any] | None) -> None:
    with serve(ok(body)) as port:
        out = scrape(port)
    assert out == (None if expected is None else {**expected, "updatedAt": STAMP})


def test_scrape_reads_at_most_the_cap() -> None:
    """A page far above the cap: what lies beyond it is never read, and the cut line is dropped."""
    cap = progress.MAX_RESPONSE_BYTES
    assert cap == 256 * 1024
    head = b"mlbench_epoch 4\n"
    filler = b"# " + b"x" * 1000 + b"\n"
    page = head + filler * (cap // len(filler) + 1) + b"mlbench_steps_total 123456789\n" + filler * 8000
    with serve(ok(page)) as port:
        body = asyncio.run(progress.fetch("127.0.0.1", port))
        assert body is not None
        assert len(body.encode()) < cap
        assert body.endswith("\n")  # cut at a line, never mid-number
        assert scrape(port) == {
            "epoch": 4.0,
            "epochRounded": "4",
            "updatedAt": STAMP,
        }  # the step beyond the cap was not read


def test_a_number_cut_at_the_cap_is_dropped() -> None:
    """The cap falls inside a number: the half-read value must not become the progress."""
    status = b"HTTP/1.0 200 OK\r\n\r\n"
    comment = b"#" * (progress.MAX_RESPONSE_BYTES - len(status) - len(b"\nmlbench_steps_total 12"))
    page = comment + b"\nmlbench_steps_total 12345678\n"
    with serve(ok(page)) as port:
        assert scrape(port) is None


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.0 500 Internal Server Error\r\n\r\nmlbench_epoch 1\n",
        b"SSH-2.0-OpenSSH\r\n",
        b"HTTP/1.0 200 OK\r\nno end of headers",
        b"",
    ],
    ids=["500", "not-http", "no-body", "empty"],
)
def test_scrape_bad_answers_are_none(answer: bytes) -> None:
    with serve(lambda conn: conn.sendall(answer)) as port:
        assert scrape(port) is None


def test_scrape_a_slow_endpoint_times_out() -> None:
    """A server that drips one byte at a time: the whole exchange is bounded by one timeout."""

    def drip(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
        for _ in range(100):
            conn.sendall(b"#")
            time.sleep(0.1)

    with serve(drip) as port:
        start = time.monotonic()
        assert asyncio.run(progress.fetch("127.0.0.1", port, timeout=0.5)) is None
        assert time.monotonic() - start < 3


def test_unreachable_endpoint_is_none() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connection refused
        assert asyncio.run(progress.fetch("127.0.0.1", port, timeout=1)) is None
        assert scrape(port) is None


def test_scrape_parses_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    real = progress.parse

    def spy(text: str, now: datetime, metric: GoalMetric | None = None) -> dict[str, Any] | None:
        threads.append(threading.get_ident())
        return real(text, now, metric)

    monkeypatch.setattr(progress, "parse", spy)

    async def main() -> tuple[dict[str, Any] | None, int]:
        return await progress.scrape("127.0.0.1", port, NOW), threading.get_ident()

    with serve(ok(b"mlbench_epoch 1\n")) as port:
        out, loop_thread = asyncio.run(main())
    assert out == {"epoch": 1.0, "epochRounded": "1", "updatedAt": STAMP}
    assert threads
    assert threads[0] != loop_thread


@pytest.mark.parametrize("where", ["fetch", "parse"])
def test_scrape_never_raises(monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(progress, where, boom)
    with serve(ok(b"mlbench_epoch 1\n")) as port:
        assert scrape(port) is None


def test_step_changed_at_stays_while_the_counter_stands_still() -> None:
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    first = progress.advance(None, {"step": 10, "updatedAt": "x"}, t0)
    assert first["stepChangedAt"] == "2026-01-01T00:00:00Z"
    same = progress.advance(first, {"step": 10}, t0 + timedelta(seconds=30))
    assert same["stepChangedAt"] == "2026-01-01T00:00:00Z"
    moved = progress.advance(same, {"step": 11}, t0 + timedelta(seconds=60))
    assert moved["stepChangedAt"] == "2026-01-01T00:01:00Z"
    assert "stepChangedAt" not in progress.advance(moved, {"epoch": 1.0}, t0)  # no step scraped: unknown


# -- the goal metric's column ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("metric", "page", "expected"),
    [
        (GoalMetric.BLEU, "mlbench_score 24.31\n", {"lastScore": 24.31, "score": "24.3 BLEU"}),
        (GoalMetric.PERPLEXITY, "mlbench_score 71.25\n", {"lastScore": 71.25, "score": "ppl 71.2"}),
        (GoalMetric.PERPLEXITY, "mlbench_score 1e300\n", {"lastScore": 1e300, "score": "ppl 1e+300"}),
        (GoalMetric.LOSS, "mlbench_score -3\n", {"lastScore": 0.0, "score": "loss 0"}),
        (
            GoalMetric.TEST_TOP1_ACCURACY,
            "mlbench_accuracy 0.5\nmlbench_score 0.5\n",
            {"lastAccuracy": 0.5, "accuracy": "50.0%", "lastScore": 0.5, "score": "50.0%"},
        ),
        (None, "mlbench_score 24.31\n", {"lastScore": 24.31}),  # no snapshot yet: the figure, no string
        (GoalMetric.BLEU, "mlbench_score NaN\n", None),
    ],
)
def test_the_score_column_is_written_in_the_tasks_metric(
    metric: GoalMetric | None, page: str, expected: dict[str, Any] | None
) -> None:
    out = progress.parse(page, NOW, metric)
    assert out == (None if expected is None else {**expected, "updatedAt": STAMP})
    if out is not None:
        Progress.model_validate(out)


@pytest.mark.parametrize(
    ("status", "metric"),
    [
        ({"taskSnapshot": {"goal": {"metric": "bleu", "target": 25}}}, GoalMetric.BLEU),
        ({"taskSnapshot": {"goal": {"metric": "perplexity"}}}, GoalMetric.PERPLEXITY),
        ({}, None),
        ({"taskSnapshot": None}, None),
        ({"taskSnapshot": {"goal": "bleu"}}, None),
        ({"taskSnapshot": {"goal": {"metric": "top5"}}}, None),  # a metric this operator does not know
    ],
)
def test_the_goal_metric_comes_from_the_task_snapshot(status: dict[str, Any], metric: GoalMetric | None) -> None:
    assert progress.goal_metric(status) is metric
