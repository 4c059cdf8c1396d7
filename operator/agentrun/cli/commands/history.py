"""`history` and `describe --archived`: Runs that finished, were archived to the state store and deleted
from the cluster, read from the store's archive index (one listing and a read per chain of entries, not
one read per archive) and from their archives, verified against the digest the index records.

The store is the one AGENTRUN_STATE_STORE_URL names, with its credentials in the environment, or else the
one the namespace's read-only Secret names, read with the user's own Kubernetes credentials (cli.store), as
for `state`. `history -A` needs credentials that see every namespace's bucket (the environment's)."""

from __future__ import annotations

import argparse
from typing import Any

from agentrun.api import Attempt, Checkpoint, Run, SideEffect, Usage
from agentrun.cli import formats, timeline
from agentrun.cli.context import Context
from agentrun.cli.errors import EXIT_OK, CliError
from agentrun.cli.store import open_store
from agentrun.statestore import StateStoreError
from agentrun.statestore import archives as stored


async def history(ctx: Context, args: argparse.Namespace) -> int:
    what = "the history of archived Runs"
    store = await open_store(what, ctx.cluster.api, ctx.namespace)
    try:
        namespaces = await stored.archived_namespaces(store) if args.all_namespaces else [ctx.namespace]
        entries = [entry for ns in namespaces for entry in await stored.archived_runs(store, ns)]
    except StateStoreError as exc:
        raise CliError(f"the archive index: {exc}") from None
    if ctx.out.raw:
        ctx.out.obj({"apiVersion": "v1", "kind": "List", "items": [e.to_json() for e in entries]})
        return EXIT_OK
    if not entries:
        where = "any namespace" if args.all_namespaces else f"namespace {ctx.namespace}"
        ctx.out.note(f"No archived runs in {where}.")
        return EXIT_OK
    headers = ["NAMESPACE", "NAME", "UID", "PHASE", "CREATED", "FINISHED", "ARCHIVED", "ATTEMPTS", "USAGE"]
    rows = [
        [
            e.namespace,
            e.name,
            e.uid,
            e.phase,
            e.created_time,
            e.finished_time,
            e.archived_time,
            e.attempts,
            _usage(e.usage),
        ]
        for e in entries
    ]
    ctx.out.text(formats.table(headers, rows))
    return EXIT_OK


async def describe_archived(ctx: Context, args: argparse.Namespace) -> int:
    """The timeline `describe` shows, of an archived Run (the latest of that name, or the one with
    --uid), read from its archive and verified."""
    store = await open_store(f"the archive of Run {args.run}", ctx.cluster.api, ctx.namespace)
    try:
        entry, document = await stored.read_archive(store, ctx.namespace, args.run, args.uid)
    except LookupError as exc:
        raise CliError(str(exc)) from None
    except StateStoreError as exc:
        raise CliError(f"the archive of Run {args.run}: {exc}") from None
    if ctx.out.raw:
        ctx.out.obj(document)
        return EXIT_OK
    objects: dict[str, list[dict[str, Any]]] = {
        kind: list(document.get(kind) or []) for kind in ("attempts", "checkpoints", "sideEffects")
    }
    text = timeline.describe(
        Run.model_validate(document["object"]),
        sorted((Attempt.model_validate(a) for a in objects["attempts"]), key=lambda a: a.spec.number),
        sorted((Checkpoint.model_validate(c) for c in objects["checkpoints"]), key=lambda c: c.spec.sequence),
        [SideEffect.model_validate(e) for e in objects["sideEffects"]],
        ctx.now(),
        where=ctx.where,
        archived=f"{entry.archived_time} (uid {entry.uid}; sha256 {entry.sha256}, verified)",
    )
    ctx.out.text(text)
    return EXIT_OK


def _usage(usage: Any) -> str | None:
    if not usage:
        return None
    return formats.usage_line(Usage.model_validate(usage))
