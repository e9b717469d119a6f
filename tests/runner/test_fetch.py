"""``mlbench-runner fetch-dataset`` against a real local HTTP server (and a real tiny tmpfs for ENOSPC)."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlbench_api.datasets import OMITTED, FetchExit, FetchFailure, FetchReason, redact_url
from mlbench_runner.cli import main
from mlbench_runner.pod import fetch as fetch_module
from mlbench_runner.pod.fetch import (
    FetchError,
    FetchRequest,
    _describe_url_error,
    cut_short,
    fetch,
    marker_path,
    only_fetch_of,
)

from .helpers import env


class Server:
    """http.server in a thread serving a folder; counts GETs so a no-op re-run is visible."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.gets = 0
        self.redirects: dict[str, str] = {}  # "/name" -> the Location a GET of it answers with (302)
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

            def do_GET(self) -> None:
                server.gets += 1
                if self.path in server.redirects:
                    self.send_response(302)
                    self.send_header("Location", server.redirects[self.path])
                    self.end_headers()
                    return
                super().do_GET()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    root = tmp_path / "served"
    root.mkdir()
    srv = Server(root)
    try:
        yield srv
    finally:
        srv.close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tarball(members: dict[str, bytes], links: dict[str, tuple[str, bytes]] | None = None) -> bytes:
    """A .tar.gz with the given files; ``links``: name -> (target, tarfile type)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, (target, kind) in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def serve(server: Server, name: str, data: bytes) -> str:
    (server.root / name).write_bytes(data)
    return server.url(name)


def written(folder: Path) -> list[str]:
    """What a fetch left in ``folder`` besides its lock file (empty, kept: see fetch.only_fetch_of)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def leftovers(folder: Path) -> list[str]:
    """Temporary files or folders the fetcher should have removed."""
    return sorted(p.name for p in folder.iterdir() if ".fetch-" in p.name or ".tmp-" in p.name or ".old-" in p.name)


def test_fetches_a_file_verifies_it_and_writes_the_marker(server: Server, tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 17)  # several chunks
    dest = tmp_path / "data" / "cifar10" / "x.tar.gz"
    req = FetchRequest(url=serve(server, "x.tar.gz", data), sha256=sha(data), dest=dest)
    assert fetch(req) is True
    assert dest.read_bytes() == data
    marker = json.loads(marker_path(dest).read_text())
    assert marker["sha256"] == sha(data)
    assert marker["url"] == req.url  # nothing to redact
    assert leftovers(dest.parent) == []


def test_the_marker_keeps_the_source_url_redacted(server: Server, tmp_path: Path) -> None:
    """Issue 33: the marker is mounted into every worker; a presigned URL's signature (a token in its query
    string) stays out of it, as out of every failure message (:func:`redact_url`)."""
    data = b"signed" * 100
    url = serve(server, "x.bin", data) + "?X-Amz-Signature=s3cr3t-token&X-Amz-Expires=60#part"
    dest = tmp_path / "data" / "x.bin"
    assert fetch(FetchRequest(url=url, sha256=sha(data), dest=dest)) is True
    text = marker_path(dest).read_text()
    assert "s3cr3t-token" not in text
    assert json.loads(text)["url"] == redact_url(url) == server.url("x.bin") + OMITTED
    assert fetch(FetchRequest(url=url, sha256=sha(data), dest=dest)) is False  # the marker still vouches for it
    assert server.gets == 1


def test_a_second_fetch_is_a_no_op_without_any_request(server: Server, tmp_path: Path) -> None:
    data = b"payload" * 1000
    req = FetchRequest(url=serve(server, "f", data), sha256=sha(data), dest=tmp_path / "f")
    assert fetch(req) is True
    assert server.gets == 1
    server.close()  # the source may even be gone: the marker says the data is there
    assert fetch(req) is False
    assert server.gets == 1


