"""The operator's background sweep loop (agentrun.operator.sweeps.PeriodicSweep), on a clock whose every
wait lasts until the test ends it, and a sweep that lasts until the test gives its outcome: each step is
awaited as an event, nothing waits for time to pass."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from agentrun.operator.sweeps import PeriodicSweep
from support.clock import FakeClock

INTERVAL = 300.0


class HeldClock(FakeClock):
    """Each sleep is handed to the test (its seconds, and the future that ends it), and moves the clock
    on only once the test ends it."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: asyncio.Queue[tuple[float, asyncio.Future[None]]] = asyncio.Queue()

    async def sleep(self, seconds: float) -> None:
        ended = asyncio.get_running_loop().create_future()
        self.sleeps.put_nowait((seconds, ended))
        await ended
        self.advance(seconds)

    async def elapse(self) -> float:
        """Ends the next sleep still under way (one cancelled is passed over); returns its seconds."""
        while True:
            seconds, ended = await self.sleeps.get()
            if not ended.done():
                ended.set_result(None)
                return seconds


class HeldSweep:
    """A sweep that tells the test it began (when, on the clock) and ends as the test says (an error to
    raise, or None)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.began: asyncio.Queue[float] = asyncio.Queue()
        self.outcomes: asyncio.Queue[Exception | None] = asyncio.Queue()
        self.cancelled = 0

    async def __call__(self) -> None:
        self.began.put_nowait(self.clock.monotonic())
        try:
            outcome = await self.outcomes.get()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if outcome is not None:
            raise outcome


def run(test: Callable[[HeldClock, HeldSweep, list[Exception]], Awaitable[None]]) -> None:
    async def main() -> None:
        clock = HeldClock()
        await test(clock, HeldSweep(clock), [])

    asyncio.run(main())


def periodic(
    clock: HeldClock,
    sweep: HeldSweep,
    failed: list[Exception],
    ready: Callable[[], Awaitable[object]] | None = None,
) -> PeriodicSweep:
    return PeriodicSweep(
        sweep, name="test-sweep", clock=clock, interval_seconds=INTERVAL, failed=failed.append, ready=ready
    )


def test_it_sweeps_at_once_then_once_an_interval_of_the_clock_has_passed() -> None:
    async def test(clock: HeldClock, sweep: HeldSweep, failed: list[Exception]) -> None:
        loop = periodic(clock, sweep, failed)
        loop.start()
        assert await sweep.began.get() == 1000.0
        sweep.outcomes.put_nowait(None)
        assert await clock.elapse() == INTERVAL
        assert await sweep.began.get() == 1000.0 + INTERVAL
        sweep.outcomes.put_nowait(None)
        assert await clock.elapse() == INTERVAL
        assert await sweep.began.get() == 1000.0 + 2 * INTERVAL
        await loop.stop()
        assert failed == []

    run(test)


def test_a_failed_sweep_is_told_and_the_next_one_comes_after_the_interval() -> None:
    async def test(clock: HeldClock, sweep: HeldSweep, failed: list[Exception]) -> None:
        loop = periodic(clock, sweep, failed)
        loop.start()
        await sweep.began.get()
        error = RuntimeError("the store is down")
        sweep.outcomes.put_nowait(error)
        assert await clock.elapse() == INTERVAL
        assert failed == [error]
        assert await sweep.began.get() == 1000.0 + INTERVAL
        sweep.outcomes.put_nowait(None)
        await clock.sleeps.get()  # the wait after the second sweep: it did its work
        assert failed == [error]
        await loop.stop()

    run(test)


def test_a_nudge_ends_the_wait_for_the_interval() -> None:
    async def test(clock: HeldClock, sweep: HeldSweep, failed: list[Exception]) -> None:
        loop = periodic(clock, sweep, failed)
        loop.start()
        await sweep.began.get()
        sweep.outcomes.put_nowait(None)
        _, interval = await clock.sleeps.get()
        loop.nudge()
        assert await sweep.began.get() == 1000.0  # no time has passed
        assert interval.cancelled()
        await loop.stop()

    run(test)


def test_a_nudge_while_a_sweep_runs_brings_another_sweep_right_after_it() -> None:
    async def test(clock: HeldClock, sweep: HeldSweep, failed: list[Exception]) -> None:
        loop = periodic(clock, sweep, failed)
        loop.start()
        await sweep.began.get()
        loop.nudge()
        assert loop.nudged
        sweep.outcomes.put_nowait(None)
        assert await sweep.began.get() == 1000.0
        assert not loop.nudged
        sweep.outcomes.put_nowait(None)  # no nudge since the second sweep began: it waits the interval
        assert await clock.elapse() == INTERVAL
        assert await sweep.began.get() == 1000.0 + INTERVAL
        await loop.stop()

    run(test)


def test_the_first_sweep_waits_until_it_is_ready_and_takes_in_the_nudges_before_it() -> None:
    async def test(clock: HeldClock, sweep: HeldSweep, failed: list[Exception]) -> None:
        waiting, synced = asyncio.Event(), asyncio.Event()

        async def ready() -> None:
            waiting.set()
            await synced.wait()

        loop = periodic(clock, sweep, failed, ready)
        loop.start()
        await waiting.wait()
        loop.nudge()  # e.g. an account seen while the informers list
        assert sweep.began.empty() and loop.nudged
        synced.set()
        assert await sweep.began.get() == 1000.0
        assert not loop.nudged
        sweep.outcomes.put_nowait(None)
        assert await clock.elapse() == INTERVAL  # the nudge was for the first sweep, not the wait after it
        assert await sweep.began.get() == 1000.0 + INTERVAL
        await loop.stop()

    run(test)


def test_stop_cancels_the_sweep_under_way_and_a_start_begins_afresh() -> None:
    async def test(clock: HeldClock, sweep: HeldSweep, failed: list[Exception]) -> None:
        readied = 0

        async def ready() -> None:
            nonlocal readied
            readied += 1

        loop = periodic(clock, sweep, failed, ready)
        await loop.stop()  # never started: nothing to stop
        loop.start()
        await sweep.began.get()
        await loop.stop()
        assert sweep.cancelled == 1 and failed == []  # a cancel is no failure
        await loop.stop()
        loop.start()
        assert await sweep.began.get() == 1000.0
        assert readied == 2
        sweep.outcomes.put_nowait(None)
        _, interval = await clock.sleeps.get()
        await loop.stop()  # in the wait: the clock's sleep is cancelled with it
        assert interval.cancelled() and failed == []

    run(test)


def sweep_tasks() -> list[asyncio.Task[object]]:
    """The loops under way (a loop's task bears its sweep's name)."""
    return [task for task in asyncio.all_tasks() if task.get_name() == "test-sweep"]


def test_a_start_while_started_changes_nothing() -> None:
    async def test(clock: HeldClock, sweep: HeldSweep, failed: list[Exception]) -> None:
        loop = periodic(clock, sweep, failed)
        loop.start()
        await sweep.began.get()
        loop.start()  # e.g. an activity started twice: one loop, the sweep under way goes on
        assert len(sweep_tasks()) == 1
        sweep.outcomes.put_nowait(None)
        assert await clock.elapse() == INTERVAL
        assert await sweep.began.get() == 1000.0 + INTERVAL
        assert sweep.cancelled == 0 and len(sweep_tasks()) == 1
        await loop.stop()

    run(test)


class Fatal(Exception):
    """An error the sweeper does not survive."""


def test_a_failed_that_raises_ends_the_loop_until_it_is_stopped() -> None:
    async def test(clock: HeldClock, sweep: HeldSweep, failed: list[Exception]) -> None:
        def survive_all_but_fatal(error: Exception) -> None:
            failed.append(error)
            if isinstance(error, Fatal):
                raise error

        loop = PeriodicSweep(
            sweep, name="test-sweep", clock=clock, interval_seconds=INTERVAL, failed=survive_all_but_fatal
        )
        loop.start()
        await sweep.began.get()
        survived = RuntimeError("the store is down")
        sweep.outcomes.put_nowait(survived)
        assert await clock.elapse() == INTERVAL  # survived: the next sweep after the interval
        await sweep.began.get()
        fatal = Fatal("a bug")
        sweep.outcomes.put_nowait(fatal)
        [task] = sweep_tasks()
        with pytest.raises(Fatal) as ended:
            await task
        assert ended.value is fatal
        assert failed == [survived, fatal]
        assert clock.sleeps.empty() and sweep.began.empty()  # no wait, no sweep after it
        loop.start()  # ended, not stopped: still no loop
        assert sweep_tasks() == []
        await loop.stop()  # the ended loop's error is taken in, not raised
        loop.start()
        assert await sweep.began.get() == 1000.0 + INTERVAL
        await loop.stop()

    run(test)
