"""The CIFAR-10 pickles go through a restricted unpickler: real batches load, planted code does not run.

The dataset volume is shared by a namespace's runs, so a batch file is untrusted input to every other
tenant's ranks. "Real" here means the bytes of the original archive's batches: Python 2 pickles
(protocol 2) of ``{'batch_label': str, 'labels': [int], 'data': uint8 array, 'filenames': [str]}``,
written below opcode by opcode because Python 3 cannot produce a Python 2 ``str`` pickle; plus the
same batch re-pickled by Python 3 / numpy 2 at every protocol, as a converted copy would be.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import shlex
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mlbench_runner.data.cifar import UnsafePickleError, load_cifar_batch, load_cifar_python
from tests.runner.helpers import write_cifar_python

# ---------------------------------------------------------------- a Python 2 (cPickle, protocol 2) writer


def _py2_str(b: bytes) -> bytes:
    """A Python 2 ``str``: SHORT_BINSTRING / BINSTRING (read back as bytes with ``encoding='bytes'``)."""
    return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<i", len(b)) + b


def _py2_int(i: int) -> bytes:
    if 0 <= i < 256:
        return b"K" + bytes([i])
    if 0 <= i < 65536:
        return b"M" + struct.pack("<H", i)
    return b"J" + struct.pack("<i", i)


def _py2_uint8_array(a: np.ndarray) -> bytes:
    """``ndarray.__reduce__`` as numpy 1.x under Python 2 wrote it, byte for byte in structure."""
    assert a.dtype == np.uint8
    assert a.ndim == 2
    shape = _py2_int(a.shape[0]) + _py2_int(a.shape[1]) + b"\x86"
    dtype = (
        b"cnumpy\ndtype\n" + _py2_str(b"u1") + _py2_int(0) + _py2_int(1) + b"\x87R"
        # dtype.__setstate__((3, '|', None, None, None, -1, -1, 0))
        + b"(" + _py2_int(3) + _py2_str(b"|") + b"NNN" + b"J\xff\xff\xff\xff" * 2 + _py2_int(0) + b"tb"
    )  # fmt: skip
    return (
        b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + _py2_int(0) + b"\x85" + _py2_str(b"b")
        + b"\x87R"
        # ndarray.__setstate__((1, shape, dtype, False, raw bytes))
        + b"(" + _py2_int(1) + shape + dtype + b"\x89" + _py2_str(a.tobytes()) + b"tb"
    )  # fmt: skip


def py2_cifar_batch(data: np.ndarray, labels: list[int], label: bytes = b"training batch 1 of 5") -> bytes:
    """A batch exactly as the cifar-10-python.tar.gz archive holds it (dict of Python 2 strs)."""
    items = [
        (b"batch_label", _py2_str(label)),
        (b"labels", b"](" + b"".join(_py2_int(v) for v in labels) + b"e"),
        (b"data", _py2_uint8_array(data)),
        (b"filenames", b"](" + b"".join(_py2_str(f"img_{i}.png".encode()) for i in range(len(labels))) + b"e"),
    ]
    return b"\x80\x02}(" + b"".join(_py2_str(k) + v for k, v in items) + b"u."


def _sample(n: int = 7, seed: int = 0) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8), [int(v) for v in rng.integers(0, 10, n)]


def _globals(blob: bytes) -> set[str]:
    """The globals a pickle names (GLOBAL opcodes), to show what the allowlist is tested against."""
    return {str(arg).replace(" ", ".") for op, arg, _ in pickletools.genops(blob) if op.name == "GLOBAL"}


# ---------------------------------------------------------------- valid batches load


def test_original_python2_batch_loads(tmp_path: Path) -> None:
    data, labels = _sample()
    blob = py2_cifar_batch(data, labels)
    assert _globals(blob) == {"numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype"}
    # the hand-written bytes are what the unrestricted reader (the CIFAR page's recipe) also accepts
    plain = pickle.loads(blob, encoding="bytes")
    np.testing.assert_array_equal(plain[b"data"], data)

    (tmp_path / "data_batch_1").write_bytes(blob)
    batch = load_cifar_batch(tmp_path / "data_batch_1")
    assert set(batch) == {b"batch_label", b"labels", b"data", b"filenames"}
    assert batch[b"data"].dtype == np.uint8
    np.testing.assert_array_equal(batch[b"data"], data)
    assert batch[b"labels"] == labels
    assert batch[b"batch_label"] == b"training batch 1 of 5"
    assert batch[b"filenames"][0] == b"img_0.png"


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_batch_repickled_by_python3_loads(tmp_path: Path, protocol: int) -> None:
    """Converted copies: numpy._core names, _codecs.encode (protocols 2-3), _frombuffer (protocol 5)."""
    data, labels = _sample(seed=protocol)
    file = tmp_path / "test_batch"
    file.write_bytes(pickle.dumps({b"data": data, b"labels": labels, b"batch_label": b"x"}, protocol=protocol))
    batch = load_cifar_batch(file)
    np.testing.assert_array_equal(batch[b"data"], data)
    assert batch[b"data"].flags.writeable
    assert batch[b"labels"] == labels


def test_whole_folder_of_python2_batches_loads(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i, name in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
        data, labels = _sample(n=4, seed=i)
        (folder / name).write_bytes(py2_cifar_batch(data, labels))
    ds = load_cifar_python(folder)
    assert ds.x_train.shape == (20, 3, 32, 32)
    assert ds.x_test.shape == (4, 3, 32, 32)


def test_the_test_helper_batches_load(tmp_path: Path) -> None:
    """The fake folder every other runner test uses still goes through (default protocol)."""
    ds = load_cifar_python(write_cifar_python(tmp_path, n_train=20, n_test=10))
    assert ds.x_train.shape == (20, 3, 32, 32)


# ---------------------------------------------------------------- planted code does not run


class _ShellPayload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


class _OpenPayload:
    """No shell needed: ``open(marker, 'w')`` creates the file when called."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize(
    ("payload", "refused"),
    [
        # the plain reader runs the payload to show it is live: a shell, a process
        pytest.param(_ShellPayload, f"{os.system.__module__}.system", marks=pytest.mark.multiproc),
        (_OpenPayload, "io.open"),
    ],
)
def test_malicious_batch_is_refused_without_running(tmp_path: Path, payload: type, refused: str) -> None:
    marker = tmp_path / "pwned"
    blob = pickle.dumps({b"data": payload(marker), b"labels": [0]}, protocol=2)

    # the payload is live: the plain reader runs it
    pickle.loads(blob, encoding="bytes")
    assert marker.exists()
    marker.unlink()

    file = tmp_path / "data_batch_1"
    file.write_bytes(blob)
    with pytest.raises(UnsafePickleError) as exc:
        load_cifar_batch(file)
    assert str(file) in str(exc.value)
    assert refused in str(exc.value)
    assert not marker.exists()


