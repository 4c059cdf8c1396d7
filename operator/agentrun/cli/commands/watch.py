"""`watch RUN`: live progress until the Run stops or waits for someone."""

from __future__ import annotations

import argparse

from agentrun.api import TERMINAL_PHASES, WAITING_FOR_A_PERSON, Run, RunPhase
from agentrun.cli import render
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_FAILED, EXIT_OK, CliError


def settled_hint(run: Run) -> str | None:
    """What to do next about a Run that waits or has stopped."""
    name, s = run.metadata.name, run.status
    p = s.pending_request
    if s.phase in (RunPhase.INPUT_REQUIRED, RunPhase.AUTH_REQUIRED) and p is not None:
        prompt = f": {p.prompt}" if p.prompt else ""
        value = " --value JSON" if p.accepted_schema is not None else ""
        answer = f"answer with: kubectl agentrun resume {name}{value}"
        return f"waiting for request {p.request_id}{prompt}\n{answer}"
    if s.phase == RunPhase.PAUSED:
        return f"paused; continue with: kubectl agentrun resume {name}"
    if s.phase == RunPhase.NEEDS_RECONCILIATION and s.compensating is not None:
        return (
            f"its compensation is incomplete: resolve the side effects (kubectl agentrun effects {name}), "
            f"then: kubectl agentrun compensate {name}"
        )
    if s.phase == RunPhase.NEEDS_RECONCILIATION:
        return (
            f"resolve its unknown side effects (kubectl agentrun effects {name}), "
            f"then: kubectl agentrun retry {name}"
        )
    if s.phase in TERMINAL_PHASES:
        return f"report: kubectl agentrun report {name}"
    return None


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
                ctx.out.text(f"{render.clock(ctx.now())}  {phase:<19} {run.status.message or ''}".rstrip())
            code = exit_code(run)
            if code is not None:
                if hint := settled_hint(run):
                    ctx.out.text(hint)
                return code
    except TimeoutError:
        pass
    raise CliError(f"run {name} did not stop or wait within {within or 0:g}s")


async def watch(ctx: Context, args: argparse.Namespace) -> int:
    return await follow(ctx, args.run, args.timeout)
