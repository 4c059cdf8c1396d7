"""Pieces the control commands share: reading the Run, waiting for and printing the recorded outcome."""

from __future__ import annotations

from typing import Any

from agentrun.api import ControlOutcome, ControlRecord, Run
from agentrun.cli import formats
from agentrun.cli.cluster import wait_for_run
from agentrun.cli.context import Context
from agentrun.cli.controls import recorded
from agentrun.cli.errors import EXIT_FAILED, EXIT_OK, CliError


async def read_run(ctx: Context, name: str) -> tuple[dict[str, Any], Run]:
    body = await ctx.cluster.run(name)
    return body, Run.model_validate(body)


def show_outcome(
    ctx: Context, run_name: str, record: ControlRecord, body: dict[str, Any], *, again: bool = False
) -> int:
    """Prints the operator's verdict on a control request; exit 1 when it was rejected."""
    if ctx.out.raw:
        ctx.out.obj(body)
    prefix = "already recorded: " if again else ""
    ctx.out.text(f"run {run_name}: {prefix}{formats.control_line(record)}")
    if record.outcome == ControlOutcome.ACCEPTED:
        return EXIT_OK
    # the operator's message names no namespace: say where to look, with the flags to get there
    ctx.out.note(f"what the Run waits for, and the ways out: {ctx.command('report', run_name)}")
    return EXIT_FAILED


async def await_outcome(
    ctx: Context, name: str, key: str, within: float
) -> tuple[dict[str, Any], ControlRecord | None]:
    """Waits until the operator has recorded its outcome for `key` in status.controls."""
    body, done = await wait_for_run(
        ctx.cluster, name, lambda run: recorded(Run.model_validate(run), key) is not None, within
    )
    return body, recorded(Run.model_validate(body), key) if done else None


async def shown_outcome(ctx: Context, name: str, key: str, within: float) -> int:
    """Waits for the operator's outcome for `key` and prints it; an error when none came in time."""
    final, record = await await_outcome(ctx, name, key, within)
    if record is None:
        raise no_outcome(ctx, name, key, within)
    return show_outcome(ctx, name, record, final)


def no_outcome(ctx: Context, name: str, key: str, timeout: float) -> CliError:
    return CliError(
        f"the operator recorded no outcome for {key} within {timeout:g}s (is it running?); "
        f"the request stays in the Run's spec: see {ctx.command('describe', name)}"
    )
