"""The agent's liveness (spec.progressTimeoutSeconds), on a clock the test moves: no waiting."""

from __future__ import annotations

import asyncio

from agentrun.kubeapi import KubeApi
from agentrun.worker.context import Context
from agentrun.worker.identity import Identity
from agentrun.worker.main import _termination
from agentrun.worker.progress import Progress, ProgressTimeout
from agentrun.worker.session import Session
from support.clock import FakeClock
from unit.factories import POD_ENV, make_attempt, make_run


def test_without_a_timeout_the_agent_never_stalls() -> None:
    clock = FakeClock()
    progress = Progress(clock)
    clock.advance(10**6)
    assert progress.remaining() is None
    assert not progress.stalled


def test_progress_restarts_the_timeout() -> None:
    clock = FakeClock()
    progress = Progress(clock, timeout=10)
    clock.advance(9)
    assert progress.remaining() == 1
    progress.report()
    clock.advance(9)
    assert not progress.stalled
    clock.advance(1)
    assert progress.stalled


def test_a_hold_is_no_stall_and_the_timeout_restarts_after_it() -> None:
    clock = FakeClock()
    progress = Progress(clock, timeout=10)
    with progress.holding():
        clock.advance(3600)
        assert not progress.stalled
    assert progress.remaining() == 10


def test_stall_returns_when_the_timeout_runs_out() -> None:
    clock = FakeClock()
    progress = Progress(clock, timeout=30)
    clock.advance(12)
    start = clock.monotonic()

    asyncio.run(progress.stall())

    assert clock.monotonic() - start == 18
    assert progress.stalled


def test_stall_waits_for_a_hold_to_end() -> None:
    clock = FakeClock()
    progress = Progress(clock, timeout=30)

    async def scenario() -> float:
        with progress.holding():
            stalled = asyncio.create_task(progress.stall())
            for _ in range(5):  # the stall watch runs, and finds nothing to time
                await asyncio.sleep(0)
            assert not stalled.done()
            clock.advance(3600)
            held_until = clock.monotonic()
        await stalled
        return clock.monotonic() - held_until

    assert asyncio.run(scenario()) == 30


def test_ctx_progress_and_step_boundaries_count_as_progress(unreachable_api: KubeApi) -> None:
    clock = FakeClock()
    session = Session(unreachable_api, Identity.from_env(POD_ENV), clock)
    session.progress.timeout = 10
    run = make_run()
    ctx = Context(session, run, make_attempt(1), None)
    clock.advance(9)

    ctx.progress()

    assert session.progress.remaining() == 10
    clock.advance(9)
    session.run = run  # the boundary reads the newest Run seen (no request)
    asyncio.run(ctx._boundary(fresh=False))
    assert session.progress.remaining() == 10


def test_a_stalled_agents_lease_is_no_longer_renewed(unreachable_api: KubeApi) -> None:
    """The renewal carries the liveness: once the agent stalled, the worker stops renewing (no request,
    and the lease is not declared lost: it runs out, and the operator takes over)."""
    clock = FakeClock()
    session = Session(unreachable_api, Identity.from_env(POD_ENV), clock)
    session.progress.timeout = 5
    clock.advance(5)

    asyncio.run(asyncio.wait_for(session.keep_lease(0.0, 25.0), 60))

    assert not session.lost.is_set()


def test_a_progress_timeout_ends_the_attempt_as_infrastructure() -> None:
    report, code = _termination(ProgressTimeout("the agent showed no progress for 10s"))

    assert (report["class"], report["reason"], code) == ("infrastructure", "ProgressTimeout", 1)
