"""`watch RUN`: live progress until the Run stops or waits for someone."""

from __future__ import annotations

import argparse

from agentrun.api import TERMINAL_PHASES, WAITING_FOR_A_PERSON, Run, RunPhase
from agentrun.cli import formats
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_FAILED, EXIT_OK, CliError
from agentrun.cli.nextsteps import run_steps


def exit_code(run: Run) -> int | None:
    """0 once the Run succeeded or waits, 1 once it failed or was cancelled, None while it moves."""
    phase = run.status.phase
    if phase in WAITING_FOR_A_PERSON or phase == RunPhase.SUCCEEDED:
        return EXIT_OK
    if phase in TERMINAL_PHASES:
        return EXIT_FAILED
    return None


async def follow(ctx: Context, name: str, within: float | None) -> int:
    """Prints each change of phase or message until the Run settles; returns the exit code."""
    last: tuple[object, object] | None = None
    try:
        async for body in ctx.cluster.follow(name, within):
            run = Run.model_validate(body)
            if ctx.out.raw:
                ctx.out.obj(body)
            current = (run.status.phase, run.status.message)
            if current != last:
                last = current
                phase = run.status.phase.value if run.status.phase else "Pending"
                ctx.out.text(f"{formats.clock(ctx.now())}  {phase:<19} {run.status.message or ''}".rstrip())
            code = exit_code(run)
            if code is not None:
                if steps := run_steps(run, ctx.where):
                    ctx.out.text("\n".join(steps))
                return code
    except TimeoutError:
        pass
    raise CliError(f"run {name} did not stop or wait within {within or 0:g}s")


async def watch(ctx: Context, args: argparse.Namespace) -> int:
    return await follow(ctx, args.run, args.timeout)
