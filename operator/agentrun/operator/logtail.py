"""The tail of an ended Attempt's Pod log, kept before the Pod is deleted (Run spec.podGC): read through
the API server (pods/log: the kubelet's containerLogs), bounded, then stored as a blob (a state store) or
kept inline, short (without one: Attempt status.logTail.text)."""

from __future__ import annotations

from typing import Any, Final

from agentrun.api import Run
from agentrun.api.attempt import LOG_TAIL_INLINE_BYTES, LOG_TAIL_LINES, LOG_TAIL_STORED_BYTES
from agentrun.core.pods import AGENT_CONTAINER
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.statestore import BlobStore

# What the kubelet is asked for at most: the last LOG_TAIL_LINES lines, but never more bytes than this
# (a log of very long lines), of which the last LOG_TAIL_STORED_BYTES are kept.
READ_LIMIT_BYTES: Final = 4 * LOG_TAIL_STORED_BYTES


def tail(data: bytes, limit: int) -> tuple[bytes, bool]:
    """The last `limit` bytes of `data`, starting at a line when a line starts within them; and whether
    anything was cut off."""
    if len(data) <= limit:
        return data, False
    kept = data[-limit:]
    newline = kept.find(b"\n")
    if 0 <= newline < len(kept) - 1:
        kept = kept[newline + 1 :]
    return kept, True


async def read_log(api: KubeApi, namespace: str, pod: str) -> bytes | str | None:
    """The last lines of the agent container's log; None when the Pod is gone; why, when the API server
    says there is no log to read (400: e.g. the Pod never ran on a node). Any other error is raised: the
    tail is read again later (a node that does not answer now)."""
    query = {
        "container": AGENT_CONTAINER,
        "tailLines": str(LOG_TAIL_LINES),
        "limitBytes": str(READ_LIMIT_BYTES),
    }
    try:
        return await api.read_text(api.core_path("pods", namespace, pod, "log"), query)
    except ApiError as exc:
        if exc.not_found:
            return None
        if exc.status == 400:
            return exc.message[:1024] or "the API server has no log of this Pod"
        raise


async def log_tail(data: bytes, run: Run, store: BlobStore | None, now: str) -> dict[str, Any]:
    """Attempt status.logTail for the log read: in the store when there is one, else a short tail inline.
    Truncated when more was written than is kept (or the read stopped at its line count)."""
    namespace, uid = str(run.metadata.namespace), str(run.metadata.uid)
    at_line_limit = data.count(b"\n") >= LOG_TAIL_LINES
    if store is not None:
        kept, cut = tail(data, LOG_TAIL_STORED_BYTES)
        ref = await store.put(namespace, uid, kept)
        return {"ref": ref.to_json(), "truncated": cut or at_line_limit, "time": now}
    kept, cut = tail(data, LOG_TAIL_INLINE_BYTES)
    text = kept.decode(errors="replace")
    while len(text.encode()) > LOG_TAIL_INLINE_BYTES:  # a replacement character is 3 bytes
        text = text[1:]
    return {"text": text, "truncated": cut or at_line_limit, "time": now}
