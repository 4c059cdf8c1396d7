"""The Run state machine as a table: its rules in the order they are tried, the first that applies wins.

`decide(world)` is a pure function. It is level-based: it looks only at the current objects, never at
what happened in memory before, so an operator restart at any line simply calls it again. Every write
it asks for is idempotent (deterministic names) or preconditioned (resourceVersion), and each write
sequence is ordered so that a crash between two writes leaves a state the table continues from. Each
rule's docstring (core.runs.rules) says its transition.
"""

from __future__ import annotations

from typing import Final

from agentrun.api import (
    ATTEMPT_RUNS_IN,
    CANCEL_FROZEN_PHASES,
    STOPPED_PHASES,
    TERMINAL_PHASES,
    WAITING_PHASES,
    RunPhase,
)
from agentrun.core.plan import Plan
from agentrun.core.runs import (
    attempts,
    compaction,
    compensation,
    expiry,
    fork,
    restoring,
    rules,
    store_credentials,
)
from agentrun.core.runs.chain import ANY_PHASE, Chain, Rewrite, Rule, pairs
from agentrun.core.runs.upkeep import upkeep
from agentrun.core.runs.world import World

P = RunPhase
WAITING: Final = frozenset(WAITING_PHASES)
STOPPED: Final = frozenset(STOPPED_PHASES)
ENDS: Final = frozenset(TERMINAL_PHASES)

TABLE: Final = Chain(
    (
        Rule("Deleted", rules.deleted, upkeep=False),
        Rule(
            "NameSquatted",
            rules.name_squatted,
            upkeep=False,
            applies_in=ANY_PHASE - ENDS,
            moves_to=frozenset({P.FAILED}),
        ),
        Rule("StoreCredentialsProvision", store_credentials.provision, upkeep=False),
        Rule("CommitRefused", rules.commit_refused, upkeep=False),
        Rule(
            "Committed",
            rules.committed,
            applies_in=frozenset(ATTEMPT_RUNS_IN),
            moves_to=frozenset({P.SUCCEEDED}),
        ),
        Rule(
            "Compensating",
            compensation.compensating,
            table=compensation.COMPENSATING,
            applies_in=frozenset({P.COMPENSATING}),
            moves_to=ENDS | {P.NEEDS_RECONCILIATION},
        ),
        Rule(
            "CancelAsked",
            rules.cancel_asked,
            applies_in=ANY_PHASE - {None, *CANCEL_FROZEN_PHASES, P.CANCEL_REQUESTED},
            moves_to=frozenset({P.CANCEL_REQUESTED, P.CANCELLED}),
        ),
        Rule(
            "DeadlinePassed",
            rules.deadline_passed,
            applies_in=ANY_PHASE - STOPPED - {P.COMPENSATING},
            moves_to=frozenset({P.FAILED}),
        ),
        Rule("HoldEnding", rules.hold_ending, applies_in=WAITING),
        Rule(
            "ControlRequest",
            rules.control_request,
            moves_to=ENDS | {P.RUNNING, P.COMPENSATING},
            # a retry (Failed, NeedsReconciliation), a resume (waiting), their grant refused (Failed);
            # a compensation asked for (ended), or an incomplete one asked again or found complete
            only=pairs(
                frozenset({P.FAILED, P.NEEDS_RECONCILIATION}) | WAITING, frozenset({P.RUNNING, P.FAILED})
            )
            | pairs(ENDS | {P.NEEDS_RECONCILIATION}, frozenset({P.COMPENSATING}))
            | pairs(frozenset({P.NEEDS_RECONCILIATION}), ENDS),
        ),
        Rule("Compacting", compaction.compacting, applies_in=ENDS),
        Rule("Expired", expiry.expiry, applies_in=ENDS),
        Rule("StateRestore", restoring.state_restore, applies_in=frozenset({P.NEEDS_RECONCILIATION})),
        Rule("Stopped", rules.stopped, applies_in=STOPPED),
        Rule("RequestExpired", rules.request_expired, applies_in=WAITING, moves_to=frozenset({P.FAILED})),
        Rule(
            "StateStoreCredentialsMissing",
            store_credentials.credentials_missing,
            applies_in=frozenset({None, P.QUEUED}),
            moves_to=frozenset({P.FAILED}),
        ),
        Rule(
            "ForkStart",
            fork.fork_start,
            applies_in=frozenset({None, P.QUEUED}),
            moves_to=frozenset({P.RUNNING, P.FAILED, P.NEEDS_RECONCILIATION}),
        ),
        Rule(
            "FirstAttempt",
            rules.first_attempt,
            applies_in=frozenset({None, P.QUEUED}),
            moves_to=frozenset({P.RUNNING, P.FAILED}),
        ),
        Rule("TakeoverUnfinished", rules.takeover_unfinished, applies_in=frozenset({P.RETRY_BACKOFF})),
        Rule(
            "RetryDue",
            rules.retry_due,
            applies_in=frozenset({P.RETRY_BACKOFF}),
            moves_to=frozenset({P.RUNNING, P.FAILED}),
        ),
        Rule("BackingOff", rules.backing_off, applies_in=frozenset({P.RETRY_BACKOFF})),
        Rule(
            "Running",
            rules.running,
            table=attempts.RUNNING,
            applies_in=frozenset({P.RUNNING}),
            moves_to=WAITING | {P.SUCCEEDED, P.RETRY_BACKOFF, P.FAILED, P.NEEDS_RECONCILIATION},
        ),
        Rule(
            "Cancelling",
            rules.cancelling,
            applies_in=frozenset({P.CANCEL_REQUESTED}),
            moves_to=frozenset({P.CANCELLED}),
        ),
        Rule("Resting", rules.resting),
    ),
    upkeep=upkeep,
    rewrites=(
        Rewrite(
            "CompensateFirst",
            compensation.compensate_first,
            turns=((P.CANCELLED, P.COMPENSATING), (P.FAILED, P.COMPENSATING)),
        ),
        Rewrite("CollectPods", compaction.collect_pods),
    ),
)


def decide(world: World) -> Plan:
    """The writes that move the Run on from what is observed now, in order."""
    return TABLE.evaluate(world)
