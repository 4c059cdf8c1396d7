"""Limits the SDK enforces before any request is made."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.worker.errors import PermanentError
from agentrun.worker.identity import Identity
from agentrun.worker.session import MAX_STATE_BYTES, Session

ME = Identity(
    run="r",
    namespace="ns",
    attempt="r-a1",
    lease_epoch=1,
    cancel_epoch=0,
    resume_from=None,
    termination_message_path="/dev/null",
)


class NoApi:
    """Stands where the API client would be: the checks under test must refuse before using it."""

    def custom_path(self, *parts: object) -> str:
        return "/unused"

    def lease_path(self, *parts: object) -> str:
        return "/unused"


def test_an_oversized_checkpoint_is_refused_with_a_clear_message() -> None:
    session = Session(NoApi(), ME)  # type: ignore[arg-type]
    state = {"blob": "x" * MAX_STATE_BYTES}
    with pytest.raises(PermanentError, match=r"checkpoint state is \d+ bytes, over 262144"):
        asyncio.run(session.save_checkpoint(state, "big", None))