def test_a_different_sha256_fetches_again(server: Server, tmp_path: Path) -> None:
    dest = tmp_path / "f"
    old, new = b"old data", b"new data"
    fetch(FetchRequest(url=serve(server, "old", old), sha256=sha(old), dest=dest))
    assert fetch(FetchRequest(url=serve(server, "new", new), sha256=sha(new), dest=dest)) is True
    assert dest.read_bytes() == new
    assert json.loads(marker_path(dest).read_text())["sha256"] == sha(new)


def test_a_missing_marker_means_the_data_is_not_trusted(server: Server, tmp_path: Path) -> None:
    data = b"abc" * 100
    dest = tmp_path / "f"
    dest.write_bytes(b"half a download from a crashed fetcher")
    assert fetch(FetchRequest(url=serve(server, "f", data), sha256=sha(data), dest=dest)) is True
    assert dest.read_bytes() == data


def test_http_404_is_source_unreachable_naming_the_url(server: Server, tmp_path: Path) -> None:
    url = server.url("missing.tar.gz")
    with pytest.raises(FetchError) as info:
        fetch(FetchRequest(url=url, sha256="0" * 64, dest=tmp_path / "d"))
    assert info.value.reason is FetchReason.SOURCE_UNREACHABLE
    assert url in info.value.message
    assert "HTTP 404" in info.value.message
    assert not (tmp_path / "d").exists()
    assert leftovers(tmp_path) == []


def test_a_failure_never_echoes_the_urls_userinfo_or_query(server: Server, tmp_path: Path) -> None:
    """A presigned URL's signature and a URL's password stay out of the message, the log and the termination log,
    also when a redirect's Location carries them."""
    server.redirects["/moved.bin?token=s3cr3t"] = "ftp://user:hunter2@127.0.0.1/x?sig=s3cr3t"
    port = server.httpd.server_address[1]
    log = tmp_path / "termination-log"
    cases = [
        (f"http://127.0.0.1:{port}/missing.tgz?X-Amz-Signature=s3cr3t", "/missing.tgz?…: HTTP 404"),
        # urllib takes userinfo for part of the host: the lookup fails, and says so without the password
        (f"http://user:hunter2@127.0.0.1:{port}/missing.tgz", "/missing.tgz: cannot resolve host"),
        (f"http://127.0.0.1:{port}/moved.bin?token=s3cr3t", "redirected to ftp://127.0.0.1/x?…"),
    ]
    for url, needle in cases:
        with pytest.raises(FetchError) as info:
            fetch(FetchRequest(url=url, sha256="0" * 64, dest=tmp_path / "d"))
        assert needle in info.value.message
        assert f"http://127.0.0.1:{port}/" in info.value.message  # the host and path are still named
        code = main(
            [
                "fetch-dataset",
                "--url",
                url,
                "--sha256",
                "0" * 64,
                "--dest",
                str(tmp_path / "d"),
                "--termination-log",
                str(log),
            ]
        )
        assert code == FetchExit.SOURCE_UNREACHABLE
        for said in (info.value.message, log.read_text()):
            assert "hunter2" not in said
            assert "s3cr3t" not in said


