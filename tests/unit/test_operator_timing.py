"""The operator's timing on its injected clock, at the real durations: a backoff, a delayed reconcile,
a Lease that runs out (and a hold with it), a renewal that moves the lease check on. A fake clock is
moved by hand and the work queue's due timers fired: nothing waits."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrun.api import RUN_LABEL, lease_name
from agentrun.api.run import LeaseSpec
from agentrun.operator.cache import Key, OwnedObjects
from agentrun.operator.lease import LEASE_CHECK_SLACK, LeaseExpiry
from agentrun.operator.workqueue import BASE_DELAY, MAX_DELAY, WorkQueue
from support.clock import FakeClock

NS, RUN, UID = "team-a", "triage", "uid-1"
KEY: Key = (NS, RUN)
DURATION = 60  # spec.lease.durationSeconds


def lease(resource_version: str, holder: str | None = f"{RUN}-a1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": lease_name(RUN),
            "namespace": NS,
            "labels": {RUN_LABEL: RUN},
            "resourceVersion": resource_version,
            "ownerReferences": [{"kind": "Run", "name": RUN, "uid": UID, "controller": True}],
        },
        "spec": {"holderIdentity": holder, "leaseTransitions": 1},
    }


async def ready(queue: WorkQueue[Any]) -> list[Any]:
    """The keys ready now, taken and processed (as a worker would)."""
    taken = []
    while len(queue):
        key = await queue.get()
        queue.done(key)
        taken.append(key)
    return taken


def test_each_backoff_is_due_after_its_full_delay_not_before() -> None:
    async def scenario() -> list[tuple[float, list[str], list[str]]]:
        clock = FakeClock()
        queue: WorkQueue[str] = WorkQueue(clock)
        seen = []
        for _ in range(15):  # failures in a row: 5 ms doubling up to the 30 s cap
            delay = queue.add_rate_limited("a")
            clock.advance(delay - 0.001)
            queue.fire_due()
            early = await ready(queue)
            clock.advance(0.002)
            queue.fire_due()
            seen.append((delay, early, await ready(queue)))
        return seen

    seen = asyncio.run(scenario())

    assert [delay for delay, _, _ in seen] == [min(BASE_DELAY * 2**n, MAX_DELAY) for n in range(15)]
    assert all(early == [] and due == ["a"] for _, early, due in seen)


def test_a_delayed_reconcile_keeps_the_earliest_time() -> None:
    async def scenario() -> list[list[str]]:
        clock = FakeClock()
        queue: WorkQueue[str] = WorkQueue(clock)
        queue.add("a", 300.0)  # e.g. the deadline
        queue.add("a", 60.0)  # e.g. the retry's backoff: earlier, it wins
        queue.add("a", 120.0)  # later: ignored
        seen = []
        for step in (59.0, 1.0, 300.0):
            clock.advance(step)
            queue.fire_due()
            seen.append(await ready(queue))
        return seen

    assert asyncio.run(scenario()) == [[], ["a"], []]


def test_a_lease_runs_out_its_full_duration_after_it_was_last_seen_renewed() -> None:
    clock = FakeClock()
    cache = OwnedObjects(clock)
    leases = LeaseExpiry(cache, clock)
    leases.remember(KEY, UID, DURATION)
    cache.put("leases", lease("1"))

    clock.advance(59.0)
    assert leases.expires_in(KEY, leases.lease(KEY)) == 1.0
    assert leases.due(KEY) == 1.0 + LEASE_CHECK_SLACK  # not expired: the check moves on

    cache.put("leases", lease("2"))  # renewed: the count starts again
    clock.advance(59.0)
    assert leases.expires_in(KEY, leases.lease(KEY)) == 1.0

    clock.advance(1.0)
    assert leases.expires_in(KEY, leases.lease(KEY)) == 0.0
    assert leases.due(KEY) is None  # expired: the Run is decided again (a takeover, a hold's end)


def test_the_lease_check_reconciles_only_once_the_lease_ran_out() -> None:
    async def scenario() -> list[list[Key]]:
        clock = FakeClock()
        cache = OwnedObjects(clock)
        leases = LeaseExpiry(cache, clock)
        queue: WorkQueue[Key] = WorkQueue(clock, lease_due=leases.due)
        leases.remember(KEY, UID, DURATION)
        cache.put("leases", lease("1"))
        queue.check_lease_in(KEY, DURATION + LEASE_CHECK_SLACK)
        seen = []
        clock.advance(30.0)
        cache.put("leases", lease("2"))  # the worker renews half-way
        for step in (DURATION - 30.0 + LEASE_CHECK_SLACK, 29.0, 1.0 + LEASE_CHECK_SLACK):
            clock.advance(step)
            queue.fire_due()
            seen.append(await ready(queue))
        return seen

    # At the first expiry the renewal moved the check on by 30 s; the Run is queued only at the second.
    assert asyncio.run(scenario()) == [[], [], [KEY]]


def test_a_lease_is_counted_from_when_the_agent_was_seen_running() -> None:
    """An image pull does not use up the lease: the count starts when the agent runs."""
    clock = FakeClock()
    cache = OwnedObjects(clock)
    leases = LeaseExpiry(cache, clock)
    leases.remember(KEY, UID, DURATION)
    cache.put("leases", lease("1"))
    clock.advance(45.0)  # pulling the image
    pod = {
        "metadata": {
            "name": f"{RUN}-a1",
            "namespace": NS,
            "labels": {RUN_LABEL: RUN},
            "resourceVersion": "5",
        },
        "status": {"phase": "Running", "containerStatuses": [{"name": "agent", "state": {"running": {}}}]},
    }
    cache.put("pods", pod)
    clock.advance(59.0)

    assert leases.expires_in(KEY, leases.lease(KEY)) == 1.0


def test_with_the_default_lease_a_worker_gone_silent_is_taken_over_within_120_s_of_its_last_renewal() -> None:
    """The defaults (spec.lease) against the contract: healthy renewals every renewSeconds never queue the
    Run; once they stop (a frozen or partitioned worker, whose Pod status shows nothing), the Run is
    decided again a lease duration after the last renewal seen, which is at most 120 s after the worker
    stopped (it stopped at or after that renewal)."""
    spec = LeaseSpec()

    async def scenario() -> tuple[list[list[Key]], float]:
        clock = FakeClock()
        cache = OwnedObjects(clock)
        leases = LeaseExpiry(cache, clock)
        queue: WorkQueue[Key] = WorkQueue(clock, lease_due=leases.due)
        leases.remember(KEY, UID, spec.duration_seconds)
        cache.put("leases", lease("1"))
        queue.check_lease_in(KEY, spec.duration_seconds + LEASE_CHECK_SLACK)
        seen = []
        for version in range(2, 12):  # ten renewals, each seen as the worker makes it
            clock.advance(spec.renew_seconds)
            cache.put("leases", lease(str(version)))
            queue.fire_due()
            seen.append(await ready(queue))
        last_renewal = clock.monotonic()
        while not (woken := await ready(queue)):  # silence: only the lease checks move the clock
            clock.advance(1.0)
            queue.fire_due()
        seen.append(woken)
        return seen, clock.monotonic() - last_renewal

    seen, silent_for = asyncio.run(scenario())

    assert seen[:-1] == [[]] * 10 and seen[-1] == [KEY]
    assert spec.duration_seconds <= silent_for <= 120
