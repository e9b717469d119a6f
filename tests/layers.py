"""Pytest plugin: the test layers, and the guard that keeps the unit layer honest.

Every test is in exactly one layer, chosen by its markers (registered in pyproject.toml):

  e2e        end to end on the test cluster's real nodes with the built images (``make e2e``)
  cluster    the real Kubernetes control plane (tests/cluster)
  multiproc  starts other processes: torch ranks, mpirun, sshd, prometheus, lua, the CLI in a subprocess
  unit       everything else: no process, no cluster (``make test-unit``)

``unit`` is never written by hand: collection adds it to every test that carries none of the
other three, so ``-m unit`` selects the layer. While a unit test (its fixtures included) runs,
starting a process (``subprocess``, ``multiprocessing``, ``os.fork``/``posix_spawn``/``system``)
raises :class:`ProcessInUnitTest`, and the test fails even if the code under test caught that
error: a test that starts processes cannot hide in the unit layer, whatever selects it. (Teardown is
guarded too, but for a module's last test, whose teardown may end fixtures of other layers; a process
started by compiled code, not through Python's ``os``/``subprocess``, is not seen.)
"""

from __future__ import annotations

import _posixsubprocess
import os
import posix
import subprocess
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

import pytest

#: the layers other than unit, most specific first (a test marked e2e is also marked cluster)
OTHER_LAYERS = ("e2e", "cluster", "multiproc")
UNIT = "unit"

#: where a process can start from Python: module, attribute. ``os`` re-exports ``posix``'s functions: both are
#: replaced, so that the replacement is the one object either name reaches (pickle checks that).
SPAWN_POINTS: tuple[tuple[Any, str], ...] = (
    (subprocess, "_fork_exec"),  # subprocess.Popen (its own name for _posixsubprocess.fork_exec)
    (_posixsubprocess, "fork_exec"),  # multiprocessing's spawn and forkserver
    *(
        (module, attr)
        for module in (os, posix)
        for attr in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")
    ),
)


class ProcessInUnitTest(RuntimeError):
    """A unit test tried to start a process."""


def layer(markers: set[str]) -> str:
    """The layer of a test with these marker names."""
    for name in OTHER_LAYERS:
        if name in markers:
            return name
    return UNIT


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = {m.name for m in item.iter_markers()}
        if UNIT in names:
            raise pytest.UsageError(f"{item.nodeid}: `unit` is given by collection, not by hand (tests/layers.py)")
        if layer(names) == UNIT:
            item.add_marker(UNIT)


@contextmanager
def no_processes(attempts: list[str]) -> Iterator[None]:
    """Within: every spawn point raises, and its name is appended to ``attempts``."""
    saved = [(module, attr, getattr(module, attr)) for module, attr in SPAWN_POINTS if hasattr(module, attr)]
    replacements: dict[int, Callable[..., Any]] = {}  # one per original: os.system and posix.system stay one
    for module, attr, original in saved:
        name = f"{module.__name__}.{attr}"
        setattr(module, attr, replacements.setdefault(id(original), _refuse(name, original, attempts)))
    try:
        yield
    finally:
        for module, attr, original in saved:
            setattr(module, attr, original)


def _refuse(name: str, original: Callable[..., Any], attempts: list[str]) -> Callable[..., Any]:
    @wraps(original)  # its module and name, so that pickle may still refer to it (tests/runner/test_cifar_pickle.py)
    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(name)
        raise ProcessInUnitTest(f"{name}: a unit test starts no process; mark the test `multiproc` (tests/layers.py)")

    return refuse


def _guarded(item: pytest.Item, guard: bool = True) -> Generator[None, Any, Any]:
    if not guard or item.get_closest_marker(UNIT) is None:
        return (yield)
    attempts: list[str] = []
    try:
        with no_processes(attempts):
            result = yield
    except BaseException:
        if not attempts:
            raise
        result = None
    if attempts:
        pytest.fail(f"unit test started a process ({', '.join(attempts)}): mark it `multiproc`", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    # The last test of a module also tears down the module's, package's or session's fixtures, which a
    # test of another layer may have set up (the cluster, the test operator): only the others are guarded.
    same_module = nextitem is not None and nextitem.path == item.path
    return (yield from _guarded(item, guard=same_module))