def test_planted_batch_fails_the_whole_dataset(tmp_path: Path) -> None:
    """One bad file among good ones: loading the dataset fails, names that file, and runs nothing."""
    folder = write_cifar_python(tmp_path, n_train=20, n_test=10)
    marker = tmp_path / "pwned"
    (folder / "data_batch_3").write_bytes(pickle.dumps(_ShellPayload(marker)))
    with pytest.raises(UnsafePickleError, match="data_batch_3"):
        load_cifar_python(folder)
    assert not marker.exists()


@pytest.mark.parametrize(
    "blob",
    [
        # a global from an allowed module that is not on the list
        b"\x80\x02cnumpy\nload\nU\x01x\x85R.",
        # builtins via the Python 2 module name
        b"\x80\x02c__builtin__\neval\nU\x0bprint('hi')\x85R.",
        # protocol 4's STACK_GLOBAL goes through the same gate
        b"\x80\x04\x8c\x05posix\x8c\x06system\x93\x8c\x04true\x85R.",
    ],
)
def test_other_globals_are_refused(tmp_path: Path, blob: bytes) -> None:
    file = tmp_path / "data_batch_1"
    file.write_bytes(blob)
    with pytest.raises(UnsafePickleError, match="refers to the global"):
        load_cifar_batch(file)


@pytest.mark.parametrize(
    ("blob", "match"),
    [
        # _reconstruct of anything but an empty ndarray
        (b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\ndtype\nK\x00\x85U\x01b\x87R.", "only an empty"),
        # _codecs.encode with a codec other than latin1
        (b"\x80\x02c_codecs\nencode\nU\x03abcU\x04zlib\x86R.", "only latin1"),
        # a persistent id
        (b"\x80\x02U\x01xQ.", "persistent id"),
        # a pickle that is not a batch
        (b"\x80\x02]K\x01a.", "not a CIFAR-10 batch"),
        # truncated
        (b"\x80\x02}(U\x04data", "not a readable CIFAR-10 batch"),
    ],
)
def test_misused_allowed_names_and_non_batches(tmp_path: Path, blob: bytes, match: str) -> None:
    file = tmp_path / "data_batch_1"
    file.write_bytes(blob)
    with pytest.raises((UnsafePickleError, ValueError), match=match):
        load_cifar_batch(file)


def test_refused_error_is_an_unpickling_error() -> None:
    assert issubclass(UnsafePickleError, pickle.UnpicklingError)
