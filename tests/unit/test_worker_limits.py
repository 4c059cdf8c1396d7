"""Byte budgets the SDK enforces before any request is made: a refusal is a PermanentError that says
what to do, and nothing reaches the API server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from agentrun.api import budgets
from agentrun.worker.context import Context
from agentrun.worker.errors import PermanentError
from agentrun.worker.identity import Identity
from agentrun.worker.session import Session
from unit.factories import make_attempt, make_run, run_status

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
    """Stands where the API client would be: a check under test must refuse before any request."""

    def custom_path(self, *parts: object) -> str:
        return "/unused"

    def lease_path(self, *parts: object) -> str:
        return "/unused"

    def __getattr__(self, verb: str) -> Any:
        raise AssertionError(f"the SDK sent a request ({verb}) for a value over its budget")


def blob(size: int) -> dict[str, str]:
    """A JSON object of exactly `size` stored bytes."""
    return {"blob": "x" * (size - len('{"blob":""}'))}


Write = Callable[[Session, Any], Coroutine[Any, Any, Any]]


def commit(session: Session, value: Any) -> Coroutine[Any, Any, Any]:
    return session.commit(value)


def checkpoint(session: Session, value: Any) -> Coroutine[Any, Any, Any]:
    return session.save_checkpoint(value, "big", None)


def interrupt(session: Session, value: Any) -> Coroutine[Any, Any, Any]:
    run = make_run(run_status("Running", current=1))
    return Context(session, run, make_attempt(1), None).interrupt(prompt="approve?", schema=value)


CASES: dict[str, tuple[Write, int, str]] = {
    "result": (commit, budgets.RESULT_BUDGET, "the result is"),
    "checkpoint-state": (checkpoint, budgets.CHECKPOINT_STATE_BUDGET, "the checkpoint state is"),
    "interrupt-schema": (interrupt, budgets.ACCEPTED_SCHEMA_BUDGET, "the interrupt's schema is"),
}


@pytest.mark.parametrize(("write", "budget", "what"), CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("over", [1, 1000], ids=["one-byte-over", "far-over"])
def test_a_value_over_its_budget_is_refused_before_sending(
    write: Write, budget: int, what: str, over: int
) -> None:
    session = Session(NoApi(), ME)  # type: ignore[arg-type]
    value = blob(budget + over)

    with pytest.raises(PermanentError) as refused:
        asyncio.run(write(session, value))

    assert str(refused.value).startswith(f"{what} {budget + over} bytes of JSON, over its budget of {budget}")
    assert "store large data elsewhere" in str(refused.value) or "smaller answer" in str(refused.value)


@pytest.mark.parametrize(("write", "budget", "what"), CASES.values(), ids=CASES.keys())
def test_a_value_at_its_budget_is_sent(write: Write, budget: int, what: str) -> None:
    session = Session(NoApi(), ME)  # type: ignore[arg-type]

    with pytest.raises(AssertionError, match="the SDK sent a request"):
        asyncio.run(write(session, blob(budget)))
