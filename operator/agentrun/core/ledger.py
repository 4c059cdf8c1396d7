"""Ledger rules for external side effects: what a worker may do, given what the ledger says.

The ledger (SideEffect objects) is written before an action runs and confirmed after it, so after any
crash the record tells whether the action may have happened. The rules never execute an action whose
record says Confirmed, and never guess about one whose outcome is unknown.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from agentrun.api import Attempt, AttemptReason, SideEffect, SideEffectState


class Step(StrEnum):
    EXECUTE = "execute"  # no trace of the action anywhere: run it
    REUSE = "reuse"  # it happened and its result is recorded: never run it again
    LOOK_UP = "look_up"  # it may have happened: ask the external system by idempotency key
    RECONCILE = "reconcile"  # nobody can tell: stop automation until a person or a lookup resolves it
    REFUSE = "refuse"  # it failed for good earlier, or the record belongs to another request


def side_effect_name(run_name: str, idempotency_key: str) -> str:
    """SideEffect objects are named from a hash of the Run's name and the key: one record per external
    action of a Run. The ledger is the Run's: the same key in two Runs names two records (a NUL cannot
    occur in a Run's name, so no other pair hashes the same text)."""
    return "sfx-" + hashlib.sha256(f"{run_name}\0{idempotency_key}".encode()).hexdigest()[:32]


def foreign_record(record: Mapping[str, Any], run_name: str, run_uid: str | None) -> str | None:
    """Why an existing Checkpoint or SideEffect is not this Run's (None: it is): its spec.runName and its
    owner (the Run's UID) must both be the Run's, or it was put there by someone else."""
    metadata, spec = record.get("metadata") or {}, record.get("spec") or {}
    kind, name = record.get("kind") or "record", metadata.get("name")
    if spec.get("runName") != run_name:
        return f"{kind} {name} belongs to Run {spec.get('runName')!r}, not {run_name!r}: it is never used"
    owners = [ref.get("uid") for ref in metadata.get("ownerReferences") or [] if ref.get("kind") == "Run"]
    if not run_uid or run_uid not in owners:
        return f"{kind} {name} names Run {run_name} but is not owned by it (uid {run_uid}): it is never used"
    return None


def request_digest(tool: str, target: str | None, request: Any = None) -> str:
    canonical = json.dumps(
        {"tool": tool, "target": target, "request": request}, sort_keys=True, separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def next_step(record: SideEffect | None, digest: str) -> Step:
    if record is None:
        return Step.EXECUTE
    if record.spec.request_digest and record.spec.request_digest != digest:
        return Step.REFUSE  # the same key was used for a different action: never conflate them
    state = record.status.state if record.status else SideEffectState.PENDING
    match state:
        case SideEffectState.CONFIRMED | SideEffectState.COMPENSATED:
            return Step.REUSE
        case SideEffectState.PENDING | SideEffectState.UNKNOWN:
            return Step.LOOK_UP
        case _:
            return Step.REFUSE


def after_lookup(found: bool | None, can_look_up: bool) -> Step:
    """found: True (the action happened), False (it did not), None (the lookup could not tell)."""
    if not can_look_up or found is None:
        return Step.RECONCILE
    return Step.REUSE if found else Step.EXECUTE


# --- approvals ------------------------------------------------------------------------------------------
# A gated action asks for approval with an interrupt whose request id names its SideEffect. The answer
# reaches the worker as the spec.input of the Attempt that resumes (written by the operator, immutable),
# and the operator, not the worker, records it on the SideEffect: a Pod may never write an approval.


def approval_request_id(side_effect: str) -> str:
    """The id of the interrupt that asks to approve the action recorded as SideEffect `side_effect`."""
    return f"approve-{side_effect}"


def approval_answer(attempts: Iterable[Attempt], request_id: str) -> Any:
    """The accepted answer to approval request `request_id`: the input of the Attempt that resumed with
    it (None if it was not answered)."""
    reason = AttemptReason.resume(request_id)
    return next((a.spec.input for a in attempts if a.spec.reason == reason), None)


def approved(answer: Any) -> bool:
    return isinstance(answer, dict) and answer.get("approved") is True


def approvals_to_record(side_effects: Iterable[SideEffect], attempts: Iterable[Attempt]) -> list[str]:
    """SideEffects whose approval was given (an Attempt resumed with an approving answer) but is not yet
    recorded on them."""
    attempts = list(attempts)
    return [
        str(effect.metadata.name)
        for effect in side_effects
        if not (effect.status and effect.status.approval)
        and approved(approval_answer(attempts, approval_request_id(str(effect.metadata.name))))
    ]
