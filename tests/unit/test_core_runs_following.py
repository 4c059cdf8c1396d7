"""The rows the Running and Compensating sub-tables share (core.runs.following): one function each, used
in both, and what each phase makes of it (its Following). Every row's writes in detail:
test_core_runs_table.py (Running), test_core_compensation.py (Compensating)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest

from agentrun.api import Attempt, AttemptPhase
from agentrun.core.plan import RecordEvent
from agentrun.core.pods import PodView
from agentrun.core.runs import World, attempts, compensation
from agentrun.core.runs.chain import SubTable
from agentrun.core.runs.following import Following
from agentrun.core.runs.transition import EndAttempt, Transition
from unit.factories import (
    ended_pod,
    held_by,
    make_attempt,
    make_run,
    make_side_effect,
    make_world,
    name_of,
    pending_pod,
    run_status,
    running_pod,
)
from unit.run_worlds import supervising

SHARED = [
    "AttemptPromised",
    "PodRefused",
    "PodNotCreated",
    "PodLost",
    "PodEnded",
    "LeaseExpired",
    "Live",
    "AttemptEnded",
]


def rows(table: SubTable) -> dict[str, object]:
    return {row.name: row.when for row in table.rows}


def test_the_rows_both_sub_tables_name_alike_are_one_function_each() -> None:
    running, compensating = rows(attempts.RUNNING), rows(compensation.COMPENSATING)

    assert sorted(set(running) & set(compensating)) == sorted(SHARED)
    for name in SHARED:
        ours, theirs = running[name], compensating[name]
        function = getattr(ours, "__func__", None)
        assert getattr(theirs, "__func__", None) is function, name
        assert getattr(Following, getattr(function, "__name__", "")) is function, "defined once, in following"
        owners = (getattr(ours, "__self__", None), getattr(theirs, "__self__", None))
        assert owners == (attempts.FOLLOWING, compensation.FOLLOWING)
    for name in set(running) ^ set(compensating):  # a phase's own rows are its own
        assert not isinstance(getattr(running.get(name) or compensating[name], "__self__", None), Following)


# ---- each shared row, in each phase -------------------------------------------------------------------


def running(attempt: Attempt | None, pod: PodView | None, *, expires_in: float = 30.0) -> World:
    """Running, its Attempt 1 (None: not seen) holding lease epoch 1."""
    world = supervising(1, pod=pod, attempt=attempt or make_attempt(1), expires_in=expires_in)
    return world if attempt is not None else replace(world, attempts={})


def compensating(attempt: Attempt | None, pod: PodView | None, *, expires_in: float = 30.0) -> World:
    """Compensating with compensation Attempt 2 (None: not seen) holding lease epoch 2, while Attempt 1,
    before the compensation, has not ended (its Pod gone): every row aborts it first."""
    status = run_status(
        "Compensating",
        current=2,
        lease_epoch=2,
        cancel_epoch=1,
        compensating={"returnPhase": "Cancelled", "firstAttempt": 2},
    )
    run = make_run(status, spec={"cancelEpoch": 1, "compensation": {"onCancel": "Compensate"}})
    return make_world(
        run,
        attempts=[make_attempt(1), *([attempt] if attempt else [])],
        pods=[pod] if pod else [],
        lease=held_by(2),
        expires_in=expires_in,
        side_effects=[make_side_effect("ticket", "Confirmed")],
    )


def attempt(number: int, phase: str | None = "Running", *, started: bool = True) -> Attempt:
    return make_attempt(number, phase=phase, started=started, reason=None if number == 1 else "compensate")


@dataclass(frozen=True)
class Situation:
    attempt: str | None  # "started", "pending" (not started), or an ended phase; None: not seen
    pod: str | None  # "running", "pending", "exit 0", "exit 1"; None: no Pod
    expires_in: float = 30.0
    refused: bool = False


SITUATIONS: dict[str, Situation] = {
    "AttemptPromised": Situation(None, None),
    "PodRefused": Situation("pending", None, refused=True),
    "PodNotCreated": Situation("pending", None),
    "PodLost": Situation("started", None),
    "PodEnded": Situation("started", "exit 1"),
    "LeaseExpired": Situation("started", "running", expires_in=-1.0),
    "Live": Situation("started", "running"),
    "AttemptEnded": Situation("Succeeded", None),
}


def world_of(build: Callable[..., World], number: int, s: Situation) -> World:
    seen = None
    if s.attempt == "started":
        seen = attempt(number)
    elif s.attempt == "pending":
        seen = attempt(number, None, started=False)
    elif s.attempt is not None:
        seen = attempt(number, s.attempt)
    pod = {
        None: None,
        "running": running_pod(number),
        "pending": pending_pod(number),
        "exit 0": ended_pod(number, 0),
        "exit 1": ended_pod(number, 1),
    }[s.pod]
    world = build(seen, pod, expires_in=s.expires_in)
    if s.refused:
        world = replace(world, refused_pods={name_of(number): "spec.containers: Required"})
    return world


def kinds(t: Transition) -> list[str]:
    """The Transition's steps in order, by type (Events left out)."""
    return [type(step).__name__ for step in t.steps if not isinstance(step, RecordEvent)]


