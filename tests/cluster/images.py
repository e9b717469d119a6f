"""Tiny images for the real test node, written as docker-archive tars by hand.

Why by hand: there is no registry anywhere (every image the node runs is imported into
its containerd), and the two images the node itself needs are one static binary each.
Writing the archive (a layer tar, an image config and ``manifest.json``) takes
milliseconds, is byte-for-byte reproducible (so it is cached by the hash of its
inputs) and needs neither podman nor its storage.

* ``PAUSE_IMAGE``: Debian's static ``catatonit`` in pause mode (``-P``), the pod
  sandbox ("infra") container of every pod.
* ``BUSYBOX_IMAGE``: Debian's ``busybox-static`` with every applet linked (sh,
  nslookup, nc, wget, httpd, ...), for node and e2e tests.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAUSE_IMAGE = "docker.io/mlbench/pause:catatonit"
BUSYBOX_IMAGE = "docker.io/mlbench/busybox:test"
CATATONIT = Path("/usr/bin/catatonit")
BUSYBOX = Path("/bin/busybox")
#: fixed mtime: the same inputs always give the same archive bytes (and digests)
EPOCH = 1_700_000_000


@dataclass(frozen=True)
class Entry:
    """One file system entry of a layer: a file (``data``), directory or symlink."""

    path: str
    kind: str  # "file" | "dir" | "symlink"
    mode: int = 0o755
    data: bytes = b""
    target: str = ""


def layer_tar(entries: Iterable[Entry]) -> bytes:
    """An uncompressed, deterministic layer tar (root-owned, fixed mtime)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.path.lstrip("/"))
            info.mtime = EPOCH
            info.mode = e.mode
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if e.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif e.kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = e.target
                tar.addfile(info)
            elif e.kind == "file":
                info.size = len(e.data)
                tar.addfile(info, io.BytesIO(e.data))
            else:
                raise ValueError(f"entry {e.path}: unknown kind {e.kind!r}")
    return buf.getvalue()


def docker_archive(name: str, layer: bytes, config: dict[str, Any]) -> bytes:
    """A single-layer docker-archive (what ``docker save``/``podman save`` write),
    importable with ``ctr images import``."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "2023-11-14T22:13:20Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "2023-11-14T22:13:20Z", "created_by": "tests/cluster/images.py"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.split(":", 1)[1] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [name], "Layers": [layer_name]}]
    files = {
        config_name: config_bytes,
        layer_name: layer,
        "manifest.json": json.dumps(manifest).encode(),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, data in files.items():
            if "/" in path:
                d = tarfile.TarInfo(path.split("/", 1)[0])
                d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, EPOCH
                tar.addfile(d)
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, EPOCH
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def pause_entries(catatonit: Path = CATATONIT) -> list[Entry]:
    return [Entry("catatonit", "file", 0o755, catatonit.read_bytes())]


def busybox_applets(busybox: Path = BUSYBOX) -> list[str]:
    """Install paths of every applet (``bin/sh``, ``usr/bin/wget``, ...), from the binary itself."""
    out = subprocess.run([str(busybox), "--list-full"], check=True, capture_output=True, text=True).stdout
    return sorted({line.strip().lstrip("/") for line in out.splitlines() if line.strip()})


def busybox_entries(busybox: Path = BUSYBOX) -> list[Entry]:
    """/bin/busybox, a symlink per applet, and the few files tools expect
    (/etc/passwd for ``id``/``httpd``, a world-writable /tmp)."""
    entries = [Entry(d, "dir") for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root", "var", "var/www")]
    entries += [Entry("tmp", "dir", 0o1777), Entry("bin/busybox", "file", 0o755, busybox.read_bytes())]
    for applet in busybox_applets(busybox):
        if applet != "bin/busybox":
            entries.append(Entry(applet, "symlink", 0o777, target="/bin/busybox"))
    passwd = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
    entries.append(Entry("etc/passwd", "file", 0o644, passwd))
    entries.append(Entry("etc/group", "file", 0o644, b"root:x:0:\nnogroup:x:65534:\n"))
    return entries


IMAGE_CONFIGS: dict[str, dict[str, Any]] = {
    PAUSE_IMAGE: {"Entrypoint": ["/catatonit", "-P"], "Env": ["PATH=/"]},
    BUSYBOX_IMAGE: {"Cmd": ["sh"], "Env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
}


def source_binary(name: str) -> Path:
    """The Debian binary an image is made of, with an error naming the package."""
    path, package = (CATATONIT, "catatonit") if name == PAUSE_IMAGE else (BUSYBOX, "busybox-static")
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: apt-get install {package} (needed for image {name})")
    if b"ld-linux" in path.read_bytes()[:4096]:  # a scratch image has no dynamic loader
        raise ValueError(f"{path} is dynamically linked: apt-get install {package} (needed for image {name})")
    return path


def image_layer(name: str) -> bytes:
    """The one layer of image ``name``: its entries (binary, links, passwd, ...) as a deterministic tar."""
    binary = source_binary(name)
    return layer_tar(pause_entries(binary) if name == PAUSE_IMAGE else busybox_entries(binary))


def archive_key(name: str, layer: bytes) -> str:
    """Cache key: the image name, its config and its layer (so an edit of the entries, not only of the
    source binary, builds the archive again)."""
    h = hashlib.sha256(name.encode())
    h.update(json.dumps(IMAGE_CONFIGS[name], sort_keys=True).encode())
    h.update(layer)
    return h.hexdigest()[:16]


def build_archive(name: str, cache: Path) -> tuple[Path, str]:
    """The docker-archive of image ``name`` under ``cache`` (built once per key);
    returns (path, key)."""
    layer = image_layer(name)
    key = archive_key(name, layer)
    slug = name.rsplit("/", 1)[-1].replace(":", "-")
    path = cache / f"{slug}-{key}.tar"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # a name of its own: two sessions may build the same archive at once
        fd, tmp_name = tempfile.mkstemp(dir=cache, prefix=f".{slug}-", suffix=".tmp")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(docker_archive(name, layer, IMAGE_CONFIGS[name]))
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
    return path, key


def ctr_bin() -> str:
    found = shutil.which("ctr")
    if not found:
        raise FileNotFoundError("ctr not found: apt-get install containerd")
    return found