def test_connection_refused_is_source_unreachable(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/x"
    with pytest.raises(FetchError) as info:
        fetch(FetchRequest(url=url, sha256="0" * 64, dest=tmp_path / "d"))
    assert info.value.reason is FetchReason.SOURCE_UNREACHABLE
    assert info.value.message == f"GET {url}: connection refused"


def test_dns_failures_name_the_host_problem() -> None:
    # Pure: a real lookup would send traffic to the resolver.
    err = urllib.error.URLError(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert _describe_url_error("http://nowhere.invalid/x", err) == (
        "GET http://nowhere.invalid/x: cannot resolve host (Name or service not known)"
    )


def test_only_http_urls_are_fetched(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s")
    with pytest.raises(FetchError) as info:
        fetch(FetchRequest(url=f"file://{secret}", sha256=sha(b"s"), dest=tmp_path / "d"))
    assert info.value.reason is FetchReason.SOURCE_UNREACHABLE
    assert "only http and https" in info.value.message


def test_checksum_mismatch_says_expected_and_got_and_leaves_nothing(server: Server, tmp_path: Path) -> None:
    data = b"the real bytes"
    wrong = "ab" * 32
    dest = tmp_path / "d" / "file"
    with pytest.raises(FetchError) as info:
        fetch(FetchRequest(url=serve(server, "f", data), sha256=wrong, dest=dest))
    assert info.value.reason is FetchReason.CHECKSUM_MISMATCH
    assert f"expected {wrong}, got {sha(data)}" in info.value.message
    assert not dest.exists()
    assert not marker_path(dest).exists()
    assert leftovers(dest.parent) == []


def test_unpack_with_strip_components(server: Server, tmp_path: Path) -> None:
    data = tarball({"cifar-10-batches-py/data_batch_1": b"1", "cifar-10-batches-py/sub/test_batch": b"t"})
    dest = tmp_path / "cifar10" / "cifar-10-batches-py"
    req = FetchRequest(url=serve(server, "a.tgz", data), sha256=sha(data), dest=dest, unpack=True, strip_components=1)
    assert fetch(req) is True
    assert (dest / "data_batch_1").read_bytes() == b"1"
    assert (dest / "sub" / "test_batch").read_bytes() == b"t"
    assert marker_path(dest).exists()
    assert leftovers(dest.parent) == []
    assert fetch(req) is False


def test_unpack_replaces_an_older_tree(server: Server, tmp_path: Path) -> None:
    dest = tmp_path / "tree"
    one, two = tarball({"a": b"1", "gone": b"x"}), tarball({"a": b"2"})
    fetch(FetchRequest(url=serve(server, "1.tgz", one), sha256=sha(one), dest=dest, unpack=True))
    fetch(FetchRequest(url=serve(server, "2.tgz", two), sha256=sha(two), dest=dest, unpack=True))
    assert sorted(p.name for p in dest.iterdir()) == ["a"]
    assert (dest / "a").read_bytes() == b"2"
    assert leftovers(tmp_path) == []


def test_a_stored_file_gives_way_to_an_unpacked_folder(server: Server, tmp_path: Path) -> None:
    """The same path first fetched as a file, then as an unpacked tree (a task changed its dataset's form)."""
    dest = tmp_path / "ds"
    archive = tarball({"a": b"1"})
    assert fetch(FetchRequest(url=serve(server, "1.tgz", archive), sha256=sha(archive), dest=dest))
    assert dest.is_file()
    assert fetch(FetchRequest(url=serve(server, "1.tgz", archive), sha256=sha(archive), dest=dest, unpack=True))
    assert (dest / "a").read_bytes() == b"1"
    assert json.loads(marker_path(dest).read_text())["unpack"] is True
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("announced", "size", "short"),
    [
        (None, 10, None),  # chunked or unannounced: nothing to compare
        ("10", 10, None),
        ("12", 10, "the connection closed after 10 of 12 bytes"),
        ("garbage", 10, None),
    ],
)
def test_cut_short(announced: str | None, size: int, short: str | None) -> None:
    assert cut_short(announced, size) == short


def test_what_a_killed_fetch_left_is_removed_by_the_next(server: Server, tmp_path: Path) -> None:
    """SIGKILL (the end of a pod's grace period) skips every clean-up: the retry removes the work folder and
    the old tree its predecessor left beside the destination, and nothing of another dataset."""
    data = b"fresh"
    dest = tmp_path / "data" / "d"
    for name in (".d.fetch-abc123", ".d.old-7-99", ".other.fetch-xyz"):
        (tmp_path / "data" / name).mkdir(parents=True)
        (tmp_path / "data" / name / "download").write_bytes(b"x" * 1000)
    assert fetch(FetchRequest(url=serve(server, "f", data), sha256=sha(data), dest=dest))
    assert dest.read_bytes() == data
    assert leftovers(tmp_path / "data") == [".other.fetch-xyz"]


def test_a_second_fetch_of_the_same_path_waits_for_the_first(server: Server, tmp_path: Path) -> None:
    """Two Jobs may fetch one path (two dataset names, an override naming an existing path): the second
    neither removes the first's work folder nor races it; it waits, then finds its way clear."""
    data = b"same"
    dest = tmp_path / "data" / "d"
    dest.parent.mkdir()
    live = dest.parent / ".d.fetch-live"  # the first fetch's download, in progress
    live.mkdir()
    done = threading.Event()
    req = FetchRequest(url=serve(server, "f", data), sha256=sha(data), dest=dest)

    def fetch_then_say_so() -> None:
        fetch(req)
        done.set()

    second = threading.Thread(target=fetch_then_say_so)
    with only_fetch_of(dest):
        second.start()
        time.sleep(0.5)
        assert not done.is_set()
        assert live.exists()
    second.join(timeout=30)
    assert done.is_set()
    assert dest.read_bytes() == data
    assert leftovers(dest.parent) == []


def test_a_volume_without_locks_still_fetches(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Some NFS mounts refuse flock (ENOLCK): the fetch goes on unlocked, and says so."""
    import errno
    import fcntl

    def no_locks(*_: object) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    data = b"unlocked"
    assert fetch(FetchRequest(url=serve(server, "f", data), sha256=sha(data), dest=tmp_path / "d"))
    assert (tmp_path / "d").read_bytes() == data
    assert '"event": "dataset_lock_unsupported"' in capsys.readouterr().out


@pytest.mark.multiproc
def test_a_fetch_stopped_by_sigterm_removes_its_partial_download(tmp_path: Path) -> None:
    """A deleted Job pod or its deadline: SIGTERM (the fetcher is the container's PID 1, which ignores a
    signal it has no handler for) ends the download and removes what it had written."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    sent = threading.Event()

    def stall() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 8000000\r\n\r\n" + b"x" * 2_000_000)
            sent.set()
            conn.recv(1)  # until the client goes

    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "mlbench_runner.cli", "fetch-dataset", "--url", f"http://127.0.0.1:{port}/big"]
    cmd += ["--sha256", "0" * 64, "--dest", str(data / "d"), "--termination-log", str(tmp_path / "log")]
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert sent.wait(30)
        deadline = time.monotonic() + 30
        while not any(p.stat().st_size > 0 for p in data.glob(".d.fetch-*/download")):
            assert time.monotonic() < deadline, "the download never reached the disk"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        listener.close()
    assert proc.returncode == FetchExit.FETCH_FAILED, out
    assert leftovers(data) == [], out
    failure = FetchFailure.parse((tmp_path / "log").read_text())
    assert failure is not None
    assert failure.message == "stopped by a signal; the partial download was removed"


def test_a_download_cut_short_is_unreachable_not_a_checksum_mismatch(tmp_path: Path) -> None:
    """The server announces 3 MB and closes after 1 MB: retryable (SourceUnreachable), not a permanent failure."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve_half() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3000000\r\nConnection: close\r\n\r\n" + b"x" * 1_000_000)

    thread = threading.Thread(target=serve_half, daemon=True)
    thread.start()
    try:
        req = FetchRequest(url=f"http://127.0.0.1:{port}/x", sha256="0" * 64, dest=tmp_path / "x")
        with pytest.raises(FetchError) as err:
            fetch(req)
        assert err.value.reason is FetchReason.SOURCE_UNREACHABLE
        assert "closed after 1000000 of 3000000 bytes" in str(err.value)
    finally:
        thread.join(timeout=10)
        listener.close()


@pytest.mark.parametrize(
    ("members", "links", "needle"),
    [
        ({"../evil": b"x"}, None, "escapes the destination"),
        ({"/etc/evil": b"x"}, None, "escapes the destination"),
        ({"ok/../../evil": b"x"}, None, "escapes the destination"),
        ({}, {"link": ("/etc/passwd", tarfile.SYMTYPE)}, "outside the destination"),
        ({}, {"d/link": ("../../x", tarfile.SYMTYPE)}, "outside the destination"),
        ({"a": b"x"}, {"hard": ("../a", tarfile.LNKTYPE)}, "escapes the destination"),
        ({}, {"dev": ("", tarfile.CHRTYPE)}, "device or FIFO"),
    ],
)
def test_unsafe_archives_are_refused_before_anything_is_written(
    server: Server,
    tmp_path: Path,
    members: dict[str, bytes],
    links: dict[str, tuple[str, bytes]] | None,
    needle: str,
) -> None:
    data = tarball(members, links)
    dest = tmp_path / "vol" / "tree"
    with pytest.raises(FetchError) as info:
        fetch(FetchRequest(url=serve(server, "bad.tar.gz", data), sha256=sha(data), dest=dest, unpack=True))
    assert info.value.reason is FetchReason.FETCH_FAILED
    assert needle in info.value.message
    assert not dest.exists()
    assert written(tmp_path / "vol") == []
    assert not (tmp_path / "evil").exists()


def ordered_tarball(entries: list[tuple[str, bytes, str]]) -> bytes:
    """A .tar.gz of (name, type, file data or link target) in this order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, payload in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.REGTYPE:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload.encode()))
            else:
                info.linkname = payload
                tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        # a member written through a symlink of the archive (here one pointing inside: still refused)
        ([("d/x", tarfile.REGTYPE, "x"), ("a", tarfile.SYMTYPE, "d"), ("a/evil", tarfile.REGTYPE, "x")], "under the"),
        # up and back down: inside as text, but the kind of link a chain of symlinks turns into an escape
        ([("d/x", tarfile.REGTYPE, "x"), ("d/up", tarfile.SYMTYPE, "../d")], "may not point up"),
        # the published chain, one level: x -> a long name's parent, and a member written through it
        (
            [
                ("d" * 200, tarfile.DIRTYPE, ""),
                ("s", tarfile.SYMTYPE, "d" * 200),
                ("esc", tarfile.SYMTYPE, "s/.."),
                ("esc/evil", tarfile.REGTYPE, "x"),
            ],
            "may not point up",
        ),
        (
            [("d/x", tarfile.REGTYPE, "x"), ("a", tarfile.SYMTYPE, "d"), ("h", tarfile.LNKTYPE, "a/x")],
            "under a symlink",
        ),
    ],
)
def test_symlink_chains_are_refused(
    server: Server, tmp_path: Path, entries: list[tuple[str, bytes, str]], needle: str
) -> None:
    data = ordered_tarball(entries)
    dest = tmp_path / "vol" / "tree"
    with pytest.raises(FetchError) as info:
        fetch(FetchRequest(url=serve(server, "chain.tar.gz", data), sha256=sha(data), dest=dest, unpack=True))
    assert needle in info.value.message
    assert written(tmp_path / "vol") == []


