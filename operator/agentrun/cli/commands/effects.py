"""The side-effect ledger: `effects RUN` and `resolve-effect NAME`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentrun.api import Resolution, Run, RunPhase, SideEffect, SideEffectState
from agentrun.cli import formats
from agentrun.cli.commands import retry
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_OK, EXIT_USAGE, CliError, describe_api_error
from agentrun.cli.output import as_list
from agentrun.kubeapi import ApiError

OPEN = (SideEffectState.UNKNOWN, SideEffectState.PENDING)
MAX_HISTORY = 20
ATTEMPTS = 3  # tries of the resourceVersion-guarded write when someone else writes meanwhile


async def effects(ctx: Context, args: argparse.Namespace) -> int:
    await ctx.cluster.run(args.run)  # a missing Run is an error, not an empty list
    items = await ctx.cluster.owned("sideeffects", args.run)
    if ctx.out.raw:
        ctx.out.obj(as_list(items))
        return EXIT_OK
    if not items:
        ctx.out.note(f"No side effects recorded for run {args.run}.")
        return EXIT_OK
    parsed = [SideEffect.model_validate(i) for i in items]
    parsed.sort(key=lambda e: (formats.rfc3339(e.metadata.creation_timestamp), e.metadata.name or ""))
    ctx.out.text(formats.effects_table(parsed))
    return EXIT_OK


VERDICTS = {
    Resolution.CONFIRMED: SideEffectState.CONFIRMED,
    Resolution.FAILED: SideEffectState.FAILED,
    Resolution.ABSENT: SideEffectState.FAILED,  # it did not happen; a later Attempt may send it afresh
}


def resolution(
    effect: SideEffect,
    target: SideEffectState,
    *,
    who: str,
    reference: str | None,
    result: Any,
    now: str,
    verdict: Resolution | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """The status patch that records a person's verdict on an effect's outcome: who, what and why."""
    history = [h.to_api() for h in (effect.status.history or [])] if effect.status else []
    said = f"resolved {verdict.value if verdict else target.value} by {who} (kubectl agentrun)"
    entry = {"state": target.value, "time": now, "message": (said + (f": {reason}" if reason else ""))[:1024]}
    status: dict[str, Any] = {
        "state": target.value,
        "resolvedBy": who,
        "history": [*history, entry][-MAX_HISTORY:],
    }
    if verdict is not None:
        status["resolution"] = verdict.value
        # maxSends counts the sends after an Absent verdict: the ones it covers are spent.
        status["resolvedSends"] = len(effect.status.sends or []) if effect.status else 0
    if reason:
        status["resolutionMessage"] = reason[:1024]
    if reference is not None:
        status["externalReference"] = reference
    if result is not None:
        status["result"] = result
    return {"metadata": {"resourceVersion": effect.metadata.resource_version}, "status": status}


def refusal(effect: SideEffect, verdict: Resolution) -> str | None:
    """Why a person's verdict cannot be recorded on the effect as it stands, or None.

    An open outcome (Unknown, Pending) takes any verdict. A Failed one takes Absent only: "it did not
    happen, it may be sent again" (Failed stays Failed, the resolution recorded; the SDK's next send
    under the same key starts a fresh count). Nothing else is rewritten: the ledger keeps its history.
    """
    name, state = effect.metadata.name, formats.effect_state(effect)
    if state in OPEN:
        return None
    if state == SideEffectState.FAILED and verdict == Resolution.ABSENT:
        return None
    if state == SideEffectState.FAILED:
        return (
            f"side effect {name} is Failed: only --absent applies to it (it did not happen and may be "
            "sent again under the same key); a Failed record never becomes Confirmed"
        )
    return (
        f"side effect {name} is {state.value}: only an Unknown (or Pending) outcome can be resolved, and "
        "a Failed one marked --absent"
    )


def already_absent(effect: SideEffect) -> bool:
    """Resolved Absent, and nothing sent since: resolving it so again would change nothing."""
    status = effect.status
    return (
        status is not None
        and status.state == SideEffectState.FAILED
        and status.resolution == Resolution.ABSENT
        and (status.resolved_sends or 0) == len(status.sends or [])
    )


async def _write_resolution(
    ctx: Context,
    name: str,
    verdict: Resolution,
    *,
    who: str,
    reference: str | None,
    result: Any,
    reason: str | None,
) -> tuple[SideEffectState, SideEffect, dict[str, Any]]:
    """Reads the effect, checks it may be resolved, writes the verdict guarded by its resourceVersion."""
    for attempt in range(1, ATTEMPTS + 1):
        effect = SideEffect.model_validate(await ctx.cluster.side_effect(name))
        state = formats.effect_state(effect)
        if problem := refusal(effect, verdict):
            raise CliError(problem)
        now = formats.rfc3339(ctx.now())
        patch = resolution(
            effect,
            VERDICTS[verdict],
            who=who,
            reference=reference,
            result=result,
            now=now,
            verdict=verdict,
            reason=reason,
        )
        try:
            return state, effect, await ctx.cluster.patch_side_effect_status(name, patch)
        except ApiError as exc:
            if not exc.conflict or attempt == ATTEMPTS:
                raise CliError(describe_api_error(exc, f"cannot resolve side effect {name}")) from None
            # written meanwhile (a worker's lookup?): read it again and judge again
    raise AssertionError("unreachable")


async def resolve_effect(ctx: Context, args: argparse.Namespace) -> int:
    verdict = (
        Resolution.CONFIRMED if args.confirmed else Resolution.ABSENT if args.absent else Resolution.FAILED
    )
    target = VERDICTS[verdict]
    if args.confirmed and not args.reference:
        raise CliError(
            "--confirmed needs --reference REF: the external system's id of what was done", EXIT_USAGE
        )
    result: Any = None
    if args.result is not None:
        try:
            result = json.loads(args.result)
        except ValueError as exc:
            raise CliError(f"--result is not valid JSON: {exc}", EXIT_USAGE) from None
    who = await ctx.cluster.whoami()
    if who is None:
        raise CliError(
            "the API server did not say who you are (SelfSubjectReview, as `kubectl auth whoami` asks): a "
            "resolution names who made it, and only you may name yourself; nothing sent"
        )
    current = SideEffect.model_validate(await ctx.cluster.side_effect(args.name))
    if verdict == Resolution.ABSENT and already_absent(current):
        ctx.out.text(f"side effect {args.name}: already resolved Absent, nothing sent since; nothing written")
        return await _next_for_run(ctx, args, current.spec.run_name, verdict)
    before, effect, written = await _write_resolution(
        ctx, args.name, verdict, who=who, reference=args.reference, result=result, reason=args.reason
    )
    if ctx.out.raw:
        ctx.out.obj(written)
    reference = f" ({args.reference})" if args.reference else ""
    absent = " (Absent: it did not happen; a later Attempt may send it again)" if args.absent else ""
    ctx.out.text(
        f"side effect {args.name}: {before.value} -> {target.value}{reference}{absent}, resolved by {who}"
    )
    return await _next_for_run(ctx, args, effect.spec.run_name, verdict)


async def _next_for_run(ctx: Context, args: argparse.Namespace, run_name: str, verdict: Resolution) -> int:
    """Once an effect is settled: says how the Run goes on (or retries it, with --retry)."""
    run_body = await ctx.cluster.find_run(run_name)
    run = Run.model_validate(run_body) if run_body is not None else None
    phase = run.status.phase if run is not None else None
    if run is None or phase not in (RunPhase.NEEDS_RECONCILIATION, RunPhase.FAILED):
        return EXIT_OK
    if run.status.compensating is not None:  # a retry would run the agent over a half-undone world
        ctx.out.note(
            f"run {run_name}'s compensation is incomplete: once nothing is left open, compensate again: "
            + ctx.command("compensate", run_name)
        )
        return EXIT_OK
    left = [
        e
        for e in (SideEffect.model_validate(i) for i in await ctx.cluster.owned("sideeffects", run_name))
        if formats.effect_state(e) == SideEffectState.UNKNOWN
    ]
    if left:
        names = ", ".join(sorted(str(e.metadata.name) for e in left))
        ctx.out.note(
            f"run {run_name} still has outcomes nobody knows ({names}): resolve them, then retry "
            f"(see {ctx.command('report', run_name)})"
        )
        return EXIT_OK
    if not args.retry:
        state = "needs reconciliation" if phase == RunPhase.NEEDS_RECONCILIATION else "is Failed"
        ctx.out.note(f"run {run_name} {state}; retry it: {ctx.command('retry', run_name)}")
        return EXIT_OK
    why = f"resolved {args.name} {verdict.value}" + (f": {args.reason}" if args.reason else "")
    retry_args = argparse.Namespace(
        run=run_name, from_checkpoint=None, reason=why[:1024], key=None, wait=False, timeout=args.timeout
    )
    return await retry.retry(ctx, retry_args)
