"""core.runs.expiry through core.runs.decide: a finished Run's time to live, table-tested with `now`
injected. When it expires (from its Succeeded condition's lastTransitionTime, so a restart never resets
it), what keeps it (-1, no default, NeedsReconciliation, an open effect, no state store), and the
archive-then-delete it ends with."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentrun.core import archive, report
from agentrun.core.plan import ArchiveRun, DeleteRun, PatchRunStatus
from agentrun.core.runs import World, decide
from agentrun.core.runs.expiry import NO_STATE_STORE
from unit.factories import (
    EARLIER,
    RUN_RESOURCE_VERSION,
    RUN_UID,
    kinds,
    make_attempt,
    make_run,
    make_side_effect,
    of_type,
    run_patch,
    run_status,
    ts,
)

ENDED = EARLIER  # when the Succeeded condition last changed: the clock of the time to live


def finished(
    phase: str = "Succeeded",
    *,
    ttl: int | None = None,
    default: int | None = None,
    store: bool = True,
    now: datetime,
    effects: tuple[Any, ...] = (),
    **status: Any,
) -> World:
    """A Run that ended at ENDED and is at rest (its report and counts current), seen at `now`."""
    succeeded = {"Succeeded": "True"}.get(phase, "False")
    condition = {
        "type": "Succeeded",
        "status": succeeded,
        "reason": phase,
        "message": "",
        "lastTransitionTime": ts(ENDED),
    }
    body = run_status(
        phase,
        current=1,
        lease_epoch=1,
        conditions=[condition],
        sideEffects=report.side_effect_counts(effects),
        report=report.run_report(effects),
        **status,
    )
    spec = {} if ttl is None else {"ttlSecondsAfterFinished": ttl}
    attempt_phase = "Succeeded" if phase == "Succeeded" else "Failed"
    return World(
        run=make_run(body, spec=spec),
        attempts={1: make_attempt(1, phase=attempt_phase)},
        pods={},
        lease=None,
        now=now,
        side_effects=effects,
        default_ttl_seconds=default,
        has_store=store,
    )


def at(seconds: float) -> datetime:
    return ENDED + timedelta(seconds=seconds)


def expires_time(world: World) -> World:
    """The same World once status.expiresTime was written as decided."""
    patch = run_patch(decide(world))
    due = datetime.fromisoformat(patch["expiresTime"])
    status = world.run.status.model_copy(update={"expires_time": due})
    return replace(world, run=world.run.model_copy(update={"status": status}))


@pytest.mark.parametrize(
    ("ttl", "default", "expected"),
    [
        (60, None, 60),  # its own
        (None, 300, 300),  # the operator's default
        (0, 300, 0),  # its own wins, even 0
        (-1, 300, None),  # -1 keeps whatever the default
        (None, None, None),  # no default: kept
        (None, -1, None),
    ],
)
def test_the_time_to_live_is_the_runs_own_else_the_operators_default(
    ttl: int | None, default: int | None, expected: int | None
) -> None:
    plan = decide(finished(ttl=ttl, default=default, now=at(1)))
    if expected is None:
        assert of_type(plan, PatchRunStatus) == []
        assert plan.requeue_after is None
    else:
        assert run_patch(plan) == {"expiresTime": ts(at(expected))}


def test_before_its_expiry_the_run_waits_for_it_and_writes_nothing() -> None:
    world = expires_time(finished(ttl=600, now=at(100)))
    plan = decide(world)
    assert plan.actions == []
    assert plan.requeue_after == 500


def test_at_its_expiry_the_run_is_archived_then_deleted_preconditioned_on_what_was_archived() -> None:
    effect = make_side_effect("k1", "Confirmed")
    world = expires_time(finished(ttl=600, now=at(600), effects=(effect,)))
    plan = decide(world)
    assert kinds(plan) == ["ArchiveRun", "DeleteRun"]
    assert plan.needs_fresh_run, "archived and deleted only from a freshly read Run"
    [archived] = of_type(plan, ArchiveRun)
    assert archived.document["object"]["metadata"]["uid"] == RUN_UID
    assert [a["metadata"]["name"] for a in archived.document["attempts"]] == ["triage-a1"]
    assert [e["spec"]["idempotencyKey"] for e in archived.document["sideEffects"]] == ["k1"]
    assert archived.document["report"]["effects"][0]["state"] == "Confirmed"
    assert archived.summary["phase"] == "Succeeded"
    assert archived.summary["finishedTime"] == ts(ENDED)
    assert of_type(plan, DeleteRun) == [DeleteRun(RUN_UID, RUN_RESOURCE_VERSION)]


def test_the_clock_starts_at_the_terminal_conditions_transition_not_at_the_operators_start() -> None:
    # an operator started long after the Run ended decides on the recorded end: expired at once
    world = expires_time(finished(ttl=60, now=at(3600)))
    assert kinds(decide(world)) == ["ArchiveRun", "DeleteRun"]


@pytest.mark.parametrize("phase", ["Failed", "Cancelled"])
def test_failed_and_cancelled_runs_expire_too(phase: str) -> None:
    world = expires_time(finished(phase, ttl=0, now=at(0)))
    assert kinds(decide(world)) == ["ArchiveRun", "DeleteRun"]


def test_a_needs_reconciliation_run_never_expires() -> None:
    world = finished("NeedsReconciliation", ttl=0, now=at(10**6))
    plan = decide(world)
    assert "ArchiveRun" not in kinds(plan)
    assert all("expiresTime" not in p.patch for p in of_type(plan, PatchRunStatus))


@pytest.mark.parametrize("state", ["Pending", "Unknown"])
def test_a_run_with_an_open_effect_never_expires_and_shows_no_expiry(state: str) -> None:
    effect = make_side_effect("k1", state)
    world = finished("Failed", ttl=0, now=at(10**6), effects=(effect,))
    plan = decide(world)
    assert "ArchiveRun" not in kinds(plan)
    assert all("expiresTime" not in p.patch for p in of_type(plan, PatchRunStatus))


def test_an_expiry_shown_earlier_is_cleared_when_an_effect_opens() -> None:
    shown = expires_time(finished("Failed", ttl=600, now=at(1)))
    effect = make_side_effect("k1", "Unknown")
    resolved = finished("Failed", ttl=600, now=at(2), effects=(effect,))
    counts = resolved.run.status.model_copy(update={"expires_time": shown.run.status.expires_time})
    opened = replace(resolved, run=resolved.run.model_copy(update={"status": counts}))
    assert run_patch(decide(opened)) == {"expiresTime": None}


def test_a_compensation_left_incomplete_keeps_the_run() -> None:
    progress = {"returnPhase": "Failed", "firstAttempt": 2, "effects": ["k1"]}
    world = finished("Failed", ttl=0, now=at(10), compensating=progress)
    assert "ArchiveRun" not in kinds(decide(world))


def test_without_a_state_store_the_run_is_kept_and_says_why_once() -> None:
    world = finished(ttl=60, store=False, now=at(30))
    early = decide(world)
    assert early.actions == [], "no expiresTime: it will not be deleted"
    assert early.requeue_after == 30, "looks again when it would have expired"
    due = replace(world, now=at(60))
    patch = run_patch(decide(due))
    [condition] = [c for c in patch["conditions"] if c["type"] == "Archived"]
    assert (condition["status"], condition["reason"]) == ("False", NO_STATE_STORE)
    assert "Succeeded" in [c["type"] for c in patch["conditions"]], "the other conditions are kept"
    said = replace(
        due,
        run=make_run(
            {**due.run.status.to_api(), "conditions": patch["conditions"]},
            spec={"ttlSecondsAfterFinished": 60},
        ),
    )
    later = decide(said)
    assert later.actions == []
    assert later.requeue_after is None


def test_a_run_with_writes_left_settles_them_before_its_archive() -> None:
    world = expires_time(finished(ttl=0, now=at(0)))
    stale = world.run.status.model_copy(update={"side_effects": None})
    plan = decide(replace(world, run=world.run.model_copy(update={"status": stale})))
    assert kinds(plan) == ["PatchRunStatus"], "the counts first: the archive is of a Run at rest"


def test_a_run_being_deleted_is_left_to_the_garbage_collector() -> None:
    world = expires_time(finished(ttl=0, now=at(0)))
    meta = world.run.metadata.model_copy(update={"deletion_timestamp": at(0)})
    assert decide(replace(world, run=world.run.model_copy(update={"metadata": meta}))).actions == []


def test_the_story_tells_the_runs_end_and_its_attempts() -> None:
    world = finished("Failed", ttl=0, now=at(0))
    attempt = world.attempts[1]
    status = attempt.status.model_copy(update={"completion_time": ENDED})
    ended = attempt.model_copy(update={"status": status})
    told = archive.story(world.run, [ended])
    reasons = [entry["reason"] for entry in told]
    assert {"Failed", "AttemptStarted", "AttemptFailed"} <= set(reasons)
    assert [entry["time"] for entry in told] == sorted(entry["time"] for entry in told)


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (datetime(2026, 12, 3, 0, 0, tzinfo=UTC), []),  # the day ended, the retention has not passed
        (datetime(2026, 12, 4, 0, 0, tzinfo=UTC), ["2026-12-02"]),
        (datetime(2026, 12, 5, 0, 0, tzinfo=UTC), ["2026-12-02", "2026-12-03"]),
    ],
)
def test_archives_go_a_day_at_a_time_once_the_whole_day_is_past_retention(
    now: datetime, expected: list[str]
) -> None:
    days = ["2026-12-02", "2026-12-03", "not-a-day"]
    assert archive.expired_days(days, now, retention_seconds=86400) == expected
