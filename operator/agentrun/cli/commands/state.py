"""`state`: a Run's saved state or result, as the agent reads it: inline, or fetched from the agent-state
store and verified (size and sha256 against the reference the fenced object records). Read-only.

The store is the one AGENTRUN_STATE_STORE_URL names, with its credentials in the environment, or else the
one the namespace's read-only Secret names, read with the user's own Kubernetes credentials (cli.store)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from agentrun.api import BlobRef, Checkpoint, Run
from agentrun.cli import formats
from agentrun.cli.commands import finished
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_OK, CliError
from agentrun.cli.store import open_store
from agentrun.kubeapi import KubeApi
from agentrun.statestore import BlobRef as StoredRef
from agentrun.statestore import StateStoreError


async def state(ctx: Context, args: argparse.Namespace) -> int:
    run = Run.model_validate(await ctx.cluster.run(args.run))
    inline: Any
    ref: BlobRef | None
    if args.result:
        if run.status.result_ref is None and run.status.result is None:
            raise CliError(f"Run {args.run} has no result (phase {run.status.phase or 'Pending'})")
        what = f"the result of Run {args.run}"
        inline, ref = run.status.result, run.status.result_ref
    else:
        checkpoint_id = args.checkpoint or run.status.latest_checkpoint
        if not checkpoint_id:
            raise CliError(f"Run {args.run} has saved no checkpoint yet")
        body = await ctx.cluster.api.get(ctx.cluster.path("checkpoints", checkpoint_id))
        # A finished Run's superseded Checkpoints are in its index in the store (status.checkpointIndex).
        found = Checkpoint.model_validate(body) if body is not None else None
        if found is None and run.status.checkpoint_index is not None:
            found = await finished.indexed_checkpoint(ctx.cluster.api, run, checkpoint_id)
        if found is None:
            raise CliError(f'checkpoint "{checkpoint_id}" not found in namespace "{ctx.namespace}"')
        checkpoint = found
        if checkpoint.spec.run_name != args.run:
            owner = checkpoint.spec.run_name
            raise CliError(f"checkpoint {checkpoint_id} belongs to Run {owner}, not {args.run}")
        what = f"the state of checkpoint {checkpoint_id}"
        inline, ref = checkpoint.spec.state, checkpoint.spec.state_ref
    value = inline if ref is None else await fetch(ctx.cluster.api, ctx.namespace, ref, what)
    if ref is not None:
        ctx.out.note(f"{what}: {formats.stored_in(ref)}, verified")
    if ctx.out.raw:
        ctx.out.obj(value)
    else:
        ctx.out.text(json.dumps(value, indent=2, ensure_ascii=False))
    return EXIT_OK


async def fetch(api: KubeApi, namespace: str, ref: BlobRef, what: str) -> Any:
    """The value a reference names, read from the store and verified; a clear error when it cannot be."""
    store = await open_store(f"{what} ({formats.stored_in(ref)})", api, namespace)
    try:
        data = await store.get(StoredRef(ref.key, ref.sha256, ref.size))
    except StateStoreError as exc:
        raise CliError(f"{what}: {exc}") from None
    try:
        return json.loads(data)
    except ValueError:
        raise CliError(f"{what}: the blob {ref.key} is not JSON") from None
