"""The worker reads time from one Clock, the one its Session is built with: a test passes a fake and
moves it, so lease and record times are tested at their real durations without waiting."""

from __future__ import annotations

import asyncio
import datetime

from agentrun.api.run import LeaseSpec
from agentrun.kubeapi import KubeApi
from agentrun.worker.clock import SystemClock, timestamp
from agentrun.worker.errors import LeaseLost
from agentrun.worker.identity import Identity
from agentrun.worker.session import RUN_WATCH_TIMEOUT_SECONDS, Session
from unit.factories import POD_ENV


class FakeClock:
    """Stands still unless a test moves it."""

    def __init__(self) -> None:
        self.wall = datetime.datetime(2026, 3, 1, 12, 30, 5, 123456, tzinfo=datetime.UTC)
        self.seconds = 1000.0

    def now(self) -> datetime.datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.seconds

    async def sleep(self, seconds: float) -> None:
        self.seconds += seconds
        self.wall += datetime.timedelta(seconds=seconds)


def test_times_are_written_as_the_api_server_writes_them() -> None:
    clock = FakeClock()
    assert timestamp(clock) == "2026-03-01T12:30:05Z"
    assert timestamp(clock, micro=True) == "2026-03-01T12:30:05.123456Z"


def test_a_session_reads_the_machines_clock_unless_given_one(unreachable_api: KubeApi) -> None:
    me = Identity.from_env(POD_ENV)
    assert isinstance(Session(unreachable_api, me).clock, SystemClock)
    fake = FakeClock()
    assert Session(unreachable_api, me, fake).clock is fake


def test_a_worker_that_cannot_renew_for_a_whole_lease_duration_stops_itself(
    unreachable_api: KubeApi,
) -> None:
    """Renewals fail (the API server is unreachable); by the session's clock, 10 s pass at each failed
    renewal: with a 25 s lease, the third failure is past the duration, and the lease counts as lost."""
    clock = FakeClock()
    session = Session(unreachable_api, Identity.from_env(POD_ENV), clock)
    failures = []
    renew_once = session.renew_once

    async def renewal_that_takes_ten_seconds() -> None:
        clock.seconds += 10
        try:
            await renew_once()
        except OSError as exc:
            failures.append(exc)
            raise

    session.renew_once = renewal_that_takes_ten_seconds  # type: ignore[method-assign]

    async def keep() -> None:
        try:
            await session.keep_lease(renew_seconds=0, duration_seconds=25)
        finally:
            await unreachable_api.aclose()

    asyncio.run(keep())
    assert session.lost.is_set()
    assert len(failures) == 3  # at 10 s and 20 s it kept trying; at 30 s it gave up
    assert unreachable_api.requests == 3


def renewals_at(clock: FakeClock, outcomes: list[BaseException | None]) -> tuple[Session, list[float]]:
    """A session whose renewals end as `outcomes` says in turn (None: renewed), noting when each came
    (seconds since the start); past the list, the lease is lost."""
    start = clock.seconds
    session = Session(KubeApi.__new__(KubeApi), Identity.from_env(POD_ENV), clock)  # never called
    times: list[float] = []

    async def renew_once() -> None:
        times.append(clock.seconds - start)
        outcome = outcomes[len(times) - 1] if len(times) <= len(outcomes) else LeaseLost("taken over")
        if outcome is not None:
            raise outcome

    session.renew_once = renew_once  # type: ignore[method-assign]
    return session, times


def test_a_failed_renewal_is_tried_again_within_seconds_not_a_renewal_period_later() -> None:
    """Renewals are a minute apart by default: one lost request must not cost the lease."""
    clock = FakeClock()
    session, times = renewals_at(clock, [OSError("reset"), OSError("reset"), None])

    asyncio.run(session.keep_lease(renew_seconds=60, duration_seconds=100))

    assert times == [60, 61, 63, 123]  # tried again 1 s, then 2 s later; renewed; then every 60 s again
    assert session.lost.is_set()  # the fourth found the lease taken over


def test_a_worker_that_cannot_renew_tries_until_the_lease_has_run_out_then_stops_itself() -> None:
    clock = FakeClock()
    session, times = renewals_at(clock, [OSError("unreachable")] * 20)

    asyncio.run(session.keep_lease(renew_seconds=60, duration_seconds=100))

    assert times == [60, 61, 63, 67, 75, 91, 100]  # backing off, the last one at the lease's end
    assert session.lost.is_set()


def test_the_default_lease_costs_at_most_20_requests_per_second_per_1000_idle_attempts() -> None:
    """An idle running attempt's requests: one per renewal (a preconditioned patch of the Lease) and one
    per Run watch the API server ends (resumed from the last resourceVersion): docs/performance.md."""
    per_1000 = 1000 / LeaseSpec().renew_seconds + 1000 / RUN_WATCH_TIMEOUT_SECONDS
    assert per_1000 <= 20
