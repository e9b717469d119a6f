"""How each process of a run takes a stop signal, so that an interrupted run still leaves its summary.

Three kinds of process, three policies:

* **A rank** (:func:`stop_once`): the first SIGINT or SIGTERM raises :class:`Interrupted` (a
  ``KeyboardInterrupt``, so every ``finally`` that cleans up after a Ctrl-C runs), and the run ends
  with an ``aborted`` summary whose stop reason is ``interrupted``. Later signals are only noted:
  a second ``KeyboardInterrupt`` raised while the summary is written would cut it short, and once
  :func:`hold` has been called (the run is finishing, for whatever reason) even the first is only
  noted. ``mpirun`` and the kubelet stop with SIGTERM, whose default action ends Python at once (no
  summary, no ``run_stop`` event), and a launcher container's PID 1 ignores it altogether. Whoever
  sent the signal escalates to SIGKILL when a rank takes too long: the local launcher after its grace
  period, ``mpirun`` after a few seconds, the kubelet after the pod's grace period.
* **The pod launcher** (:func:`forwarded_once`, ``mlbench-runner launch``): the first SIGINT or SIGTERM
  is passed to ``mpirun`` as one SIGTERM (``mpirun`` stops its ranks with SIGTERM; a second SIGINT
  would make it kill them at once), and the launcher goes on reading until ``mpirun`` ends, so the
  summary line and the results still reach the termination log and the operator.
* **The local command** (:func:`interrupt_on`, ``mlbench run --local`` and ``mlbench sweep``): SIGTERM
  and SIGHUP raise ``KeyboardInterrupt`` as SIGINT does, so ``timeout``, a closed terminal and a Ctrl-C
  all take the same path: pass one SIGINT to each child, let them settle, then stop them
  (:func:`mlbench_runner.local.stopped_on_exit`). Its children run in their own process groups, so a
  terminal's Ctrl-C reaches only the command, which passes it on exactly once.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: The signals that stop a rank, or a launcher, gracefully.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop signal reached the rank; ``signal`` is its name (SIGINT, SIGTERM)."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        super().__init__(self.signal)


class _Rank:
    """The signals this rank received, and whether the next may still raise (module state: one per process)."""

    received: str | None = None
    holding: bool = False


def received() -> str | None:
    """The first stop signal this rank received inside :func:`stop_once` (SIGINT, SIGTERM), or None."""
    return _Rank.received


def hold() -> None:
    """From now on a stop signal is only noted, never raised: the run is writing its summary."""
    _Rank.holding = True


def linger(seconds: float, poll: float = 0.1) -> None:
    """Sleep up to ``seconds``, less if a stop signal comes (the last scrape is worth waiting for, not past a stop)."""
    end = time.monotonic() + seconds
    while _Rank.received is None and (left := end - time.monotonic()) > 0:
        time.sleep(min(poll, left))


def _on_stop_signal(signum: int, _frame: FrameType | None) -> None:
    first = _Rank.received is None
    if first:
        _Rank.received = signal.Signals(signum).name
    if first and not _Rank.holding:
        raise Interrupted(signum)


@contextmanager
def _handlers(signals: Sequence[signal.Signals], handler: Any) -> Iterator[bool]:
    """``handler`` for ``signals`` during the block (yields False, changing nothing, outside the main thread)."""
    if threading.current_thread() is not threading.main_thread():  # Python sets handlers there only
        yield False
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield True
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def stop_once() -> Iterator[None]:
    """A rank's policy for the block: the first SIGINT or SIGTERM raises :class:`Interrupted`, later ones
    (and any after :func:`hold`) are only noted in :func:`received`."""
    _Rank.received, _Rank.holding = None, False
    try:
        with _handlers(STOP_SIGNALS, _on_stop_signal):
            yield
    finally:
        _Rank.received, _Rank.holding = None, False  # the next run in this process starts clean


@contextmanager
def forwarded_once(proc: subprocess.Popen[Any]) -> Iterator[threading.Event]:
    """The pod launcher's policy: the first SIGINT or SIGTERM becomes one SIGTERM to ``proc``; later ones are
    ignored (``proc`` is already stopping its job; the sender escalates to SIGKILL if it takes too long).
    Yields the event that says a signal was passed on."""
    sent = threading.Event()

    def forward(_signum: int, _frame: FrameType | None) -> None:
        if not sent.is_set() and proc.poll() is None:
            sent.set()
            proc.terminate()

    with _handlers(STOP_SIGNALS, forward):
        yield sent


def _raise_keyboard_interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def interrupt_on(signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """The local command's policy: ``signals`` raise ``KeyboardInterrupt`` during the block, as SIGINT does."""
    with _handlers(signals, _raise_keyboard_interrupt):
        yield
