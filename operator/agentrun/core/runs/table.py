"""The Run state machine as a table: its rules in the order they are tried, the first that applies wins.

`decide(world)` is a pure function. It is level-based: it looks only at the current objects, never at
what happened in memory before, so an operator restart at any line simply calls it again. Every write
it asks for is idempotent (deterministic names) or preconditioned (resourceVersion), and each write
sequence is ordered so that a crash between two writes leaves a state the table continues from. Each
rule's docstring (core.runs.rules) says its transition.
"""

from __future__ import annotations

from typing import Final

from agentrun.api import TERMINAL_PHASES, FailureClass, RunPhase
from agentrun.core import identity
from agentrun.core.plan import Plan
from agentrun.core.runs import attempts, compensating, rules
from agentrun.core.runs.builder import Builder, failure_fields
from agentrun.core.runs.chain import Chain, Rewrite, Rule
from agentrun.core.runs.stopping import revoke_lease
from agentrun.core.runs.transition import render
from agentrun.core.runs.upkeep import upkeep
from agentrun.core.runs.world import World

TABLE: Final = Chain(
    (
        Rule("Deleted", rules.deleted, upkeep=False),
        Rule("CommitRefused", rules.commit_refused, upkeep=False),
        Rule("Committed", rules.committed),
        Rule("Compensating", compensating.compensating, table=compensating.COMPENSATING),
        Rule("CancelAsked", rules.cancel_asked),
        Rule("DeadlinePassed", rules.deadline_passed),
        Rule("HoldEnding", rules.hold_ending),
        Rule("ControlRequest", rules.control_request),
        Rule("Stopped", rules.stopped),
        Rule("RequestExpired", rules.request_expired),
        Rule("FirstAttempt", rules.first_attempt),
        Rule("TakeoverUnfinished", rules.takeover_unfinished),
        Rule("RetryDue", rules.retry_due),
        Rule("BackingOff", rules.backing_off),
        Rule("Running", rules.running, table=attempts.RUNNING),
        Rule("Cancelling", rules.cancelling),
        Rule("Resting", rules.resting),
    ),
    upkeep=upkeep,
    rewrites=(Rewrite("CompensateFirst", compensating.compensate_first),),
)


def decide(world: World) -> Plan:
    """The writes that move the Run on from what is observed now, in order."""
    return TABLE.evaluate(world)


def fail_squatted(world: World, message: str) -> Plan:
    """An object this Run needs (its Lease, an Attempt, an Attempt's Pod) exists under its name but is not
    the Run's: it is never adopted, nor written or deleted. The Run fails and says what to delete; its own
    Lease, if any, is revoked first, so no Pod, however named, writes for it any more."""
    b = Builder(world)
    if world.run.status.phase in TERMINAL_PHASES:
        return render(world, b.transition())
    fields = {"leaseEpoch": revoke_lease(b)} if world.lease is not None else {}
    failure = failure_fields(FailureClass.DETERMINISTIC, identity.NAME_SQUATTED, message)
    b.set_phase(
        RunPhase.FAILED, identity.NAME_SQUATTED, message, failure=failure, nextAttemptTime=None, **fields
    )
    b.event("Warning", identity.NAME_SQUATTED, message)
    # Not redirected to Compensating (core.compensation.NO_PODS): no Pod may run for the Run.
    return render(world, b.transition())