@pytest.mark.parametrize("entries", [[("d/x", tarfile.REGTYPE, "x"), ("a", tarfile.SYMTYPE, "../../etc")]])
def test_a_python_without_the_data_filter_unpacks_and_still_refuses(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries: list[tuple[str, bytes, str]]
) -> None:
    """The runner image's Python (Debian bookworm's 3.11.2) has no PEP 706 filter: it unpacked nothing in pods
    (AttributeError on tarfile.FilterError) until the filter became optional; our own checks still refuse."""
    monkeypatch.setattr(fetch_module, "HAS_FILTER", False)
    monkeypatch.setattr(fetch_module, "FILTER_ERRORS", ())
    good = tarball({"top/d/a": b"x"})
    dest = tmp_path / "vol" / "tree"
    req = FetchRequest(
        url=serve(server, "good.tgz", good), sha256=sha(good), dest=dest, unpack=True, strip_components=1
    )
    assert fetch(req) is True
    assert (dest / "d" / "a").read_bytes() == b"x"
    bad = ordered_tarball(entries)
    with pytest.raises(FetchError) as info:
        fetch(FetchRequest(url=serve(server, "bad.tgz", bad), sha256=sha(bad), dest=tmp_path / "v2" / "t", unpack=True))
    assert "outside the destination" in info.value.message
    assert written(tmp_path / "v2") == []


