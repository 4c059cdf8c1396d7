"""Reading commands: `get`, `describe` and `report`."""

from __future__ import annotations

import argparse
import asyncio

from agentrun.api import STOPPED_PHASES, Attempt, Checkpoint, Run, SideEffect
from agentrun.cli import formats, timeline
from agentrun.cli.commands import finished, history
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_OK, CliError, NotFound
from agentrun.cli.output import as_list
from agentrun.core.compensation import compensable


async def get(ctx: Context, args: argparse.Namespace) -> int:
    if args.run:
        body = await ctx.cluster.run(args.run)
        bodies = [body]
        if ctx.out.raw:
            ctx.out.obj(body)
            return EXIT_OK
    else:
        bodies = await ctx.cluster.runs(all_namespaces=args.all_namespaces)
        if ctx.out.raw:
            ctx.out.obj(as_list(bodies))
            return EXIT_OK
    if not bodies:
        where = "any namespace" if args.all_namespaces else f"namespace {ctx.namespace}"
        ctx.out.note(f"No runs found in {where}.")
        return EXIT_OK
    runs = sorted(
        (Run.model_validate(b) for b in bodies),
        key=lambda r: (r.metadata.namespace or "", r.metadata.name or ""),
    )
    ctx.out.text(formats.runs_table(runs, ctx.now(), with_namespace=args.all_namespaces))
    return EXIT_OK


async def describe(ctx: Context, args: argparse.Namespace) -> int:
    if getattr(args, "archived", False):
        return await history.describe_archived(ctx, args)
    if getattr(args, "uid", None):
        raise CliError("--uid names an archived Run: use it with --archived")
    try:
        body = await ctx.cluster.run(args.run)
    except NotFound as missing:
        # A Run past its time to live left the cluster, archive first: say where it may be.
        raise CliError(
            f"{missing.message}; a Run that finished and was archived is read with "
            f"`kubectl agentrun describe --archived {args.run} -n {ctx.namespace}` "
            f"(its namespace's archives: `kubectl agentrun history -n {ctx.namespace}`)"
        ) from None
    attempts, checkpoints, effects = await asyncio.gather(
        ctx.cluster.owned("attempts", args.run),
        ctx.cluster.owned("checkpoints", args.run),
        ctx.cluster.owned("sideeffects", args.run),
    )
    if ctx.out.raw:
        ctx.out.obj(as_list([body, *attempts, *checkpoints, *effects]))
        return EXIT_OK
    run = Run.model_validate(body)
    live = sorted((Checkpoint.model_validate(c) for c in checkpoints), key=lambda c: c.spec.sequence)
    # A finished Run compacted: its other Checkpoints are named by its index in the state store.
    every, note = await finished.indexed_checkpoints(ctx.cluster.api, run, live)
    if note:
        ctx.out.note(f"Run {args.run} was compacted: {note}")
    text = timeline.describe(
        run,
        sorted((Attempt.model_validate(a) for a in attempts), key=lambda a: a.spec.number),
        every,
        [SideEffect.model_validate(e) for e in effects],
        ctx.now(),
        where=ctx.where,
    )
    ctx.out.text(text)
    return EXIT_OK


async def report(ctx: Context, args: argparse.Namespace) -> int:
    body = await ctx.cluster.run(args.run)
    effects = await ctx.cluster.owned("sideeffects", args.run)
    if ctx.out.raw:
        ctx.out.obj(as_list([body, *effects]))
        return EXIT_OK
    run = Run.model_validate(body)
    stopped = run.status.phase in STOPPED_PHASES
    records = [SideEffect.model_validate(e) for e in effects]
    if run.status.report is not None:
        listed, omitted = run.status.report.effects, run.status.report.omitted
    else:
        listed, omitted = formats.reported_effects(records), 0
    undoable = {str(r.metadata.name) for r in records if compensable(r)}
    text = formats.report_text(run, listed, omitted, live=not stopped, where=ctx.where, compensable=undoable)
    ctx.out.text(text)
    return EXIT_OK
