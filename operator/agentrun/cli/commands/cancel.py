"""`cancel RUN`: a compare-and-swap on spec.cancelEpoch, so that a double click makes one cancel."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from agentrun.api import TERMINAL_PHASES, Run, RunPhase
from agentrun.cli import formats
from agentrun.cli.cluster import Cluster, wait_for_run
from agentrun.cli.commands.common import read_run
from agentrun.cli.context import Context
from agentrun.cli.controls import cancel_key, cancel_operations, cancel_request
from agentrun.cli.errors import EXIT_FAILED, EXIT_OK, CliError, describe_api_error
from agentrun.kubeapi import ApiError


@dataclass(frozen=True)
class Swap:
    """How the compare-and-swap went: `ours` when our write raised the epoch to `epoch`."""

    ours: bool
    epoch: int


async def compare_and_swap(
    cluster: Cluster,
    name: str,
    observed: int | None,
    resource_version: str | None,
    request: dict[str, Any] | None = None,
) -> Swap:
    """Raises the cancel epoch from `observed` to observed + 1, unless someone else moved it first;
    `request` is the spec.cancelRequest sent with it."""
    try:
        written = await cluster.json_patch_run(name, cancel_operations(observed, resource_version, request))
    except ApiError as exc:
        if exc.status not in (409, 422):
            raise
        now = (await cluster.run(name)).get("spec", {}).get("cancelEpoch")
        if now is not None and now > (observed or 0):
            return Swap(ours=False, epoch=int(now))
        # the epoch did not move: the server refused the cancel itself (e.g. the Run has ended)
        raise CliError(describe_api_error(exc, f"cannot cancel run {name}")) from None
    return Swap(ours=True, epoch=int(written.get("spec", {}).get("cancelEpoch", 0)))


def already_cancelling(run: Run) -> bool:
    """A cancel is under way or done: raising the epoch again would only count a second cancel."""
    phase = run.status.phase
    if phase in (RunPhase.CANCELLED, RunPhase.CANCEL_REQUESTED):
        return True
    return phase != RunPhase.SUCCEEDED and run.spec.cancel_epoch > (run.status.observed_cancel_epoch or 0)


async def cancel(ctx: Context, args: argparse.Namespace) -> int:
    body, run = await read_run(ctx, args.run)
    if already_cancelling(run):
        state = "Cancelled" if run.status.phase == RunPhase.CANCELLED else "requested"
        ctx.out.text(
            f"run {args.run}: already cancelled ({state}, cancel epoch {run.spec.cancel_epoch}); nothing sent"
        )
    else:
        observed = body.get("spec", {}).get("cancelEpoch")
        target = (observed or 0) + 1
        by = await ctx.cluster.whoami()
        key = args.idempotency_key or cancel_key(run, target, args.reason, by)
        request = cancel_request(key, args.reason, by)
        swap = await compare_and_swap(
            ctx.cluster, args.run, observed, body["metadata"].get("resourceVersion"), request
        )
        if swap.ours:
            ctx.out.text(f"run {args.run}: cancel requested (cancel epoch {observed or 0} -> {swap.epoch})")
        else:
            ctx.out.text(f"run {args.run}: already cancelled by someone else (epoch now {swap.epoch})")
    if not args.wait:
        if ctx.out.raw:
            ctx.out.obj(await ctx.cluster.run(args.run))
        return EXIT_OK
    final, done = await wait_for_run(
        ctx.cluster, args.run, lambda b: Run.model_validate(b).status.phase in TERMINAL_PHASES, args.timeout
    )
    if ctx.out.raw:
        ctx.out.obj(final)
    if not done:
        now = formats.phase_line(Run.model_validate(final))
        raise CliError(f"run {args.run} not Cancelled within {args.timeout:g}s: {now}")
    ended = Run.model_validate(final)
    ctx.out.text(f"run {args.run}: {formats.phase_line(ended)}")
    return EXIT_OK if ended.status.phase == RunPhase.CANCELLED else EXIT_FAILED