END = ["EndAttempt", "SetPhase"]  # the Attempt's end recorded, then the Run moved on (the phase's own way)
# What each row writes: (Running, Compensating after its abort of Attempt 1).
FOLLOWS: dict[str, tuple[list[str], list[str]]] = {
    "AttemptPromised": (["CreateAttempt", "CreatePod"], ["CreateAttempt", "CreatePod"]),
    "PodRefused": (END, END),
    "PodNotCreated": (["CreatePod"], ["CreatePod"]),
    "PodLost": (END, END),
    "PodEnded": (END, END),
    # Running: the Run written before the Pod stopped (the takeover decides a racing commit);
    # Compensating: the Pod stopped at once, its end concluded
    "LeaseExpired": (
        ["WriteLease", "SetPhase", "DeletePod", "EndAttempt"],
        ["WriteLease", "DeletePod", *END],
    ),
    "Live": ([], []),
    "AttemptEnded": (["SetPhase"], ["SetPhase"]),
}


@pytest.mark.parametrize("row", SHARED)
def test_a_shared_row_decides_in_both_phases_as_each_phase_says(row: str) -> None:
    situation = SITUATIONS[row]
    in_running = attempts.RUNNING.decide(world_of(running, 1, situation))
    in_compensating = compensation.COMPENSATING.decide(world_of(compensating, 2, situation))

    assert (in_running.rule, in_compensating.rule) == (row, row)
    assert (kinds(in_running), kinds(in_compensating)[1:]) == FOLLOWS[row]
    # Compensating: Attempt 1, before the compensation, is aborted before the row's own writes
    aborted = in_compensating.steps[0]
    assert isinstance(aborted, EndAttempt)
    assert (aborted.attempt, aborted.phase) == (name_of(1), AttemptPhase.ABORTED)


def test_only_running_looks_at_a_live_attempt_again_when_its_timeout_falls_due() -> None:
    live = SITUATIONS["Live"]
    spec = {"attemptTimeoutSeconds": 600}  # its agent started 5 minutes ago: due in 300 s
    in_running = replace(
        world_of(running, 1, live), run=make_run(run_status("Running", current=1, lease_epoch=1), spec=spec)
    )
    base = world_of(compensating, 2, live)
    in_compensating = replace(
        base,
        run=base.run.model_copy(
            update={"spec": base.run.spec.model_copy(update={"attempt_timeout_seconds": 600})}
        ),
    )

    assert attempts.RUNNING.decide(in_running).requeue_after == pytest.approx(300.0)
    looked_at = compensation.COMPENSATING.decide(in_compensating)
    assert looked_at.requeue_after is None  # only when its Lease runs out
    assert looked_at.lease_expires_in == pytest.approx(30.05)
