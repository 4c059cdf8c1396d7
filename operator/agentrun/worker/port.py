"""ctx.store: the SDK's public port for framework integrations (agentrun.integrations) that keep their
own Checkpoints and requests, such as the LangGraph checkpointer. It offers what ctx.checkpoint and
ctx.interrupt are made of: the Attempt's client, its resume point, the Run as last seen, and the fenced
status write with the refusals it classifies. Integrations use this, never the Session behind it."""

from __future__ import annotations

from typing import Any

from agentrun.api import Attempt, Run
from agentrun.clock import Clock
from agentrun.core import interrupts
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.worker.blobs import RunBlobs
from agentrun.worker.session import Session


def answered_request(run: Run, attempt: Attempt) -> str | None:
    """The id of the request this Attempt brings the answer to (core.interrupts.answered)."""
    answer = interrupts.answered(run, attempt)
    return answer.request_id if answer else None


class RunPort:
    """The Attempt's access to its Run: reads, and writes of official Run state under the Attempt's
    fences (lease epoch, cancel epoch), as ctx.checkpoint makes them."""

    def __init__(self, session: Session) -> None:
        self._session = session

    @property
    def api(self) -> KubeApi:
        """The Attempt's API client: create and read the Run's Checkpoints with it (immutable objects
        owned by the Run; the Run's own status is written through fenced_status_write only)."""
        return self._session.api

    @property
    def resume_from(self) -> str | None:
        """The name of the Checkpoint this Attempt continues from (None on a fresh start)."""
        return self._session.me.resume_from

    @property
    def clock(self) -> Clock:
        """The Attempt's clock (what its record times and waits are read from): an integration reads the
        time from it, so that a test's fake clock reaches it too."""
        return self._session.clock

    @property
    def run(self) -> Run | None:
        """The newest Run this worker read or wrote (None before the first)."""
        return self._session.run

    async def blobs(self) -> RunBlobs | None:
        """This Run's blobs in the agent-state store: `put(value)` returns the reference to record in a
        fenced object, `get(reference)` the value read back and verified (StateUnverifiable otherwise).
        None when the Pod has no store configured: keep values inline then."""
        return await self._session.run_blobs()

    async def read_run(self) -> Run:
        """The Run as stored now (a read)."""
        return await self._session.read_run()

    async def read_attempt(self) -> Attempt:
        """This worker's Attempt (from the Pod's annotations, or read when they cannot say it all)."""
        return await self._session.read_attempt()

    async def answered_request(self) -> str | None:
        """The id of the request this Attempt brings the answer to, if it continues after one."""
        run = self._session.run or await self._session.read_run()
        return answered_request(run, await self._session.read_attempt())

    async def ledger_mark(self) -> int:
        """The Run's ledger as it stands now: the highest SideEffect ledgerSequence opened so far (0: none),
        as ctx.checkpoint records it in a State checkpoint's spec.ledgerMark. A fork from a checkpoint
        inherits exactly its source's records up to this mark, so an integration records it on every
        State checkpoint it saves (one read per Attempt, then counted here)."""
        return await self._session.ledger_position()

    async def fenced_status_write(self, patch: dict[str, Any], what: str) -> Run:
        """Writes `patch` into the Run's status if this Attempt still holds the Run (its lease epoch and
        cancel epoch), as ctx.checkpoint moves status.latestCheckpoint; returns the Run written. A lost
        fence raises (and is recorded on the Attempt); `what` names the write in errors."""
        return await self._session.fenced_status_write(patch, what)

    async def raise_refusal(self, exc: ApiError, what: str) -> None:
        """For a write of the integration's own that the API server refused: raises the SDK's error for
        a lost fence or a write this worker may never make; returns when the refusal names no cause
        (the caller then raises `exc` itself)."""
        await self._session.raise_refusal(exc, what)
