"""How each process of a run takes a stop signal, so that an interrupted run still leaves its summary.

Three kinds of process, a policy each:

* **A rank** (:func:`stop_once`): the first SIGINT, SIGTERM or SIGUSR1 raises :class:`Interrupted` (a
  ``KeyboardInterrupt``, so every ``finally`` that cleans up after a Ctrl-C runs), and the run ends
  with an ``aborted`` summary whose stop reason is ``interrupted``. Later signals are only noted:
  a second ``KeyboardInterrupt`` raised while the summary is written would cut it short, and once
  :func:`hold` has been called (the run is finishing, for whatever reason) even the first is only
  noted. The kubelet stops with SIGTERM, whose default action ends Python at once (no summary, no
  ``run_stop`` event), and a launcher container's PID 1 ignores it altogether. A signal that comes before
  (while torch is imported) is noted by :func:`noted_early` and raised on entering :func:`stop_once`.
* **The pod launcher** (:func:`forwarded_once`, ``mlbench-runner launch``): the first SIGINT or SIGTERM
  becomes one SIGUSR1 to ``mpirun``, which passes SIGUSR1 (and only it and SIGUSR2) on to every rank.
  Its own way to stop a job, on SIGTERM or SIGINT, gives each rank 1 s before a SIGKILL and blocks
  its output forwarding meanwhile: too short for a rank inside a long kernel or collective, and the
  summary line would be lost. The ranks end on their own (exit 3, an aborted run) and the launcher
  reads mpirun's output to its end, so the summary line and the results still reach the termination
  log and the operator. Only if they have not ended after ``escalate_after`` seconds, or a second
  signal comes, does mpirun get its SIGTERM. A stop that came before mpirun started (the launcher is its
  pod's PID 1, which ignores a signal it has no handler for) is noted, and mpirun is not started.
* **The local command** (:func:`interrupt_on`, ``mlbench run --local`` and ``mlbench sweep``): SIGTERM
  and SIGHUP raise ``KeyboardInterrupt`` as SIGINT does, so ``timeout``, a closed terminal and a Ctrl-C
  all take the same path: pass one SIGINT to each child, let them settle, then stop them and all
  their descendants (:func:`mlbench_runner.tools.processes.stopped_on_exit`); during that stop a further signal
  only cuts the wait at hand short (:func:`noted`). Its children run in their own
  process groups, so a terminal's Ctrl-C reaches only the command, which passes it on exactly once.

Whoever sent a stop escalates to SIGKILL when a process takes too long: the local command after its
grace period, the pod launcher's SIGTERM to mpirun, the kubelet after the pod's grace period.
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

#: The signals that stop a launcher gracefully.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The signals that stop a rank gracefully: those, and SIGUSR1, the pod launcher's, which mpirun passes on.
RANK_STOP_SIGNALS = (*STOP_SIGNALS, signal.SIGUSR1)


class Interrupted(KeyboardInterrupt):
    """A stop signal reached the rank; ``signal`` is its name (SIGINT, SIGTERM, SIGUSR1)."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum).name
        super().__init__(self.signal)


class _Rank:
    """The signals this rank received, and whether the next may still raise (module state: one per process)."""

    received: str | None = None
    holding: bool = False
    early: int | None = None  #: a stop signal noted before the process's policy took over (:func:`noted_early`)


def received() -> str | None:
    """The first stop signal this rank received inside :func:`stop_once` (SIGINT, SIGTERM, SIGUSR1), or None."""
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
def handlers(signals: Sequence[signal.Signals], handler: Any) -> Iterator[bool]:
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


def _note_early(signum: int, _frame: FrameType | None) -> None:
    """:func:`noted_early`'s handler: the first stop signal, kept for the policy that takes over."""
    if _Rank.early is None:
        _Rank.early = signum


