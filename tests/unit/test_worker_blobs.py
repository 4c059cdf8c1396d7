"""The SDK's use of the state store (worker.blobs, Session.stored_value/value_of) on a memory:// store:
a value over the inline threshold goes to the store and comes back verified; a blob replaced or gone is
StateUnverifiable naming its key, never a shorter value; a store that cannot answer is transient; no
store keeps everything inline within the byte budgets. The same against versitygw and the API server:
tests/integration/test_state_store_worker.py."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import obstore
import pytest
from obstore.store import MemoryStore

from agentrun.api import Checkpoint, FailureClass, budgets
from agentrun.api.budgets import stored_size
from agentrun.statestore import BlobStore, parse_store_url
from agentrun.statestore import StateUnverifiable as StoreStateUnverifiable
from agentrun.statestore import StoreUnavailable as StoreDown
from agentrun.worker import blobs
from agentrun.worker.context import Context
from agentrun.worker.errors import PermanentError, StateUnverifiable, StoreUnavailable, TransientError
from agentrun.worker.identity import Identity
from agentrun.worker.main import _termination
from agentrun.worker.session import Session
from unit.factories import make_attempt, make_run, run_status

ME = Identity(
    run="r",
    namespace="team-a",
    attempt="r-a1",
    lease_epoch=1,
    cancel_epoch=0,
    resume_from=None,
    termination_message_path="/dev/null",
)
RUN_UID = "3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34"


class NoApi:
    """Stands where the API client would be: what is under test here sends no request to it."""

    def custom_path(self, *parts: object) -> str:
        return "/unused"

    def lease_path(self, *parts: object) -> str:
        return "/unused"

    def __getattr__(self, verb: str) -> Any:
        raise AssertionError(f"the SDK sent a request ({verb}) to the API server")


def session_with(store: BlobStore | None) -> Session:
    session = Session(NoApi(), ME, state_store=store)  # type: ignore[arg-type]
    session.run = make_run(run_status("Running", current=1), metadata={"name": "r", "uid": RUN_UID})
    return session


def memory() -> tuple[BlobStore, MemoryStore]:
    raw = MemoryStore()
    return BlobStore(raw, parse_store_url("memory://state")), raw


def sized(size: int) -> dict[str, Any]:
    """A JSON object of exactly `size` stored bytes."""
    value: dict[str, Any] = {"blob": "x" * (size - len('{"blob":""}'))}
    assert stored_size(value) == size
    return value


def stored(session: Session, value: Any) -> tuple[Any, dict[str, Any] | None]:
    return asyncio.run(session.stored_value("the value", value, budgets.CHECKPOINT_STATE_BUDGET, "advice"))


def test_a_value_at_the_threshold_stays_inline_and_one_byte_more_goes_to_the_store() -> None:
    store, raw = memory()
    session = session_with(store)
    at = sized(blobs.INLINE_THRESHOLD)
    assert stored(session, at) == (at, None)
    assert obstore.list(raw).collect() == []  # nothing was put

    over = sized(blobs.INLINE_THRESHOLD + 1)
    inline, ref = stored(session, over)
    assert inline is None
    assert ref is not None
    data = blobs.encode(over)
    assert ref == {
        "key": f"state/team-a/{RUN_UID}/sha256/{hashlib.sha256(data).hexdigest()}",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }
    assert asyncio.run(session.value_of(None, ref, "the value")) == over


def test_a_large_state_round_trips_through_a_checkpoint_reference_whole() -> None:
    store, _ = memory()
    session = session_with(store)
    state = {"messages": [{"role": "tool", "content": f"{i}:" + "y" * 1000} for i in range(100)]}
    _, ref = stored(session, state)
    checkpoint = Checkpoint.model_validate(
        {
            "metadata": {"name": "r-a1-s1"},
            "spec": {
                "runName": "r",
                "id": "r-a1-s1",
                "sequence": 1,
                "attempt": "r-a1",
                "leaseEpoch": 1,
                "stateRef": ref,
            },
        }
    )
    assert checkpoint.spec.state is None
    assert asyncio.run(session.checkpoint_state(checkpoint)) == state


def test_a_replaced_blob_is_state_unverifiable_naming_its_key_never_another_state() -> None:
    store, raw = memory()
    session = session_with(store)
    _, ref = stored(session, sized(40_000))
    assert ref is not None
    obstore.put(raw, ref["key"], blobs.encode(sized(40_000 - 1)) + b" ")  # same size, other bytes
    with pytest.raises(StateUnverifiable, match=ref["key"]) as caught:
        asyncio.run(session.value_of(None, ref, "the state"))
    error = caught.value
    assert error.key == ref["key"]
    assert not error.missing
    # one class: the SDK's error is the store's too, and a deterministic failure with its reason
    assert isinstance(error, StoreStateUnverifiable)
    assert isinstance(error, PermanentError)
    report, code = _termination(error)
    assert report["class"] == FailureClass.DETERMINISTIC.value
    assert (report["reason"], code) == ("StateUnverifiable", 1)


def test_a_deleted_blob_is_state_unverifiable_and_says_it_is_missing() -> None:
    store, raw = memory()
    session = session_with(store)
    _, ref = stored(session, sized(20_000))
    assert ref is not None
    obstore.delete(raw, ref["key"])
    with pytest.raises(StateUnverifiable, match="no object at this key") as caught:
        asyncio.run(session.value_of(None, ref, "the state"))
    assert caught.value.missing
    assert caught.value.key == ref["key"]


def test_a_reference_without_a_configured_store_is_unverifiable_and_says_what_to_configure() -> None:
    store, _ = memory()
    _, ref = stored(session_with(store), sized(20_000))
    assert ref is not None
    with pytest.raises(StateUnverifiable, match="AGENTRUN_STATE_STORE_URL"):
        asyncio.run(session_with(None).value_of(None, ref, "checkpoint r-a1-s1"))


def test_without_a_store_everything_stays_inline_within_the_budgets() -> None:
    session = session_with(None)
    large = sized(100_000)
    assert stored(session, large) == (large, None)
    with pytest.raises(PermanentError, match="over its budget of 262144 bytes"):
        stored(session, sized(budgets.CHECKPOINT_STATE_BUDGET + 1))
    # what the SDK tells an agent over the budget names the store as the way out
    with pytest.raises(PermanentError, match="AGENTRUN_STATE_STORE_URL"):
        asyncio.run(session.save_checkpoint(sized(budgets.CHECKPOINT_STATE_BUDGET + 1), "big", None))


def test_a_store_that_cannot_answer_is_the_sdks_transient_error() -> None:
    error = blobs.as_sdk_error(StoreDown("get", "state/k", "connection refused"))
    assert isinstance(error, StoreUnavailable)
    assert isinstance(error, TransientError)
    assert error.key == "state/k"
    # also when an integration lets the store's own error reach the end of the Attempt
    report, code = _termination(StoreDown("put", "state/k", "503 Service Unavailable"))
    assert report["class"] == FailureClass.TRANSIENT.value
    assert code == 75


def test_the_store_comes_from_the_pods_environment_or_not_at_all() -> None:
    assert blobs.open_state_store({}) is None
    opened = blobs.open_state_store({"AGENTRUN_STATE_STORE_URL": "memory://state"})
    assert opened is not None
    assert opened.location.prefix == "state"
    with pytest.raises(PermanentError, match="AGENTRUN_STATE_STORE_URL"):
        blobs.open_state_store({"AGENTRUN_STATE_STORE_URL": "s3://key:secret@bucket/p"})


def test_a_context_never_resumes_a_stored_state_it_was_not_given() -> None:
    store, _ = memory()
    session = session_with(store)
    _, ref = stored(session, sized(20_000))
    checkpoint = Checkpoint.model_validate(
        {
            "metadata": {"name": "r-a1-s1"},
            "spec": {
                "runName": "r",
                "id": "r-a1-s1",
                "sequence": 1,
                "attempt": "r-a1",
                "leaseEpoch": 1,
                "stateRef": ref,
            },
        }
    )
    run = make_run(run_status("Running", current=2))
    with pytest.raises(ValueError, match="pass it as resumed_state"):
        Context(session, run, make_attempt(2), checkpoint)
    state = asyncio.run(session.checkpoint_state(checkpoint))
    assert Context(session, run, make_attempt(2), checkpoint, state).state == sized(20_000)


def test_integrations_reach_the_runs_blobs_through_ctx_store() -> None:
    from agentrun.worker import RunPort  # noqa: PLC0415 (the public port, as an integration imports it)

    store, _ = memory()
    blobs_of = asyncio.run(RunPort(session_with(store)).blobs())
    assert blobs_of is not None
    ref = asyncio.run(blobs_of.put({"channel": ["m"] * 10}))
    assert asyncio.run(blobs_of.get(ref)) == {"channel": ["m"] * 10}
    assert asyncio.run(RunPort(session_with(None)).blobs()) is None
