"""What to do next about a Run, as the commands `watch`, `describe` and `report` print them.

Every state a person must act on gets a way out, and every command suggested is one the plugin and the
operator accept in the state it is shown in (tests/unit/test_cli_hints.py holds each one to that).
Pure functions of the Run (and its ledger, for the report).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from agentrun.api import TERMINAL_PHASES, Run, RunPhase, SideEffectState
from agentrun.api.run import ReportedEffect
from agentrun.cli.hints import Target

# Where a retry whose side effect must change its request (a fixed target) is explained.
NEW_KEY_VERSION_DOC = "docs/api.md, 'Changing what a side effect sends'"
OPEN_STATES = (SideEffectState.UNKNOWN, SideEffectState.PENDING)


def _name(run: Run) -> str:
    return str(run.metadata.name)


def run_steps(run: Run, where: Target) -> list[str]:
    """What to do about a Run that waits or has stopped (watch, describe): empty while it moves on."""
    name, s = _name(run), run.status
    p = s.pending_request
    if s.phase in (RunPhase.INPUT_REQUIRED, RunPhase.AUTH_REQUIRED) and p is not None:
        prompt = f": {p.prompt}" if p.prompt else ""
        value = ("--value", "JSON") if p.accepted_schema is not None else ()
        return [
            f"waiting for request {p.request_id}{prompt}",
            f"answer with: {where.command('resume', name, *value)}",
        ]
    if s.phase == RunPhase.PAUSED:
        return [f"paused; continue with: {where.command('resume', name)}"]
    if s.phase == RunPhase.NEEDS_RECONCILIATION and s.compensating is not None:
        return [
            "its compensation is incomplete: the report says which side effects are left and how to "
            f"settle them: {where.command('report', name)}",
            f"then: {where.command('compensate', name)}",
        ]
    if s.phase == RunPhase.NEEDS_RECONCILIATION:
        return [
            "a person must settle its side effects: the report says which and how: "
            + where.command("report", name),
            f"then: {where.command('retry', name)}",
        ]
    if s.phase == RunPhase.FAILED:
        return [
            f"report: {where.command('report', name)}",
            f"once the cause is fixed, try again: {where.command('retry', name, '--reason', 'TEXT')}",
        ]
    if s.phase in TERMINAL_PHASES:
        return [f"report: {where.command('report', name)}"]
    return []


def report_steps(
    run: Run,
    effects: Sequence[ReportedEffect],
    where: Target,
    *,
    compensable: Collection[str],
    omitted: int = 0,
    live: bool = False,
) -> list[str]:
    """The ways out the report offers: settle what nobody knows, send again what did not happen,
    compensate what can be undone. `compensable`: the effects a compensation would undo (Confirmed,
    reversible and with a compensation named)."""
    name, s = _name(run), run.status
    open_ = [e for e in effects if e.state in OPEN_STATES]
    failed = [e for e in effects if e.state == SideEffectState.FAILED]
    incomplete = s.phase == RunPhase.NEEDS_RECONCILIATION and s.compensating is not None
    retryable = s.phase in (RunPhase.FAILED, RunPhase.NEEDS_RECONCILIATION) and not incomplete
    steps: list[str] = []
    if open_:
        resolve = ("resolve-effect", open_[0].name)
        steps += [
            "Resolve with one of:",
            f"  {where.command(*resolve, '--confirmed', '--reference', 'REF')}   (it happened)",
            f"  {where.command(*resolve, '--absent')}   (it did not: it may be sent again)",
            f"  {where.command(*resolve, '--failed')}   (it did not; never send it again)",
        ]
    if failed and retryable:
        steps += [
            "A failed one that did not happen may be sent again as it was (then retry):",
            f"  {where.command('resolve-effect', failed[0].name, '--absent')}",
            "If what it sends must change (e.g. a fixed target), the agent needs a new key version: see "
            + NEW_KEY_VERSION_DOC,
        ]
    if retryable and (open_ or failed):
        steps.append(f"Then retry with: {where.command('retry', name, '--reason', 'TEXT')}")
    if incomplete:
        steps.append(
            "Its compensation is incomplete: settle what is open (above); for an effect whose compensation "
            "could not run, fix the agent (register the compensation, fix its target; spec.agent.image), "
            f"then compensate again: {where.command('compensate', name)}"
        )
    elif s.phase in TERMINAL_PHASES and not live and any(e.name in compensable for e in effects):
        steps.append(f"Compensate with: {where.command('compensate', name)}")
    if omitted:
        steps.append(f"({omitted} more side effects not listed: {where.command('effects', name)})")
    return steps