def test_a_link_inside_the_tree_is_fine(server: Server, tmp_path: Path) -> None:
    data = tarball({"d/a": b"x"}, {"d/link": ("a", tarfile.SYMTYPE), "top": ("d/a", tarfile.SYMTYPE)})
    dest = tmp_path / "tree"
    fetch(FetchRequest(url=serve(server, "l.tgz", data), sha256=sha(data), dest=dest, unpack=True))
    assert (dest / "d" / "link").read_bytes() == b"x"
    assert (dest / "top").read_bytes() == b"x"


@pytest.mark.parametrize(("location", "fetched"), [("data.bin", True), ("ftp://127.0.0.1/data.bin", False)])
def test_redirects_are_followed_to_http_only(server: Server, tmp_path: Path, location: str, fetched: bool) -> None:
    data = b"payload"
    serve(server, "data.bin", data)
    server.redirects["/moved.bin"] = server.url(location) if fetched else location
    req = FetchRequest(url=server.url("moved.bin"), sha256=sha(data), dest=tmp_path / "d.bin")
    if fetched:
        fetch(req)
        assert req.dest.read_bytes() == data
    else:
        with pytest.raises(FetchError) as info:
            fetch(req)
        assert info.value.reason is FetchReason.SOURCE_UNREACHABLE
        assert "only http and https" in info.value.message


