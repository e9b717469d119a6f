"""The images ``make images`` builds keep the runtime contract the operator relies on.

What the operator's pods need from them (operator/mlbench_operator/runpods.py): the runner
image runs as UID 1000 (user ``mlbench``), starts a non-root sshd with the per-run key, has
``mpirun`` and ``mlbench-runner`` and Python with torch + mpi4py, and no compiler (the
builder stage has one, the runtime stage must not; only a build from a CUDA torch index, or
with RUNTIME_CC=1, adds gcc for torch.compile's Triton, and the image built here is neither);
the operator image runs as 65532, imports its handlers and carries no torch. Both carry their SBOM (CycloneDX JSON of
their Python packages, as locks/ pin them) and the OCI labels of their version, revision, source and base. A second
build must be a cache hit: ``make images`` runs before every e2e session and must not rebuild several GB.

The images are those of ``IMAGE_REPO`` (default localhost/mlbench), as ``hack/images.sh`` names them.

The images are built once per session (``hack/images.sh build``, itself a no-op when
they are current) and every check runs a throwaway container without network.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from mlbench_api import contract
from mlbench_operator import naming as n
from mlbench_operator import runobjects, sshkeys
from mlbench_operator.policy import DEFAULT_IMAGE_REPO, DEFAULT_RUNNER_IMAGE
from mlbench_operator.run import admission
from mlbench_operator.runpods import WORKER_SCRIPT
from mlbench_runner.pod.collect import ssh_options
from tests.operator import helpers as h
from tests.scripts import load_script

lock = load_script("hack/lock.py")
REPO = Path(__file__).resolve().parents[2]
IMAGES_SH = REPO / "hack" / "images.sh"
IMAGE_REPO = os.environ.get("IMAGE_REPO", "").rstrip("/") or DEFAULT_IMAGE_REPO
RUNNER = DEFAULT_RUNNER_IMAGE.replace(DEFAULT_IMAGE_REPO, IMAGE_REPO)
OPERATOR = RUNNER.replace("/mlbench-runner:", "/mlbench-operator:")
#: what build-essential brings (openmpi-bin's mpicc wrapper stays: without a compiler it compiles nothing)
COMPILERS = ("gcc", "cc", "c++", "g++", "cpp", "clang", "make")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _answers(cmd: Sequence[str]) -> bool:
    """Whether ``cmd`` (``docker info``/``podman info``) exits 0 within a short time."""
    if shutil.which(cmd[0]) is None:
        return False
    try:
        return subprocess.run(cmd, check=False, capture_output=True, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _builder() -> str | None:
    """The builder hack/images.sh would pick (docker with a daemon, else podman), or None."""
    chosen = os.environ.get("MLBENCH_BUILDER")
    if chosen:
        return chosen
    for name in ("docker", "podman"):
        if _answers([name, "info"]):
            return name
    return None


def images_sh(*args: str) -> subprocess.CompletedProcess[str]:
    """``hack/images.sh ARGS`` with its output captured (the step timings are on stderr)."""
    return subprocess.run(
        ["bash", str(IMAGES_SH), *args], check=False, cwd=REPO, text=True, capture_output=True, timeout=3600
    )


@dataclass(frozen=True)
class Images:
    builder: str
    #: extra ``run`` flags the builder needs here (podman: runc, explicit ulimits)
    run_flags: tuple[str, ...]
    build_log: str

    def run(
        self, image: str, script: str, *, user: str | None = None, volumes: Sequence[str] = ()
    ) -> subprocess.CompletedProcess[str]:
        """``sh -c SCRIPT`` in a throwaway container of ``image`` (no network), as its own user unless ``user``."""
        cmd = [self.builder, "run", "--rm", "--network=none", *self.run_flags, "--entrypoint", "/bin/sh"]
        if user is not None:
            cmd += ["--user", user]
        for volume in volumes:
            cmd += ["--volume", volume]
        return subprocess.run([*cmd, image, "-c", script], check=False, text=True, capture_output=True, timeout=300)

    def check(self, image: str, script: str, *, user: str | None = None, volumes: Sequence[str] = ()) -> str:
        """Like :meth:`run`, failing the test with the container's output when ``script`` fails."""
        proc = self.run(image, script, user=user, volumes=volumes)
        assert proc.returncode == 0, f"{image}: `{script}` exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def image_id(self, image: str) -> str:
        return self.inspect(image, "{{.Id}}")

    def inspect(self, image: str, template: str) -> str:
        cmd = [self.builder, "image", "inspect", "--format", template, image]
        out = subprocess.run(cmd, text=True, capture_output=True, check=True)
        return out.stdout.strip()

    def labels(self, image: str) -> dict[str, str]:
        return dict(json.loads(self.inspect(image, "{{json .Config.Labels}}")))


