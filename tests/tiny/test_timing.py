"""PhaseTimer: a phase's time excludes the phases timed inside it; repeated phases add up.

``time.perf_counter`` is replaced by a clock the test advances by hand, so every number
is exact.
"""

from __future__ import annotations

import pytest

import fp8rl.tiny.timing as timing
from fp8rl.tiny.timing import PhaseTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", fake)
    return fake


def test_a_phase_records_its_own_time(clock) -> None:
    timer = PhaseTimer()
    with timer("gen"):
        clock.advance(1.5)
    assert timer.totals == {"gen": 1.5}
    clock.advance(0.25)  # outside any phase: counts for elapsed() only
    assert timer.elapsed() == 1.75


def test_nested_phases_are_excluded_from_their_parent(clock) -> None:
    timer = PhaseTimer()
    with timer("update_actor"):
        clock.advance(1.0)
        with timer("shadow"):
            clock.advance(0.5)
        clock.advance(2.0)
        with timer("shadow"):
            clock.advance(0.25)
    assert timer.totals == {"update_actor": 3.0, "shadow": 0.75}
    assert sum(timer.totals.values()) == timer.elapsed() == 3.75


def test_only_the_direct_parent_loses_a_grandchild_once(clock) -> None:
    timer = PhaseTimer()
    with timer("outer"):
        clock.advance(1.0)
        with timer("middle"):
            clock.advance(2.0)
            with timer("inner"):
                clock.advance(4.0)
    # inner's 4 s leave middle, and middle's whole 6 s (inner included) leave outer
    assert timer.totals == {"outer": 1.0, "middle": 2.0, "inner": 4.0}
    assert sum(timer.totals.values()) == timer.elapsed() == 7.0


def test_repeated_phases_add_up(clock) -> None:
    timer = PhaseTimer()
    for seconds in (0.5, 1.0, 2.0):
        with timer("old_log_prob"):
            clock.advance(seconds)
        clock.advance(10.0)  # between phases
    assert timer.totals == {"old_log_prob": 3.5}
    assert timer.elapsed() == 33.5


def test_a_phase_left_by_an_exception_is_still_counted(clock) -> None:
    timer = PhaseTimer()
    with pytest.raises(RuntimeError), timer("outer"):
        clock.advance(1.0)
        with timer("inner"):
            clock.advance(2.0)
            raise RuntimeError("boom")
    assert timer.totals == {"outer": 1.0, "inner": 2.0}
    with timer("after"):  # the nesting stack is clean again
        clock.advance(0.5)
    assert timer.totals["after"] == 0.5 and timer.totals["outer"] == 1.0


def test_real_clock_smoke() -> None:
    """With the real clock: a nested sleep leaves its parent (generous tolerances)."""
    import time

    timer = PhaseTimer()
    with timer("parent"):
        with timer("child"):
            time.sleep(0.05)
    assert 0.045 <= timer.totals["child"] < 1.0
    assert 0.0 <= timer.totals["parent"] < 0.04
