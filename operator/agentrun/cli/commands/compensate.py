"""`compensate RUN [--effect KEY]...`: run the compensations of a terminal Run's side effects now."""

from __future__ import annotations

import argparse

from agentrun.api import TERMINAL_PHASES, Run, RunPhase
from agentrun.cli.commands.common import read_run, show_outcome, shown_outcome
from agentrun.cli.commands.watch import follow
from agentrun.cli.context import Context
from agentrun.cli.controls import compensate_key, compensate_patch, recorded
from agentrun.cli.errors import EXIT_FAILED, EXIT_OK, CliError, describe_api_error
from agentrun.kubeapi import ApiError


def compensable_now(run: Run) -> bool:
    """The operator takes a compensate request of an ended Run, or of one whose compensation was
    incomplete (core.compensation.judge); a Run in NeedsReconciliation for another reason is retried."""
    phase = run.status.phase
    incomplete = phase == RunPhase.NEEDS_RECONCILIATION and run.status.compensating is not None
    return phase in TERMINAL_PHASES or incomplete


async def compensate(ctx: Context, args: argparse.Namespace) -> int:
    body, run = await read_run(ctx, args.run)
    effects = list(args.effect or [])
    by = await ctx.cluster.whoami()
    key = args.key or compensate_key(run, effects, by)
    if (earlier := recorded(run, key)) is not None:
        return show_outcome(ctx, args.run, earlier, body, again=True)
    if not compensable_now(run):
        phase = run.status.phase.value if run.status.phase else "not started"
        raise CliError(
            f"run {args.run} is {phase}: only a Succeeded, Failed or Cancelled Run compensates (or one "
            "whose compensation was incomplete); nothing sent"
        )
    try:
        await ctx.cluster.merge_patch_run(args.run, compensate_patch(key, effects, by))
    except ApiError as exc:
        raise CliError(describe_api_error(exc, f"cannot compensate run {args.run}")) from None
    code = await shown_outcome(ctx, args.run, key, args.timeout)
    if code == EXIT_FAILED or not args.wait:
        return code
    await follow(ctx, args.run, None)
    # Back in its phase (a Cancelled or Failed one too) is what was asked; incomplete is not.
    _, after = await read_run(ctx, args.run)
    return EXIT_FAILED if after.status.phase == RunPhase.NEEDS_RECONCILIATION else EXIT_OK
