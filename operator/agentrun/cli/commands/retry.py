"""`retry RUN`: one more Attempt of a Failed or NeedsReconciliation Run, keeping its history."""

from __future__ import annotations

import argparse

from agentrun.api import CANCEL_FROZEN_PHASES, ControlOutcome, Run, RunPhase
from agentrun.cli.commands.common import read_run, show_outcome, shown_outcome
from agentrun.cli.commands.watch import follow
from agentrun.cli.context import Context
from agentrun.cli.controls import recorded, retry_key, retry_patch
from agentrun.cli.errors import EXIT_FAILED, CliError, describe_api_error
from agentrun.kubeapi import ApiError

RETRYABLE = (RunPhase.FAILED, RunPhase.NEEDS_RECONCILIATION)


def already_retried(run: Run, from_checkpoint: str | None, reason: str | None) -> bool:
    """The Run moved on because of this very retry (a repeated command after it was accepted)."""
    request = run.spec.retry_request
    if request is None or run.status.phase in RETRYABLE:
        return False
    same = (request.from_checkpoint, request.reason) == (from_checkpoint, reason)
    record = recorded(run, request.idempotency_key)
    return same and record is not None and record.outcome == ControlOutcome.ACCEPTED


async def retry(ctx: Context, args: argparse.Namespace) -> int:
    body, run = await read_run(ctx, args.run)
    request = run.spec.retry_request
    if not args.key and request is not None and already_retried(run, args.from_checkpoint, args.reason):
        record = recorded(run, request.idempotency_key)
        assert record is not None
        return show_outcome(ctx, args.run, record, body, again=True)
    by = await ctx.cluster.whoami()
    key = args.key or retry_key(run, args.from_checkpoint, args.reason, by)
    if (earlier := recorded(run, key)) is not None:
        return show_outcome(ctx, args.run, earlier, body, again=True)
    if run.status.phase in CANCEL_FROZEN_PHASES:
        raise CliError(
            f"run {args.run} is {run.status.phase.value}: only Failed or NeedsReconciliation Runs can be "
            "retried; nothing sent"
        )
    try:
        await ctx.cluster.merge_patch_run(args.run, retry_patch(key, args.from_checkpoint, args.reason, by))
    except ApiError as exc:
        raise CliError(describe_api_error(exc, f"cannot retry run {args.run}")) from None
    code = await shown_outcome(ctx, args.run, key, args.timeout)
    if code == EXIT_FAILED or not args.wait:
        return code
    return await follow(ctx, args.run, None)
