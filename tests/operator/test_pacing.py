"""mlbench_operator.pacing: the create grace, the 403 backoff, the stale-delete grace, the next wake-up.

The clock is an argument, so each rule is a table of (what happened when, now) -> decision.
"""

from __future__ import annotations

import math

import pytest

from mlbench_operator.pacing import (
    BACKOFF_MAX_SECONDS,
    CREATE_GRACE_SECONDS,
    DELETE_GRACE_SECONDS,
    MARGIN_SECONDS,
    SLOW_START_MAX,
    Pacing,
    next_batch,
)

RESYNC = 300.0
T0 = 1000.0  # any monotonic origin: only differences count


def pacing() -> Pacing:
    return Pacing(resync_seconds=RESYNC)


# -- the create grace ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("asked_ago", "allowed", "wake"),
    [
        (None, True, RESYNC),  # never asked: ask
        (0.0, False, CREATE_GRACE_SECONDS + MARGIN_SECONDS),  # just asked: the watch has not shown it yet
        (10.0, False, CREATE_GRACE_SECONDS - 10.0 + MARGIN_SECONDS),  # back when the grace is over
        (CREATE_GRACE_SECONDS - 0.5, False, 0.5 + MARGIN_SECONDS),
        (CREATE_GRACE_SECONDS, True, RESYNC),  # the grace is over: the create was lost, ask again
        (CREATE_GRACE_SECONDS + 60.0, True, RESYNC),
    ],
)
def test_create_grace(asked_ago: float | None, allowed: bool, wake: float) -> None:
    p = pacing()
    if asked_ago is not None:
        assert p.may_create("r-worker-0", T0 - asked_ago)
        p.begin_pass()
    assert p.may_create("r-worker-0", T0) is allowed
    assert p.wake_in() == pytest.approx(wake)
    assert p.recent["r-worker-0"] == (T0 if allowed else T0 - (asked_ago or 0.0))  # a yes is recorded


@pytest.mark.parametrize(
    ("asked_ago", "answered_ago", "allowed", "wake"),
    [
        # the create waited 45 s for a fair slot and was answered just now: the watch has had no time yet
        (45.0, 0.0, False, CREATE_GRACE_SECONDS + MARGIN_SECONDS),
        (45.0, 1.0, False, CREATE_GRACE_SECONDS - 1.0 + MARGIN_SECONDS),
        (90.0, 20.0, False, CREATE_GRACE_SECONDS - 20.0 + MARGIN_SECONDS),
        (5.0, 4.0, False, CREATE_GRACE_SECONDS - 4.0 + MARGIN_SECONDS),  # a quick answer: as good as the ask
        (90.0, CREATE_GRACE_SECONDS, True, RESYNC),  # the grace after the answer is over: the pod was lost
        (400.0, 300.0, True, RESYNC),
    ],
)
def test_create_grace_counts_from_the_answer(asked_ago: float, answered_ago: float, allowed: bool, wake: float) -> None:
    """Issue 33: a create waits for a fair slot (fairshare) before it is sent; a grace counted from the ask ran
    out during a long wait, and the next pass, its pod not shown by a lagging watch, asked again (409)."""
    p = pacing()
    assert p.may_create("r-worker-0", T0 - asked_ago)
    p.create_answered("r-worker-0", T0 - answered_ago)
    p.begin_pass()
    assert p.may_create("r-worker-0", T0) is allowed
    assert p.wake_in() == pytest.approx(wake)


def test_an_answered_create_that_failed_is_retried_without_grace() -> None:
    p = pacing()
    assert p.may_create("w0", T0)
    p.create_answered("w0", T0 + 40.0)
    p.create_failed("w0")  # answered 500: no pod is coming
    assert p.may_create("w0", T0 + 41.0)


def test_create_grace_is_per_pod_and_keeps_the_earliest_wake_up() -> None:
    p = pacing()
    assert p.may_create("w0", T0)
    assert p.may_create("w1", T0 + 20.0)
    p.begin_pass()
    now = T0 + 25.0
    assert not p.may_create("w0", now)  # 5 s of grace left
    assert not p.may_create("w1", now)  # 25 s left
    assert p.may_create("w2", now)  # never asked
    assert p.wake_in() == pytest.approx(5.0 + MARGIN_SECONDS)


def test_a_failed_create_is_retried_without_grace() -> None:
    p = pacing()
    assert p.may_create("w0", T0)
    p.create_failed("w0")  # e.g. HTTP 500: no pod is coming
    p.create_failed("never-asked")  # harmless
    assert p.may_create("w0", T0 + 1.0)


def test_a_stale_deletion_lifts_the_create_grace() -> None:
    """The new world's pods have the old names: asked for before the deletion is not asked for now."""
    p = pacing()
    assert p.may_create("w0", T0)
    p.stale_deleted(T0 + 1.0)
    assert p.may_create("w0", T0 + 2.0)


# -- the 403 backoff ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("refusals", "delay"),
    [(1, 5.0), (2, 10.0), (3, 20.0), (4, 40.0), (5, 80.0), (6, 120.0), (7, 120.0), (30, BACKOFF_MAX_SECONDS)],
)
def test_backoff_doubles_up_to_the_cap(refusals: int, delay: float) -> None:
    p = pacing()
    got = [p.creates_refused(T0) for _ in range(refusals)]
    assert got[-1] == delay
    assert got == sorted(got)  # never shorter than the one before
    assert p.create_backoff_until == T0 + delay


