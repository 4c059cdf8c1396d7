"""What an agent sees: its identity, its input, the state it resumes from, and the fenced operations."""

from __future__ import annotations

from typing import Any

from agentrun.api import Checkpoint, Run
from agentrun.worker.session import Session


class Context:
    def __init__(self, session: Session, run: Run, resumed_from: Checkpoint | None) -> None:
        self._session = session
        self._run = run
        self._latest = resumed_from
        me = session.me
        self.run_name = me.run
        self.namespace = me.namespace
        self.attempt = me.attempt
        self.attempt_number = me.attempt_number
        self.lease_epoch = me.lease_epoch
        self.cancel_epoch = me.cancel_epoch
        self.input: Any = run.spec.input
        self.state: Any = resumed_from.spec.state if resumed_from else None
        self.resumed = resumed_from is not None
        self.resume_value: Any = None

    async def checkpoint(self, state: Any, step: str | None = None) -> str:
        """Saves `state` as the Run's latest Checkpoint (fenced): the next Attempt continues from it."""
        self._latest = await self._session.save_checkpoint(state, step, self._latest)
        self.state = state
        return self._latest.spec.id
