"""`fork SRC --checkpoint ID --name NEW`: a new Run that continues from another Run's State checkpoint
(spec.forkFrom), with the source's agent and settings; the operator copies the checkpoint and gives the
fork the side effects the source had made by then, so none it confirmed is executed again."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentrun.api import API_VERSION
from agentrun.cli.commands.common import read_run
from agentrun.cli.commands.watch import follow
from agentrun.cli.context import Context
from agentrun.cli.errors import CliError, describe_api_error
from agentrun.kubeapi import ApiError

# The source's control requests and cancel belong to the source: a fork starts with none of them.
NOT_INHERITED = (
    "cancelEpoch",
    "cancelRequest",
    "resume",
    "retryRequest",
    "pause",
    "compensateRequest",
    "forkFrom",
)


def fork_body(source: dict[str, Any], name: str, checkpoint: str, input_value: Any = None) -> dict[str, Any]:
    """The fork's manifest: the source's spec without its requests, forkFrom naming the checkpoint."""
    spec = {k: v for k, v in (source.get("spec") or {}).items() if k not in NOT_INHERITED}
    if input_value is not None:
        spec["input"] = input_value
    spec["forkFrom"] = {"run": source["metadata"]["name"], "checkpointId": checkpoint}
    return {"apiVersion": API_VERSION, "kind": "Run", "metadata": {"name": name}, "spec": spec}


async def fork(ctx: Context, args: argparse.Namespace) -> int:
    body, run = await read_run(ctx, args.run)
    checkpoint = args.checkpoint or run.status.latest_checkpoint
    if not checkpoint:
        raise CliError(f"run {args.run} has no checkpoint yet: name one with --checkpoint; nothing created")
    try:
        input_value = json.loads(args.input) if args.input else None
    except ValueError as exc:
        raise CliError(f"--input is not JSON ({exc}); nothing created") from None
    manifest = fork_body(body, args.name, checkpoint, input_value)
    try:
        created = await ctx.cluster.api.create(ctx.cluster.path("runs"), manifest)
    except ApiError as exc:
        raise CliError(describe_api_error(exc, f"cannot fork run {args.run}")) from None
    if ctx.out.raw:
        ctx.out.obj(created)
    ctx.out.text(f"run {args.name} created: forked from run {args.run} at checkpoint {checkpoint}")
    return await follow(ctx, args.name, args.timeout) if args.wait else 0
