"""The runtime's standing among its peers, followed from the peering object (agentrun.operator.peering),
on a clock the test moves: it flips when the object changes, and when a blocking heartbeat runs out."""

from __future__ import annotations

import asyncio
import random

import pytest

from agentrun.core.peering import Standing
from agentrun.operator.peering import RECHECK_SLACK, PeeringStanding, peering_collections, replica_identity
from agentrun.operator.runtime import Runtime
from support.clock import FakeClock
from unit.factories import NAMESPACE, make_run, run_status
from unit.test_operator_runtime import start_up

ME = "me@host/1"


class StoppedClock(FakeClock):
    """Time moves only when the test moves it: a sleep never ends by itself."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.Event().wait()


def heartbeat(clock: FakeClock, priority: int, lifetime: int = 60) -> dict[str, object]:
    return {"priority": priority, "lifetime": lifetime, "lastseen": clock.now().isoformat()}


def following(clock: FakeClock, flips: asyncio.Queue[Standing]) -> PeeringStanding:
    async def flip(found: Standing) -> None:
        await flips.put(found)

    return PeeringStanding(
        None,  # type: ignore[arg-type]  # judging() reads no API: the test hands the object over
        name="agentrun",
        namespaces=["ns-a"],
        identity=ME,
        priority=1,
        clock=clock,
        flip=flip,
    )


def test_a_replica_stands_by_until_the_blocking_heartbeat_runs_out_then_acts() -> None:
    async def scenario() -> None:
        clock, flips = FakeClock(), asyncio.Queue[Standing]()
        peering = following(clock, flips)
        judging = asyncio.create_task(peering.judging())
        first = await flips.get()
        assert not first.active and "not read yet" in first.reason

        started = clock.monotonic()
        peering.seen("ns-a", {"status": {"b": heartbeat(clock, 5, lifetime=60), ME: heartbeat(clock, 1)}})
        blocked = await flips.get()
        assert not blocked.active
        assert blocked.reason == "ns-a: a peer of higher priority is active: b (priority 5)"
        taken_over = await flips.get()

        assert taken_over.active
        assert clock.monotonic() - started == pytest.approx(60 + RECHECK_SLACK)  # at the expiry, on the clock
        judging.cancel()

    asyncio.run(scenario())


def test_a_peer_that_leaves_or_comes_flips_the_standing_at_once() -> None:
    async def scenario() -> None:
        clock, flips = StoppedClock(), asyncio.Queue[Standing]()
        peering = following(clock, flips)
        judging = asyncio.create_task(peering.judging())
        assert not (await flips.get()).active

        peering.seen("ns-a", {"status": {ME: heartbeat(clock, 1), "low": heartbeat(clock, 0)}})
        assert (await flips.get()).active
        peering.seen("ns-a", {"status": {ME: heartbeat(clock, 1), "high": heartbeat(clock, 9)}})
        standing_by = await flips.get()
        assert not standing_by.active and "high (priority 9)" in standing_by.reason
        peering.seen("ns-a", {"status": {ME: heartbeat(clock, 1)}})  # kopf's goodbye removes the entry
        assert (await flips.get()).active
        assert peering.told is not None and peering.told.active
        judging.cancel()

    asyncio.run(scenario())


def test_a_malformed_entry_keeps_the_standing() -> None:
    clock = FakeClock()
    peering = following(clock, asyncio.Queue())
    peering.seen("ns-a", {"status": {"high": heartbeat(clock, 9)}})
    assert not peering.judge().active
    peering.seen("ns-a", {"status": {"high": {"priority": "nine"}}})
    assert not peering.judge().active
    clock.advance(61)
    assert not peering.judge().active  # still the last standing kopf could judge
    peering.seen("ns-a", {"status": {"high": heartbeat(clock, 9, lifetime=0)}})
    assert peering.judge().active


def test_where_the_peering_objects_are() -> None:
    assert peering_collections([]) == [("the cluster", "/apis/kopf.dev/v1/clusterkopfpeerings")]
    assert peering_collections(["a", "b"]) == [
        ("a", "/apis/kopf.dev/v1/namespaces/a/kopfpeerings"),
        ("b", "/apis/kopf.dev/v1/namespaces/b/kopfpeerings"),
    ]


def test_the_replica_is_named_as_kopf_names_it() -> None:
    clock = FakeClock()
    pod = "agentrun-operator-7d9-x2"
    assert replica_identity({"POD_ID": pod}, clock, random.Random(1)) == pod
    one, two = (replica_identity({}, clock, random.Random(seed)) for seed in (1, 2))
    assert one != two and "/20260101000000/" in one


def test_standing_by_keeps_the_runs_kopf_hands_over_and_taking_over_reconciles_every_one() -> None:

    async def scenario() -> None:
        runtime: Runtime = start_up()
        for name in ("r1", "r2"):
            run = make_run(run_status("Running", current=1, lease_epoch=1))
            body = run.model_dump(mode="json", by_alias=True)
            body["metadata"] = {**body["metadata"], "name": name, "resourceVersion": "5", "uid": f"u-{name}"}
            runtime.runs.put(body)
        runtime.queue.add((NAMESPACE, "r1"), after=30)
        runtime.queue.check_lease_in((NAMESPACE, "r2"), 10)

        runtime.reconciler.stand_by()
        runtime.queue.pause()
        clock = runtime.clock
        assert isinstance(clock, FakeClock)
        clock.advance(60)
        runtime.queue.fire_due()
        assert len(runtime.queue) == 0  # no timer fires on a replica standing by

        runtime.reconciler.resync()
        assert len(runtime.queue) == 2

    asyncio.run(scenario())