@pytest.fixture(scope="session")
def images() -> Images:
    """Both images, built (or found current) once per session."""
    builder = _builder()
    if builder is None:
        pytest.skip("no image builder: neither `docker info` nor `podman info` answers")
    if shutil.which("mmdebstrap") is None and os.environ.get("MLBENCH_BASE", "local") == "local":
        pytest.skip("no registry here and no mmdebstrap for the local base image (apt-get install mmdebstrap)")
    start = time.monotonic()
    assert images_sh("tags").stdout.split() == [OPERATOR, RUNNER]  # IMAGE_REPO names them as this module does
    proc = images_sh("build")
    assert proc.returncode == 0, f"hack/images.sh build failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    print(f"hack/images.sh build: {time.monotonic() - start:.1f}s\n{proc.stderr[-2000:]}")
    flags = images_sh("run-flags").stdout.split() if builder == "podman" else []
    return Images(builder, tuple(flags), proc.stderr)


def test_runner_runs_as_uid_1000_mlbench(images: Images) -> None:
    assert images.check(RUNNER, "id -u; id -un; echo $HOME").split() == ["1000", "mlbench", "/home/mlbench"]


def test_runner_has_no_compiler(images: Images) -> None:
    # one `command -v` per name: dash's stops at the first name it does not find
    found = images.run(RUNNER, " ; ".join(f"command -v {c}" for c in COMPILERS) + "; true").stdout.split()
    assert found == [], f"the runtime stage must not ship a compiler, found {found}"


def test_runner_python_imports(images: Images) -> None:
    script = (
        "python -c 'import torch, mpi4py.MPI, numpy, PIL, prometheus_client, structlog, yaml, sacrebleu, "
        "mlbench_runner.rank.train, mlbench_api.catalog; "
        "print(torch.__version__, mpi4py.MPI.Get_library_version()[:16])'"
    )
    out = images.check(RUNNER, script)
    assert out.startswith("2.15.0"), out
    assert "Open MPI" in out, out


def test_runner_tools_on_default_path(images: Images) -> None:
    """ssh sessions (mpirun's ranks) get sshd's default PATH, not the image's ENV."""
    out = images.check(
        RUNNER,
        "PATH=/usr/local/bin:/usr/bin:/bin; for t in mlbench-runner ssh ssh-keygen mpirun orted;"
        " do command -v $t; done; ls /usr/sbin/sshd",
    )
    assert out.split() == [
        "/usr/local/bin/mlbench-runner",
        "/usr/bin/ssh",
        "/usr/bin/ssh-keygen",
        "/usr/bin/mpirun",
        "/usr/bin/orted",
        "/usr/sbin/sshd",
    ]
    assert "launch" in images.check(RUNNER, "PATH=/usr/local/bin:/usr/bin:/bin; mlbench-runner --help")


def test_runner_has_tc_for_network_emulation(images: Images) -> None:
    """The netem init container (spec.network) runs `mlbench-runner netem`, which runs iproute2's tc."""
    out = images.check(RUNNER, "command -v tc; mlbench-runner netem --interface eth0 --latency-ms 5 --dry-run")
    assert out.splitlines()[0] == "/usr/sbin/tc", out
    assert "netem" in out
    assert "delay 5ms" in out


def test_runner_catalog_and_writable_cache(images: Images) -> None:
    script = 'ls /etc/mlbench/catalog; touch "$MLBENCH_CACHE/probe"; echo "cache=$MLBENCH_CACHE"'
    out = images.check(RUNNER, script, user="1000:1000")
    assert "cifar10-resnet20.yaml" in out.split()
    assert "cache=/var/cache/mlbench" in out


def test_runner_worker_sshd_accepts_the_run_key(images: Images, tmp_path: Path) -> None:
    """The worker entrypoint the operator runs (non-root sshd on 2222, the run's host key) lets the
    run's key in with the launcher's strict options, and a command over ssh finds mlbench-runner:
    what mpirun does on every rank."""
    result = admission.admit(h.run(), h.task())
    assert not isinstance(result, admission.Rejection), result
    ctx = result[0]
    secret = runobjects.ssh_secret(ctx, sshkeys.generate_keypair("images-test"))
    for name, text in secret["stringData"].items():  # the Secret volume's files
        (tmp_path / name).write_text(text)
    tmp_path.chmod(0o755)  # pytest makes it 0700: UID 1000 could not reach the key
    for f in tmp_path.iterdir():
        f.chmod(0o444)  # any UID in the container may read them (the Secret is 0440 + fsGroup)
    options = ssh_options(
        contract.SSH_PORT,
        f"{contract.SSH_DIR}/{contract.SSH_PRIVATE_KEY}",
        f"{contract.SSH_DIR}/{contract.SSH_KNOWN_HOSTS}",
        n.ssh_host_key_alias(ctx.name, ctx.namespace),
    )
    script = (
        f"({WORKER_SCRIPT}) >/tmp/sshd.log 2>&1 &\n"
        "for i in $(seq 50); do [ -f /tmp/mlbench-sshd/sshd.pid ] && break; sleep 0.2; done\n"
        f"ssh {shlex.join(options)} localhost 'id -u; command -v mlbench-runner' || {{ cat /tmp/sshd.log; exit 1; }}"
    )
    out = images.check(RUNNER, script, user="1000:1000", volumes=[f"{tmp_path}:{contract.SSH_DIR}:ro"])
    assert out.split()[-2:] == ["1000", "/usr/local/bin/mlbench-runner"], out


