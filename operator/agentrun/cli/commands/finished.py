"""What a finished Run keeps outside the API server, read back: its Checkpoint index (status.checkpointIndex,
for `describe` and `state`) and its Attempts' log tails (`logs`). Both are in the agent-state store that
AGENTRUN_STATE_STORE_URL names, or the namespace's read-only Secret (cli.store), and verified."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agentrun.api import Attempt, BlobRef, Checkpoint, Run, attempt_name
from agentrun.cli import formats
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_OK, CliError
from agentrun.cli.store import open_store
from agentrun.core.pods import AGENT_CONTAINER
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.statestore import BlobRef as StoredRef
from agentrun.statestore import StateStoreError
from agentrun.statestore.checkpoint_index import as_checkpoint, decode_index


async def read_blob(api: KubeApi, namespace: str, ref: BlobRef, what: str) -> bytes:
    """A blob's bytes, verified; a clear error when the store is not configured or cannot answer."""
    store = await open_store(f"{what} ({formats.stored_in(ref)})", api, namespace)
    try:
        return await store.get(StoredRef(ref.key, ref.sha256, ref.size, bool(ref.links)))
    except StateStoreError as exc:
        raise CliError(f"{what}: {exc}") from None


async def index_entries(api: KubeApi, run: Run) -> list[dict[str, Any]]:
    """The entries of a compacted Run's Checkpoint index (empty when it has none)."""
    ref = run.status.checkpoint_index
    if ref is None:
        return []
    what = f"the Checkpoint index of Run {run.metadata.name}"
    data = await read_blob(api, str(run.metadata.namespace), ref, what)
    try:
        return decode_index(data)
    except ValueError as exc:
        raise CliError(f"the Checkpoint index of Run {run.metadata.name}: {exc}") from None


async def indexed_checkpoints(
    api: KubeApi, run: Run, live: list[Checkpoint]
) -> tuple[list[Checkpoint], str | None]:
    """The Run's Checkpoints: those still in the API server and, for a compacted Run, those its index
    names (without their state: `state --checkpoint ID` reads one). A note when the index cannot be read."""
    if run.status.checkpoint_index is None:
        return live, None
    seen = {str(c.metadata.name) for c in live}
    ns, name = str(run.metadata.namespace), str(run.metadata.name)
    try:
        entries = await index_entries(api, run)
    except CliError as exc:  # the timeline is still worth showing: say what is missing from it
        return live, f"its other Checkpoints could not be listed: {exc}"
    found = [Checkpoint.model_validate(as_checkpoint(e, name, ns)) for e in entries if e["name"] not in seen]
    return sorted([*live, *found], key=lambda c: (c.spec.sequence, str(c.metadata.name))), None


async def indexed_checkpoint(api: KubeApi, run: Run, checkpoint_id: str) -> Checkpoint | None:
    """One Checkpoint of a compacted Run, from its index, with its inline state read back."""
    entry = next((e for e in await index_entries(api, run) if e.get("id") == checkpoint_id), None)
    if entry is None:
        return None
    state = None
    if "inlineStateRef" in entry:
        ref = BlobRef.model_validate(entry["inlineStateRef"])
        data = await read_blob(
            api, str(run.metadata.namespace), ref, f"the state of checkpoint {checkpoint_id}"
        )
        state = render_json(data, f"the state of checkpoint {checkpoint_id}")
    ns, name = str(run.metadata.namespace), str(run.metadata.name)
    return Checkpoint.model_validate(as_checkpoint(entry, name, ns, state))


def render_json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise CliError(f"{what}: the blob is not JSON") from None


# ---- logs ---------------------------------------------------------------------------------------------


async def logs(ctx: Context, args: argparse.Namespace) -> int:
    """An Attempt's log: its live Pod's, or the tail kept when its Pod was deleted (spec.podGC)."""
    run = Run.model_validate(await ctx.cluster.run(args.run))
    number = args.attempt or run.status.current_attempt
    if not number:
        raise CliError(f"Run {args.run} has no Attempt yet")
    name = attempt_name(args.run, number)
    body = await ctx.cluster.api.get(ctx.cluster.path("attempts", name))
    if body is None:
        raise CliError(f'Attempt {number} of Run {args.run} ("{name}") not found in "{ctx.namespace}"')
    attempt = Attempt.model_validate(body)
    live = await pod_log(ctx, name)
    if live is not None:
        write(live)
        return EXIT_OK
    tail = attempt.status.log_tail
    if tail is None:
        raise CliError(f"the Pod of {name} is gone and no tail of its log was kept")
    if tail.ref is None and tail.text is None:
        raise CliError(f"the Pod of {name} is gone; its log could not be kept: {tail.unavailable}")
    earlier = " (earlier lines not kept)" if tail.truncated else ""
    ctx.out.note(f"{name}: the tail of its log, kept when its Pod was deleted{earlier}")
    if tail.ref is not None:
        write(await read_blob(ctx.cluster.api, ctx.namespace, tail.ref, f"the log tail of {name}"))
    else:
        write((tail.text or "").encode())
    return EXIT_OK


async def pod_log(ctx: Context, pod: str) -> bytes | None:
    """The live Pod's log through the API server; None when the Pod is gone."""
    path = ctx.cluster.api.core_path("pods", ctx.namespace, pod, "log")
    try:
        return await ctx.cluster.api.read_text(path, {"container": AGENT_CONTAINER})
    except ApiError as exc:
        if exc.not_found:
            return None
        raise CliError(f"the log of Pod {pod}: {exc}") from None


def write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