def test_not_an_archive_is_a_fetch_failure(server: Server, tmp_path: Path) -> None:
    data = b"this is no tarball"
    with pytest.raises(FetchError) as info:
        fetch(FetchRequest(url=serve(server, "x.tgz", data), sha256=sha(data), dest=tmp_path / "t", unpack=True))
    assert info.value.reason is FetchReason.FETCH_FAILED
    assert "not a readable tar archive" in info.value.message


def test_cli_writes_the_termination_message_and_exit_code(server: Server, tmp_path: Path) -> None:
    data = b"bytes"
    log = tmp_path / "termination-log"
    args = ["fetch-dataset", "--url", serve(server, "f", data), "--sha256", "cd" * 32]
    code = main([*args, "--dest", str(tmp_path / "d"), "--termination-log", str(log)])
    assert code == FetchExit.CHECKSUM_MISMATCH
    failure = FetchFailure.parse(log.read_text())
    assert failure is not None
    assert failure.reason is FetchReason.CHECKSUM_MISMATCH
    assert "expected " + "cd" * 32 in failure.message
    ok = ["fetch-dataset", "--url", server.url("f"), "--sha256", sha(data), "--dest", str(tmp_path / "d")]
    assert main([*ok, "--termination-log", str(tmp_path / "unused")]) == 0
    assert not (tmp_path / "unused").exists()


@pytest.fixture
def tiny_volume(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (root only): ENOSPC as a full PVC would give it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]
    res = subprocess.run(mount, check=False, capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.multiproc
def test_a_full_volume_is_volume_full_naming_the_pvc(server: Server, tiny_volume: Path) -> None:
    data = os.urandom(3 << 20)
    dest = tiny_volume / "cifar10" / "big.bin"
    req = FetchRequest(url=serve(server, "big", data), sha256=sha(data), dest=dest, volume="mlbench-datasets")
    with pytest.raises(FetchError) as info:
        fetch(req)
    assert info.value.reason is FetchReason.VOLUME_FULL
    assert "volume mlbench-datasets" in info.value.message
    assert str(dest) in info.value.message
    assert leftovers(dest.parent) == []  # the partial download is gone: the space is free again


@pytest.mark.multiproc
def test_a_full_volume_while_unpacking(server: Server, tiny_volume: Path) -> None:
    data = tarball({"top/a": os.urandom(600 << 10), "top/b": os.urandom(600 << 10)})
    dest = tiny_volume / "tree"
    req = FetchRequest(url=serve(server, "t.tgz", data), sha256=sha(data), dest=dest, unpack=True, volume="pvc-x")
    with pytest.raises(FetchError) as info:
        fetch(req)
    assert info.value.reason is FetchReason.VOLUME_FULL
    assert "volume pvc-x" in info.value.message
    assert written(tiny_volume) == []