@pytest.mark.parametrize(
    ("since_refused", "paused", "wake"),
    [
        (0.0, True, 5.0 + MARGIN_SECONDS),  # pod events during the wait do not turn into creates
        (4.0, True, 1.0 + MARGIN_SECONDS),
        (5.0, False, RESYNC),  # the wait is over: try again
        (60.0, False, RESYNC),
    ],
)
def test_backoff_pauses_creates(since_refused: float, paused: bool, wake: float) -> None:
    p = pacing()
    assert p.creates_refused(T0 - since_refused) == 5.0
    p.begin_pass()
    assert p.creates_paused(T0) is paused
    assert p.wake_in() == pytest.approx(wake)


def test_backoff_resets_after_a_successful_round() -> None:
    p = pacing()
    assert [p.creates_refused(T0) for _ in range(3)] == [5.0, 10.0, 20.0]
    p.creates_succeeded()
    assert p.create_failures == 0
    assert p.creates_refused(T0 + 100.0) == 5.0  # from the first step again


def test_no_backoff_before_any_refusal() -> None:
    p = pacing()
    assert not p.creates_paused(-1e12)  # whatever the clock's origin
    assert p.create_backoff_until == -math.inf


# -- the stale-delete grace ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("deleted_ago", "allowed", "wake"),
    [
        (None, True, RESYNC),  # never deleted: delete (also right after the host booted)
        (0.0, False, DELETE_GRACE_SECONDS + MARGIN_SECONDS),  # the index does not show them Terminating yet
        (4.0, False, DELETE_GRACE_SECONDS - 4.0 + MARGIN_SECONDS),
        (DELETE_GRACE_SECONDS, False, MARGIN_SECONDS),  # the grace includes its end
        (DELETE_GRACE_SECONDS + 0.01, True, RESYNC),
        (600.0, True, RESYNC),
    ],
)
def test_stale_delete_grace(deleted_ago: float | None, allowed: bool, wake: float) -> None:
    p = pacing()
    if deleted_ago is not None:
        p.stale_deleted(T0 - deleted_ago)
    assert p.may_delete_stale(T0) is allowed
    assert p.wake_in() == pytest.approx(wake)


# -- the next wake-up ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("requeue_after", "rule_wait", "wake"),
    [
        (None, None, RESYNC),  # nothing pending: the resync
        (0.0, None, RESYNC),  # 0 from the planner means "no requeue", as None
        (12.0, None, 12.0),  # the planner's own deadline (e.g. a pending timeout)
        (900.0, None, RESYNC),  # never later than the resync
        (None, 5.0, 5.0 + MARGIN_SECONDS),  # a rule of this pass (here the backoff)
        (2.0, 5.0, 2.0),  # the earliest wins
        (12.0, 5.0, 5.0 + MARGIN_SECONDS),
    ],
)
def test_wake_in_is_the_earliest(requeue_after: float | None, rule_wait: float | None, wake: float) -> None:
    p = pacing()
    if rule_wait is not None:
        p.create_backoff_until = T0 + rule_wait
        assert p.creates_paused(T0)
    assert p.wake_in(requeue_after) == pytest.approx(wake)


def test_each_pass_starts_from_the_resync() -> None:
    """A rule met in one pass does not shorten the wake-up of the next one."""
    p = pacing()
    assert p.may_create("w0", T0)
    assert not p.may_create("w0", T0 + 1.0)
    assert p.wake_in() < RESYNC
    p.begin_pass()
    assert p.wake_in() == RESYNC


def test_a_short_resync_caps_every_wait() -> None:
    p = Pacing(resync_seconds=2.0)
    assert p.creates_refused(T0) == 5.0
    assert p.creates_paused(T0)
    assert p.wake_in(10.0) == 2.0


# -- the slow start (issue 33) ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("batch", "codes", "expected"),
    [
        (None, [201] * 1000, None),  # no refusal: all at once, as before
        (None, [201, 201, 429, 201], 1),  # the first 429: from 1
        (None, [403], 1),  # a quota or policy
        (1, [201], 2),
        (2, [201, 201], 4),
        (4, [201, 409, 201, 201], 8),  # 409: it exists (ours), went through
        (128, [201] * 128, 256),
        (SLOW_START_MAX, [201] * SLOW_START_MAX, None),  # grown back: no limit
        (8, [201, 429], 1),  # refused again while growing: from 1
        (8, [201, 500], 8),  # another failure holds the size (its own backoff applies)
        (8, [201, 0], 8),  # no answer: the same
        (None, [500], None),
        (None, [422], None),  # invalid: the run fails, not slowed
    ],
)
def test_next_batch(batch: int | None, codes: list[int], expected: int | None) -> None:
    assert next_batch(batch, codes) == expected


def test_the_batches_grow_back_one_at_a_time() -> None:
    p = pacing()
    assert p.batch_done([201, 429]) is False
    sizes = []
    while p.batch is not None:
        sizes.append(p.batch)
        assert p.batch_done([201] * p.batch) is True
    assert sizes == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert p.batch_done([201, 0]) is False  # no answer: not gone through
