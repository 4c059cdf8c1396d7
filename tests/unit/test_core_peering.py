"""A replica's standing among its peers (agentrun.core.peering), and that it is kopf's: the same peering
status is judged by kopf's own function, which pauses and resumes kopf's Run watch."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits.aiotoggles import Toggle
from kopf._core.engines.peering import Identity, process_peering_event

from agentrun.core.peering import MalformedPeering, Standing, combined, standing

ME = "me@host/1"
PRIORITY = 10


def entry(
    now: datetime, priority: int, seen_ago: float | None = 5.0, lifetime: int | None = 60
) -> dict[str, Any]:
    found: dict[str, Any] = {"priority": priority}
    if seen_ago is not None:
        found["lastseen"] = (now - timedelta(seconds=seen_ago)).isoformat()
    if lifetime is not None:
        found["lifetime"] = lifetime
    return found


# (what, the status given the time now, whether this replica acts). Times are tens of seconds away from
# any deadline: kopf reads the machine's clock itself.
CASES = [
    ("no peer", lambda now: {}, True),
    ("only itself", lambda now: {ME: entry(now, PRIORITY)}, True),
    ("a live peer of higher priority", lambda now: {"b": entry(now, PRIORITY + 1)}, False),
    ("a dead peer of higher priority", lambda now: {"b": entry(now, PRIORITY + 1, seen_ago=120)}, True),
    ("a live peer of lower priority", lambda now: {"b": entry(now, PRIORITY - 1)}, True),
    ("a live peer of the same priority", lambda now: {"b": entry(now, PRIORITY)}, False),
    ("a higher one never seen", lambda now: {"b": entry(now, PRIORITY + 1, seen_ago=None)}, False),
    ("no lifetime: 60 s, alive", lambda now: {"b": entry(now, PRIORITY + 1, 30, lifetime=None)}, False),
    ("no lifetime: 60 s, dead", lambda now: {"b": entry(now, PRIORITY + 1, 90, lifetime=None)}, True),
    ("no priority: 0", lambda now: {"b": {"lastseen": now.isoformat(), "lifetime": 60}}, True),
    (
        "a time without a zone is UTC",
        lambda now: {"b": {**entry(now, PRIORITY + 1), "lastseen": now.replace(tzinfo=None).isoformat()}},
        False,
    ),
    (
        "a live higher one among dead and lower ones",
        lambda now: {
            ME: entry(now, PRIORITY),
            "old": entry(now, PRIORITY + 5, seen_ago=500, lifetime=10),
            "low": entry(now, PRIORITY - 3),
            "high": entry(now, PRIORITY + 1, seen_ago=1),
        },
        False,
    ),
]


async def kopf_pauses(status: dict[str, Any], paused_before: bool) -> bool:
    """What kopf's own peering handler makes of the status: whether it leaves the operator paused."""
    settings = kopf.OperatorSettings()
    settings.peering.name, settings.peering.priority = "agentrun", PRIORITY
    conflicts = Toggle(paused_before)
    woken = asyncio.Event()
    woken.set()  # kopf would wait for a peer's deadline: not here
    await process_peering_event(
        raw_event={"type": "MODIFIED", "object": {"metadata": {"name": "agentrun"}, "status": status}},
        namespace=None,
        resource=None,  # type: ignore[arg-type]  # used only to clean dead peers (autoclean=False)
        identity=Identity(ME),
        settings=settings,
        autoclean=False,
        stream_pressure=woken,
        conflicts_found=conflicts,
    )
    return conflicts.is_on()


@pytest.mark.parametrize(("what", "status", "active"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("paused_before", [False, True])
def test_the_standing_is_kopfs(what: str, status: Any, active: bool, paused_before: bool) -> None:
    now = datetime.now(UTC)
    peering = status(now)

    found = standing(peering, identity=ME, priority=PRIORITY, now=now)

    assert found.active is active, found
    assert asyncio.run(kopf_pauses(peering, paused_before)) is (not active)


def test_standing_by_says_why_and_when_the_blocking_heartbeat_runs_out() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    status = {"b": entry(now, 20, seen_ago=10, lifetime=60), "c": entry(now, 30, seen_ago=50, lifetime=60)}

    found = standing(status, identity=ME, priority=PRIORITY, now=now)

    assert found == Standing(
        False, "a peer of higher priority is active: b (priority 20), c (priority 30)", recheck_in=10.0
    )
    later = standing(status, identity=ME, priority=PRIORITY, now=now + timedelta(seconds=10))
    assert later.active is False and later.recheck_in == 40.0  # c's heartbeat has run out, b's has not
    assert standing(status, identity=ME, priority=PRIORITY, now=now + timedelta(seconds=50)).active


def test_the_same_priority_pauses_every_one() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    found = standing({"b": entry(now, PRIORITY)}, identity=ME, priority=PRIORITY, now=now)
    assert not found.active and "same priority 10: b" in found.reason


@pytest.mark.parametrize(
    "bad",
    [
        {"b": "alive"},
        {"b": {"priority": "high", "lastseen": "2026-01-01T00:00:00+00:00"}},
        {"b": {"priority": 1, "lastseen": "yesterday"}},
        {"b": {"priority": 1, "lifetime": "long"}},
    ],
)
def test_an_entry_kopf_could_not_read_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(MalformedPeering, match="peer 'b'"):
        standing(bad, identity=ME, priority=PRIORITY, now=datetime(2026, 1, 1, tzinfo=UTC))


def test_over_several_peering_objects_any_one_holds_the_replica_back() -> None:
    ok = Standing(True, "no live peer of higher or equal priority")
    blocked = Standing(False, "a peer of higher priority is active: b (priority 20)", recheck_in=7.0)

    assert combined({"ns-a": ok, "ns-b": ok}).active
    held = combined({"ns-a": ok, "ns-b": blocked, "ns-c": None})
    assert not held.active and held.recheck_in == 7.0
    assert held.reason == (
        "ns-b: a peer of higher priority is active: b (priority 20); ns-c: the peering object is not read yet"
    )
    not_read = Standing(False, "the cluster: the peering object is not read yet")
    assert combined({"the cluster": None}) == not_read