@contextmanager
def noted_early(signals: Sequence[signal.Signals] = RANK_STOP_SIGNALS) -> Iterator[None]:
    """For the command's whole life: a stop signal outside its policy is only noted, and the policy acts on
    one noted before it at once (:func:`stop_once` raises it, :func:`forwarded_once` stops mpirun, and the
    launcher does not start mpirun at all: :func:`pending`).

    A rank spends its first seconds importing torch: there SIGUSR1 (the launcher's stop, passed on by mpirun) and
    SIGTERM would end it by their default action, with no word, and SIGINT's ``KeyboardInterrupt`` would come
    out of whatever import ran, as a traceback. The pod launcher is its container's PID 1, which ignores a
    SIGTERM it has no handler for: one before mpirun started would be lost, and the pod killed after its grace
    period. After the policy (the summary written, the results gathered) a signal is only noted too; the
    handlers the command found are back when the block ends. Main thread only.
    """
    _Rank.early = None
    try:
        with handlers(signals, _note_early):
            yield
    finally:
        _Rank.early = None


def pending() -> signal.Signals | None:
    """The stop signal :func:`noted_early` has noted and no policy has taken yet, if any."""
    return None if _Rank.early is None else signal.Signals(_Rank.early)


def _take_early() -> int | None:
    """:func:`pending`'s signal, now the caller's to act on (it is no longer pending)."""
    early, _Rank.early = _Rank.early, None
    return early


@contextmanager
def stop_once() -> Iterator[None]:
    """A rank's policy for the block: the first SIGINT, SIGTERM or SIGUSR1 raises :class:`Interrupted`, later
    ones (and any after :func:`hold`) are only noted in :func:`received`. One noted by :func:`noted_early`
    before the block raises on entering it."""
    _Rank.received, _Rank.holding = None, False
    try:
        with handlers(RANK_STOP_SIGNALS, _on_stop_signal):
            early = _take_early()  # after the handlers: a signal now is theirs, none falls between
            if early is not None:
                _on_stop_signal(early, None)
            yield
    finally:
        _Rank.received, _Rank.holding = None, False  # the next run in this process starts clean


@contextmanager
def forwarded_once(proc: subprocess.Popen[Any], escalate_after: float) -> Iterator[threading.Event]:
    """The pod launcher's policy for ``proc`` (mpirun): the first SIGINT or SIGTERM becomes one SIGUSR1 to it,
    and a SIGTERM ``escalate_after`` seconds later if it still runs; a second SIGINT or SIGTERM sends that
    SIGTERM at once (a second Ctrl-C: whoever sent it will not wait). Yields the event that says a stop was
    passed on."""
    sent = threading.Event()

    def escalate() -> None:
        if proc.poll() is None:
            proc.terminate()

    escalation = threading.Timer(escalate_after, escalate)
    escalation.daemon = True

    def forward(_signum: int, _frame: FrameType | None) -> None:
        if proc.poll() is not None:
            return
        if sent.is_set():  # asked again: the sender will not wait out the grace period
            escalation.cancel()
            escalate()
            return
        sent.set()
        proc.send_signal(signal.SIGUSR1)
        escalation.start()

    try:
        with handlers(STOP_SIGNALS, forward):
            if _take_early() is not None:
                # it came while mpirun started (the launcher checks pending() just before): mpirun may not
                # handle SIGUSR1 yet, and has no ranks to pass it to; its own stop ends what it started
                sent.set()
                escalate()
            yield sent
    finally:
        escalation.cancel()


#: The signals that stop the local command (as a Ctrl-C does).
COMMAND_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def noted(signals: Sequence[signal.Signals] = COMMAND_STOP_SIGNALS) -> Iterator[threading.Event]:
    """While the local command stops its children: ``signals`` only set the yielded event, which cuts the wait
    at hand short. A ``KeyboardInterrupt`` raised between two steps of the stop would skip the rest of it."""
    cut = threading.Event()
    with handlers(signals, lambda _signum, _frame: cut.set()):
        yield cut


def _raise_keyboard_interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextmanager
def interrupt_on(signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """The local command's policy: ``signals`` raise ``KeyboardInterrupt`` during the block, as SIGINT does."""
    with handlers(signals, _raise_keyboard_interrupt):
        yield
