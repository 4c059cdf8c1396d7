"""`pause RUN`: ask the agent to stop at its next step boundary, as if it had asked for input."""

from __future__ import annotations

import argparse

from agentrun.api import STOPPED_PHASES, RunPhase
from agentrun.cli.commands.common import await_outcome, read_run, show_outcome
from agentrun.cli.context import Context
from agentrun.cli.controls import pause_patch, pause_request_id, recorded
from agentrun.cli.errors import EXIT_OK, CliError, describe_api_error
from agentrun.kubeapi import ApiError

# The operator judges a pause only on the way to or at a step boundary; never in these phases.


async def pause(ctx: Context, args: argparse.Namespace) -> int:
    body, run = await read_run(ctx, args.run)
    pending = run.status.pending_request
    if run.status.phase == RunPhase.PAUSED and pending is not None and not args.request_id:
        ctx.out.text(f"run {args.run}: already paused (request {pending.request_id}); nothing sent")
        return EXIT_OK
    request_id = args.request_id or pause_request_id(run, args.reason)
    if (earlier := recorded(run, request_id)) is not None:
        return show_outcome(ctx, args.run, earlier, body, again=True)
    if run.status.phase in STOPPED_PHASES:
        raise CliError(f"run {args.run} is {run.status.phase}: only a running Run can pause; nothing sent")
    try:
        await ctx.cluster.merge_patch_run(args.run, pause_patch(request_id, args.reason))
    except ApiError as exc:
        raise CliError(describe_api_error(exc, f"cannot pause run {args.run}")) from None
    final, record = await await_outcome(ctx, args.run, request_id, args.timeout)
    if record is not None:
        return show_outcome(ctx, args.run, record, final)
    if ctx.out.raw:
        ctx.out.obj(final)
    ctx.out.text(f"run {args.run}: pause {request_id} requested; the agent pauses at its next step boundary")
    return EXIT_OK
