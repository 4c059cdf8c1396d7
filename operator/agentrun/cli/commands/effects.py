"""The side-effect ledger: `effects RUN` and `resolve-effect NAME`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentrun.api import Run, RunPhase, SideEffect, SideEffectState
from agentrun.cli import render
from agentrun.cli.config import context_user
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_OK, EXIT_USAGE, CliError, describe_api_error
from agentrun.cli.output import as_list
from agentrun.kubeapi import ApiError

RESOLVABLE = (SideEffectState.UNKNOWN, SideEffectState.PENDING)
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
    parsed.sort(key=lambda e: (render.rfc3339(e.metadata.creation_timestamp), e.metadata.name or ""))
    ctx.out.text(render.effects_table(parsed))
    return EXIT_OK


def resolution(
    effect: SideEffect, target: SideEffectState, *, who: str, reference: str | None, result: Any, now: str
) -> dict[str, Any]:
    """The status patch that records a person's (or a lookup's) verdict on an effect's outcome."""
    history = [h.to_api() for h in (effect.status.history or [])] if effect.status else []
    entry = {"state": target.value, "time": now, "message": f"resolved by {who} (kubectl agentrun)"}
    status: dict[str, Any] = {
        "state": target.value,
        "resolvedBy": who,
        "history": [*history, entry][-MAX_HISTORY:],
    }
    if reference is not None:
        status["externalReference"] = reference
    if result is not None:
        status["result"] = result
    return {"metadata": {"resourceVersion": effect.metadata.resource_version}, "status": status}


async def _write_resolution(
    ctx: Context, name: str, target: SideEffectState, *, who: str, reference: str | None, result: Any
) -> tuple[SideEffectState, SideEffect, dict[str, Any]]:
    """Reads the effect, checks it may be resolved, writes the verdict guarded by its resourceVersion."""
    for attempt in range(1, ATTEMPTS + 1):
        effect = SideEffect.model_validate(await ctx.cluster.side_effect(name))
        state = render.effect_state(effect)
        if state not in RESOLVABLE:
            raise CliError(
                f"side effect {name} is {state.value}: only an Unknown (or Pending) outcome can be resolved"
            )
        now = render.rfc3339(ctx.now())
        patch = resolution(effect, target, who=who, reference=reference, result=result, now=now)
        try:
            return state, effect, await ctx.cluster.patch_side_effect_status(name, patch)
        except ApiError as exc:
            if not exc.conflict or attempt == ATTEMPTS:
                raise CliError(describe_api_error(exc, f"cannot resolve side effect {name}")) from None
            # written meanwhile (a worker's lookup?): read it again and judge again
    raise AssertionError("unreachable")


async def resolve_effect(ctx: Context, args: argparse.Namespace) -> int:
    target = SideEffectState.CONFIRMED if args.confirmed else SideEffectState.FAILED
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
    who = args.by or await ctx.cluster.whoami() or context_user(ctx.kubeconfig) or "kubectl-agentrun"
    before, effect, written = await _write_resolution(
        ctx, args.name, target, who=who, reference=args.reference, result=result
    )
    if ctx.out.raw:
        ctx.out.obj(written)
    reference = f" ({args.reference})" if args.reference else ""
    ctx.out.text(f"side effect {args.name}: {before.value} -> {target.value}{reference}, resolved by {who}")
    run_body = await ctx.cluster.find_run(effect.spec.run_name)
    if run_body is not None and Run.model_validate(run_body).status.phase == RunPhase.NEEDS_RECONCILIATION:
        ctx.out.note(
            f"run {effect.spec.run_name} needs reconciliation; once no outcome is unknown, retry it: "
            f"kubectl agentrun retry {effect.spec.run_name}"
        )
    return EXIT_OK