def test_operator_runs_as_65532_without_torch(images: Images) -> None:
    out = images.check(
        OPERATOR,
        "id -u; python -c 'import importlib.util as u, mlbench_operator.handlers; print(u.find_spec(\"torch\"))'; "
        "command -v ssh-keygen",
    )
    assert out.split() == ["65532", "None", "/usr/bin/ssh-keygen"]


def test_operator_entrypoint_starts(images: Images) -> None:
    """The Deployment's container command: ``python -m mlbench_operator.main --help`` works as 65532."""
    out = images.check(OPERATOR, "python -m mlbench_operator.main --help")
    assert "--metrics-port" in out


def test_second_build_is_a_cache_hit(images: Images) -> None:
    before = {image: images.image_id(image) for image in (RUNNER, OPERATOR)}
    proc = images_sh("build")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "operator: cache hit" in proc.stderr, proc.stderr
    assert "runner: cache hit" in proc.stderr, proc.stderr
    assert " build: " not in proc.stderr, f"something was rebuilt:\n{proc.stderr}"
    assert {image: images.image_id(image) for image in (RUNNER, OPERATOR)} == before


def sbom(images: Images, image: str) -> dict:
    """The image's SBOM, read inside it at the path its label io.mlbench.sbom names, valid CycloneDX 1.6 JSON."""
    path = images.labels(image)["io.mlbench.sbom"]
    text = images.check(image, f"cat {shlex.quote(path)}")
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    assert error is None, str(error)[:2000]
    return dict(json.loads(text))


def pypi_versions(bom: dict) -> dict[str, str]:
    """The SBOM's PyPI components: canonical name -> version (from their purls)."""
    versions = {}
    for component in bom["components"]:
        purl = re.match(r"pkg:pypi/([^@]+)@([^?#]+)", component.get("purl", ""))
        assert purl is not None, component
        versions[lock.canonicalize_name(purl.group(1))] = purl.group(2)
    return versions


@pytest.mark.parametrize("name", ["runner", "operator"])
def test_sbom_lists_what_the_lock_pins(images: Images, name: str) -> None:
    """Every package of the image's lock is in its SBOM at the lock's version (torch at constraints.txt's), the root
    component is the image at the project's version, and nothing else is there but what `python -m venv` put in the
    venv (Debian's ensurepip: pip, and setuptools where the lock has none)."""
    image = RUNNER if name == "runner" else OPERATOR
    bom = sbom(images, image)
    assert bom["metadata"]["component"]["name"] == f"mlbench-{name}"
    assert bom["metadata"]["component"]["version"] == RUNNER.rsplit(":", 1)[1]
    locked = lock.parse_lock((REPO / "locks" / f"{name}.txt").read_text())
    pinned = {pkg: pin.version for pkg, pin in locked.items()}
    listed = pypi_versions(bom)
    assert {pkg: listed.get(pkg) for pkg in pinned} == pinned
    assert set(listed) - set(pinned) <= {"pip", "setuptools"}
    if name == "runner":
        assert listed["torch"] == lock.parse_pins((REPO / "constraints.txt").read_text())["torch"]
    else:
        assert "torch" not in listed


def test_sbom_comes_out_with_make_sbom(images: Images, tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(IMAGES_SH), "sbom"],
        check=False,
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "MLBENCH_SBOM_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    for image in (OPERATOR, RUNNER):
        out = tmp_path / f"{image.rsplit('/', 1)[1].replace(':', '-')}.cdx.json"
        assert json.loads(out.read_text()) == sbom(images, image)


@pytest.mark.parametrize("image", [RUNNER, OPERATOR])
def test_labels_name_version_revision_source_and_base(images: Images, image: str) -> None:
    labels = images.labels(image)
    dockerfile = "Dockerfile.runner" if image == RUNNER else "Dockerfile.operator"
    expected = dict(arg.split("=", 1) for arg in images_sh("oci-args", dockerfile).stdout.split())
    assert labels["org.opencontainers.image.version"] == expected["VERSION"] == RUNNER.rsplit(":", 1)[1]
    assert labels["org.opencontainers.image.revision"] == expected["REVISION"]
    assert labels["org.opencontainers.image.source"] == expected["SOURCE"]
    base = labels["org.opencontainers.image.base.name"]
    digest = labels["org.opencontainers.image.base.digest"]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), labels
    if "@" in base:  # BASE_IMAGE=name@sha256:...
        assert base.endswith(f"@{digest}")
    else:  # the local base (or a tag): the builder's digest of the image the build started from
        assert images.inspect(base, "{{.Digest}}") == digest
