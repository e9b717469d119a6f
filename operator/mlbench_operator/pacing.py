"""How fast one run's daemon may act on the API: pure, with the clock passed in.

The planner (:mod:`.run.policies`) says *what* a run needs (create these pods, delete that stale
world); this says *whether now* and *when to look again*. Its three rules each keep a busy or
refusing API server from being hammered, and each is about a gap between what we asked for and
what we can see:

* the create grace: a pod whose create was answered moments ago that the watch has not delivered yet is
  not asked for again (the index lags the API server; re-creating would be a storm of 409s). It counts from
  the answer, not the ask: a create may wait long for a fair slot (:mod:`.fairshare`);
* the create backoff: pod creates refused with 403 (quota, policy), or failing transiently (429, 5xx, no
  answer: :func:`mlbench_operator.kube.transient`), wait 5 s, doubling to 120 s, and a pod event does
  not shorten the wait (a refused world still sends pod events);
* the slow start: after a pod create refused with 403 or 429 (a quota, a throttled API server), the next creates
  go in batches of 1, 2, 4, ... (each only after the one before went through, as the Job and JobSet
  controllers do; a refusal starts again from 1), back to all at once past :data:`SLOW_START_MAX`;
* the stale-delete grace: a stale world (a gang restart) is deleted at most once per 10 s, since
  its pods show up Terminating only a little later and would otherwise be deleted again.

Every method takes ``now``: monotonic seconds (``time.monotonic()`` in the handlers; any number in
the tests). Nothing here reads a clock, so every rule is a table test (tests/operator/test_pacing.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Don't re-create a pod whose create was answered this recently but that the watch has not shown yet.
CREATE_GRACE_SECONDS = 30.0
#: Don't delete a stale world again this soon after deleting it.
DELETE_GRACE_SECONDS = 10.0
#: The first wait after refused (403) or transiently failing pod creates; it doubles with each such round in
#: a row, up to the cap.
BACKOFF_FIRST_SECONDS = 5.0
BACKOFF_MAX_SECONDS = 120.0
#: The slow start's largest batch: once a batch of this size went through, creates go all at once again.
SLOW_START_MAX = 256
#: Refusals that start the slow start: a quota or policy (403), a throttled API server (429).
SLOW_START_CODES = (403, 429)
#: Added to a computed wake-up, so that the rule waited for has expired when the daemon looks again.
MARGIN_SECONDS = 0.1


@dataclass
class Pacing:
    """One run's pacing state; lost on an operator restart, which only costs one early retry."""

    #: The unprompted re-check interval (``MLBENCH_RESYNC_SECONDS``): the latest any wake-up is.
    resync_seconds: float
    create_grace_seconds: float = CREATE_GRACE_SECONDS
    delete_grace_seconds: float = DELETE_GRACE_SECONDS
    #: Pod name -> when its create was last asked for, then answered (the create grace counts from there).
    recent: dict[str, float] = field(default_factory=dict)
    #: When the last stale world was deleted (-inf: never).
    stale_deleted_at: float = -math.inf
    #: Refused (403) or transiently failing (429, 5xx, no answer) create rounds in a row.
    create_failures: int = 0
    #: No pod creates before this.
    create_backoff_until: float = -math.inf
    #: Pod creates per batch (None: all at once; see :func:`next_batch`).
    batch: int | None = None
    #: The earliest a rule of this pass wants the daemon back (see :meth:`wake_in`).
    retry_in: float = field(init=False)

    def __post_init__(self) -> None:
        self.retry_in = self.resync_seconds

    def begin_pass(self) -> None:
        """A new pass: only the rules this pass meets shorten the next wake-up."""
        self.retry_in = self.resync_seconds

    def _wake_within(self, seconds: float) -> None:
        self.retry_in = min(self.retry_in, seconds)

    # -- creates ------------------------------------------------------------------------------------------
    def may_create(self, name: str, now: float) -> bool:
        """Whether to ask for pod ``name`` now; a yes is recorded as asked.

        No when it was asked for less than the grace ago: the watch has not shown it yet, and
        asking again would only get a 409 (one per pod: a storm for a 1000-worker world). The daemon
        then comes back when the grace is over, in case the pod really never came (the create was
        lost).
        """
        age = now - self.recent.get(name, -math.inf)
        if age < self.create_grace_seconds:
            self._wake_within(self.create_grace_seconds - age + MARGIN_SECONDS)
            return False
        self.recent[name] = now
        return True

    def create_answered(self, name: str, now: float) -> None:
        """The create of ``name`` was answered (created, or 409: there already): its grace counts from ``now``.

        Counted from the ask (:meth:`may_create`), the grace ran out while the create waited for a fair slot
        behind other tenants' creates (:mod:`.fairshare`), and the next pass, which a lagging watch had not shown
        the pod yet, asked again: answered 409 (issue 33's tenant load: 2050 pod creates for 1050 pods). The ask's
        stamp stays for a pass that ends without an answer (cancelled): then the grace counts from the ask.
        """
        self.recent[name] = now

    def create_failed(self, name: str) -> None:
        """The create of ``name`` failed: no pod is coming, so the grace must not hold back the retry."""
        self.recent.pop(name, None)

    def creates_paused(self, now: float) -> bool:
        """Whether pod creates wait for the backoff of earlier refusals (then the wake-up is its end).

        Pod events wake the daemon during the wait, and a pass must not turn them into another
        round of refused creates: only the backoff's end (or a later pass) retries.
        """
        left = self.create_backoff_until - now
        if left > 0:
            self._wake_within(left + MARGIN_SECONDS)
            return True
        return False

    def creates_refused(self, now: float) -> float:
        """Pod creates were refused (403: quota, policy, which an admin may lift) or failed transiently (429,
        5xx or no answer: an overloaded or failing API server, :func:`mlbench_operator.kube.transient`): wait
        before the next round, 5 s doubling to 120 s, so such an API server is asked rarely but the run
        resumes soon once it allows or recovers. Returns the wait."""
        self.create_failures += 1
        delay = min(BACKOFF_FIRST_SECONDS * 2 ** (self.create_failures - 1), BACKOFF_MAX_SECONDS)
        self.create_backoff_until = now + delay
        return delay

    def creates_succeeded(self) -> None:
        """A round of creates went through: the next refusal starts the backoff from its first step."""
        self.create_failures = 0

    def batch_done(self, codes: list[int]) -> bool:
        """A batch of creates came back (``codes``: see :func:`next_batch`): the next batch's size; True when
        the next batch may go now (everything in this one went through)."""
        self.batch = next_batch(self.batch, codes)
        return all(went_through(code) for code in codes)

    # -- stale worlds ------------------------------------------------------------------------------------
    def may_delete_stale(self, now: float) -> bool:
        """Whether to delete a stale world now (else the wake-up is the grace's end).

        Right after a deletion the index still shows the old pods as they were (not yet
        Terminating), so the planner asks for the same deletion again; the grace lets the watch
        catch up instead of sending the deletes twice.
        """
        age = now - self.stale_deleted_at
        if age <= self.delete_grace_seconds:
            self._wake_within(self.delete_grace_seconds - age + MARGIN_SECONDS)
            return False
        return True

    def stale_deleted(self, now: float) -> None:
        """A stale world was deleted: its replacements are new pods, so no create grace holds for them."""
        self.stale_deleted_at = now
        self.recent.clear()

    # -- the next pass -----------------------------------------------------------------------------------
    def wake_in(self, requeue_after: float | None = None) -> float:
        """Seconds until the next unprompted pass: the earliest of the planner's ``requeue_after`` (when
        it has one), what this pass's rules want, and the resync interval."""
        return min(requeue_after or self.resync_seconds, self.retry_in, self.resync_seconds)


def went_through(code: int) -> bool:
    """A create answered ``code`` (0: no answer) went through: created, or there already (409)."""
    return 0 < code < 400 or code == 409


def next_batch(batch: int | None, codes: list[int]) -> int | None:
    """The slow start's next batch of pod creates (None: no limit) after one whose creates were answered
    ``codes`` (an HTTP status each; 0: no answer): a 403 or 429 starts again from 1; a batch that went
    through whole doubles, back to no limit past :data:`SLOW_START_MAX`; any other failure keeps the size."""
    if any(code in SLOW_START_CODES for code in codes):
        return 1
    if batch is None or not all(went_through(code) for code in codes):
        return batch
    return None if batch * 2 > SLOW_START_MAX else batch * 2
