"""The images' hashed locks (locks/, hack/lock.py): the committed ones agree with pyproject.toml and constraints.txt,
and the offline check finds each way a lock can disagree. No network, no builder."""

from __future__ import annotations

import re
from pathlib import Path

from tests.scripts import load_script

lock = load_script("hack/lock.py")
REPO = Path(__file__).resolve().parents[2]
H1 = "sha256:" + "a" * 64
H2 = "sha256:" + "b" * 64
LOCK = f"""# generated
pydantic==2.14.3 \\
    --hash={H1} \\
    --hash={H2}
    # via -r locks/x.in
torch==2.15.0 \\
    --hash={H1}
"""
PINS = {"pydantic": "2.14.3", "torch": "2.15.0", "pyyaml": "6.0.3"}


def test_the_committed_locks_agree() -> None:
    assert lock.check(lock.all_inputs()) == []


def test_parse_lock_reads_versions_and_hashes() -> None:
    assert lock.parse_lock(LOCK) == {
        "pydantic": lock.Pin("2.14.3", (H1, H2)),
        "torch": lock.Pin("2.15.0", (H1,)),
    }


def test_a_lock_that_agrees_has_no_problems() -> None:
    assert lock.lock_problems("x", lock.parse_lock(LOCK), ["pydantic>=2", "torch"], PINS) == []


def test_another_version_than_constraints_is_a_problem() -> None:
    problems = lock.lock_problems("x", lock.parse_lock(LOCK), [], {**PINS, "torch": "2.16.0"})
    assert problems == ["locks/x.txt: torch==2.15.0, constraints.txt has torch==2.16.0"]


def test_a_package_constraints_lacks_is_a_problem() -> None:
    pins = {k: v for k, v in PINS.items() if k != "pydantic"}
    assert lock.lock_problems("x", lock.parse_lock(LOCK), [], pins) == [
        "locks/x.txt: pydantic==2.14.3 is not in constraints.txt"
    ]


def test_an_entry_without_hash_or_exact_pin_is_a_problem() -> None:
    text = LOCK + "pyyaml>=6\n"
    problems = lock.lock_problems("x", lock.parse_lock(text), [], PINS)
    assert problems == ["locks/x.txt: pyyaml is not pinned with ==", "locks/x.txt: pyyaml has no --hash"]


def test_an_input_missing_from_the_lock_is_a_problem() -> None:
    problems = lock.lock_problems("x", lock.parse_lock(LOCK), ["PyYAML>=6.0"], PINS)
    assert problems == ["locks/x.txt: pyyaml (locks/x.in) is missing"]


def test_cpu_inputs_drop_torch_and_its_cuda_requirements() -> None:
    torch_requires = [
        "filelock",
        "sympy>=1.13.3",
        'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
        'cuda-bindings<14,>=13.0.3; platform_system == "Linux"',
        'triton~=3.9.0; platform_system == "Linux"',
        'pywin32; platform_system == "Windows"',
        'optree>=0.13.0; extra == "optree"',
    ]
    assert lock.cpu_inputs(["torch>=2.15", "numpy>=2.0"], torch_requires) == ["numpy>=2.0", "filelock", "sympy>=1.13.3"]


def test_the_cpu_lock_has_no_cuda_package_and_no_torch() -> None:
    cpu = lock.parse_lock((REPO / "locks" / "runner-cpu.txt").read_text())
    cuda = lock.parse_lock((REPO / "locks" / "runner.txt").read_text())
    assert "torch" in cuda
    assert "nvidia-nccl-cu13" in cuda
    assert not [name for name in cpu if name == "torch" or lock.CUDA_ONLY.match(name)]
    assert set(cpu) < set(cuda)


def test_the_check_sees_a_stale_in_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(lock, "LOCKS", tmp_path)
    (tmp_path / "x.in").write_text(lock.in_text("x", ["pydantic>=2"]))
    (tmp_path / "x.txt").write_text(LOCK)
    assert lock.check({"x": ["pydantic>=2"]}) == []
    assert lock.check({"x": ["pydantic>=2", "torch"]}) == ["locks/x.in is not what pyproject.toml gives"]


def test_the_images_install_their_locks_with_hashes() -> None:
    """Each Dockerfile installs a lock the wheelhouse downloads, in hash-checking mode, and no bare package."""
    wheel_locks = re.search(r"^WHEEL_LOCKS=\(([^)]*)\)", (REPO / "hack" / "images.sh").read_text(), flags=re.M)
    assert wheel_locks is not None
    downloaded = {Path(p).name for p in wheel_locks.group(1).split()}
    for dockerfile, expected in (
        ("Dockerfile.runner", {"runner.txt", "sbom.txt"}),
        ("Dockerfile.operator", {"operator.txt", "sbom.txt"}),
    ):
        text = (REPO / dockerfile).read_text().replace("\\\n", " ")
        named = set(re.findall(r"/tmp/locks/([\w.-]+\.txt)", text))
        assert expected <= named <= downloaded | {"runner-cpu.txt"}, (dockerfile, named)
        installs = re.findall(r"pip install ([^;\n]*)", text)
        assert [i for i in installs if "--require-hashes -r " in i], dockerfile
        unhashed = [i for i in installs if "--require-hashes -r " not in i]
        # the one exception: torch from a PyTorch index (TORCH_INDEX), pinned by version
        assert all("--index-url" in i and "torch==" in i for i in unhashed), unhashed
