"""ctx.side_effect: external actions through the ledger, executed at most once per idempotency key."""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrun.api import API_VERSION, RUN_LABEL, Resend, SendOutcome, SideEffect, SideEffectState
from agentrun.api.budgets import SIDE_EFFECT_RESULT_BUDGET, over_budget
from agentrun.core.fence import fence_violation
from agentrun.core.ledger import (
    REUSE,
    Answer,
    Decision,
    Step,
    StopReason,
    after_lookup,
    after_send,
    after_unknown,
    all_sends,
    backoff,
    deadline_of,
    foreign_record,
    next_step,
    references_seen,
    request_digest,
    side_effect_name,
    state_of,
)
from agentrun.kubeapi import ApiError
from agentrun.worker.blobs import fits_inline
from agentrun.worker.clock import timestamp
from agentrun.worker.errors import (
    ConflictingResult,
    FenceRejected,
    KeyReused,
    PermanentError,
    RateLimited,
    TransientError,
    UnknownSideEffect,
)
from agentrun.worker.session import Session

log = logging.getLogger("agentrun.worker")

# What an execute() that raised these cannot tell us: whether the action happened.
UNKNOWN_OUTCOME: tuple[type[BaseException], ...] = (TimeoutError, ConnectionError, asyncio.TimeoutError)


SMALLER = "return a reference (an id, a URI) to large data instead of the data"


def _refuse_unrecorded(too_large: str | None) -> None:
    """An action whose result exceeds its budget is still recorded as Confirmed (it happened), without
    its result; the Attempt then fails for good, since a later one could not reuse the result."""
    if too_large:
        raise PermanentError(f"{too_large} (the action happened and is Confirmed; its result was not kept)")


@dataclass(frozen=True)
class Effect:
    """The outcome of a side effect: its external reference and result, and the ledger state."""

    name: str
    reference: str | None
    result: Any
    state: SideEffectState
    executed_now: bool
    key: str = ""  # the idempotency key it was recorded under
    # The source's action, inherited by a forked Run (status.inheritedFrom): reused, never executed by it.
    inherited: bool = False


def _too_large(record: SideEffect, result: Any) -> str | None:
    return over_budget(f"the result of {record.spec.tool}", result, SIDE_EFFECT_RESULT_BUDGET, SMALLER)


@dataclass(frozen=True)
class _Action:
    """What the agent gave ctx.side_effect to send and to look up."""

    key: str
    execute: Callable[[str], Any]
    lookup: Callable[[str], Any] | None
    reference_of: Callable[[Any], str | None] | None
    unknown_on: tuple[type[BaseException], ...]


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """Coroutine functions are awaited; plain callables run in a thread, so a blocking client never
    stalls the lease renewals running beside the agent."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    value = await asyncio.to_thread(fn, *args)
    return await value if inspect.isawaitable(value) else value


class Ledger:
    def __init__(self, session: Session) -> None:
        self.session = session
        self.me = session.me

    def _path(self, name: str | None = None, status: bool = False) -> str:
        return self.session.api.custom_path(
            "sideeffects", self.me.namespace, name, "status" if status else None
        )

    async def record_for(self, key: str) -> SideEffect | None:
        return await self._record(side_effect_name(self.me.run, key))

    async def _record(self, name: str) -> SideEffect | None:
        """The Run's record of that name; one that is not the Run's is refused, never followed."""
        body = await self.session.api.get(self._path(name))
        if body is None:
            return None
        await self.session.check_own(body)
        return SideEffect.model_validate(body)

    async def records(self) -> list[SideEffect]:
        """Every SideEffect of the Run (one not the Run's, whatever its label says, is never used)."""
        run = self.session.run or await self.session.read_run()
        found = []
        async for page in self.session.api.list_pages(
            self._path(), label_selector=f"{RUN_LABEL}={self.me.run}"
        ):
            for item in page:
                if foreign_record(item, self.me.run, run.metadata.uid) is None:
                    found.append(SideEffect.model_validate(item))
        return found

    async def note(
        self, record: SideEffect, state: SideEffectState, message: str, **fields: Any
    ) -> SideEffect:
        """A state change by this Attempt of a record it did not execute (a settling lookup, a
        compensation): status.attempt keeps naming the Attempt that executed the action."""
        return await self._set_state(record, state, message=message[:1024], executed=False, **fields)

    async def _set_state(
        self,
        record: SideEffect,
        state: SideEffectState,
        *,
        message: str,
        executed: bool = True,
        **fields: Any,
    ) -> SideEffect:
        history = [
            h.to_api() for h in (record.status.history if record.status and record.status.history else [])
        ]
        history = [
            *history,
            {
                "state": state.value,
                "time": timestamp(self.session.clock),
                "attempt": self.me.attempt,
                "message": message,
            },
        ]
        status = {
            "state": state.value,
            **({"attempt": self.me.attempt, "leaseEpoch": self.me.lease_epoch} if executed else {}),
            "history": history[-20:],
            **fields,
        }
        written = await self.session.api.merge_patch(
            self._path(str(record.metadata.name), status=True), {"status": status}
        )
        return SideEffect.model_validate(written)

    async def _check_fence(self) -> None:
        """An action is external: re-check the fence right before it, as for a commit."""
        run = await self.session.read_run()
        if reason := fence_violation(run, self.me.lease_epoch, self.me.cancel_epoch):
            message = f"side effect not executed: this worker's epochs are stale ({reason})"
            await self.session.record_rejection(reason.value, message)
            raise FenceRejected(reason.value, message)

    async def perform(
        self,
        *,
        tool: str,
        key: str,
        target: str | None,
        execute: Callable[[str], Any],
        lookup: Callable[[str], Any] | None,
        compensation: str | None,
        reversible: bool,
        step: str | None,
        reference_of: Callable[[Any], str | None] | None,
        unknown_on: tuple[type[BaseException], ...] = (),
        request: Any = None,
        resend: Resend = Resend.NEVER,
        max_sends: int = 3,
        send_deadline_seconds: int = 300,
    ) -> Effect:
        name = side_effect_name(self.me.run, key)
        digest = request_digest(tool, target, request)
        record = await self._record(name)
        if record is None:
            spec = {
                "tool": tool,
                "idempotencyKey": key,
                "requestDigest": digest,
                "compensation": compensation or "",
                "reversible": reversible,
                "resend": Resend(resend).value,
                "maxSends": max_sends,
                "sendDeadlineSeconds": send_deadline_seconds,
                **({"target": target} if target else {}),
                **({"step": step} if step else {}),
            }
            record = await self._create(name, spec)
        action = _Action(key, execute, lookup, reference_of, UNKNOWN_OUTCOME + unknown_on)
        return await self._settle(record, digest, action)

    async def _settle(self, record: SideEffect, digest: str, action: _Action) -> Effect:
        """Applies the recovery rule (core.ledger) until the action is confirmed, refused or stopped."""
        decision = next_step(record, digest, self.session.clock.now())
        tries = 0  # sends and lookups of this Attempt, for the backoff
        while True:
            match decision.step:
                case Step.REFUSE:
                    text = f"side effect {record.metadata.name} ({record.spec.tool}, key {action.key}) "
                    if decision.reason == StopReason.KEY_REUSED:
                        raise KeyReused(text + decision.message)
                    raise PermanentError(text + f"cannot run: {decision.message}")
                case Step.REUSE:
                    return await self._effect(record, action.reference_of, executed_now=False)
                case Step.RECONCILE:
                    await self._stop(record, decision)
                    raise UnknownSideEffect(
                        f"{decision.reason}: {record.spec.tool} with key {action.key}: {decision.message}; "
                        f"resolve SideEffect {record.metadata.name}",
                        decision.reason.value if decision.reason else None,
                    )
                case Step.LOOK_UP:
                    tries += 1
                    record, decision, found = await self._look_up(record, action, tries)
                    if found:
                        return found
                case Step.EXECUTE:
                    tries += 1
                    record, decision, sent = await self._send(record, action, tries)
                    if sent:
                        return sent

    async def _look_up(
        self, record: SideEffect, action: _Action, tries: int
    ) -> tuple[SideEffect, Decision, Effect | None]:
        """The outcome is unknown: ask the external system by key (never send blindly)."""
        if state_of(record) == SideEffectState.PENDING:
            record = await self._write(record, SideEffectState.UNKNOWN, "outcome unknown: looking it up")
        if action.lookup is None:
            return record, after_unknown(record, False, self.session.clock.now()), None
        result: Any = None
        try:
            result = await _call(action.lookup, action.key)
            answer = Answer.ABSENT if result is None else Answer.FOUND
        except ConflictingResult as exc:
            log.warning("lookup of %s found a conflicting result: %s", action.key, exc)
            answer, result = Answer.CONFLICT, str(exc)
        except Exception as exc:  # the external system could not tell
            log.warning("lookup of %s failed: %s", action.key, exc)
            answer = Answer.CANNOT_TELL
        reference = self._reference(result, action.reference_of) if answer == Answer.FOUND else None
        decision = after_lookup(answer, record, self.session.clock.now(), reference)
        if answer == Answer.CONFLICT or (answer == Answer.FOUND and decision.step == Step.RECONCILE):
            said = decision.message + (f": {result}" if answer == Answer.CONFLICT else "")
            refs = sorted(references_seen(record) | ({reference} if reference else set()))
            conflict: dict[str, Any] = {"message": said[:1024], "time": timestamp(self.session.clock)}
            if refs:
                conflict["references"] = refs[:8]
            record = await self._write(
                record, SideEffectState.UNKNOWN, "conflicting answers", conflict=conflict
            )
            return record, decision, None
        if decision.step == Step.REUSE:
            confirmed = await self._confirm(record, result, reference, "found by lookup", by_lookup=True)
            return confirmed, decision, await self._effect(confirmed, action.reference_of, executed_now=False)
        if answer == Answer.ABSENT:
            record = await self._write(
                record,
                state_of(record),
                "not found by lookup: it did not happen",
                sends=self._last_send(record, SendOutcome.ABSENT, None),
            )
        elif decision.step == Step.LOOK_UP:
            await self.session.clock.sleep(self._wait(record, backoff(tries)))
        return record, decision, None

    async def _send(
        self, record: SideEffect, action: _Action, tries: int
    ) -> tuple[SideEffect, Decision, Effect | None]:
        """One send, recorded before it goes out: after a crash an in-flight send means "maybe"."""
        await self._check_fence()
        sends = [s.to_api() for s in all_sends(record)]
        operation = record.spec.operation_id or str(record.metadata.name)
        sends.append(
            {
                "sendId": f"{operation}-s{len(sends) + 1}",
                "attempt": self.me.attempt,
                "time": timestamp(self.session.clock),
            }
        )
        state = state_of(record)
        if state == SideEffectState.FAILED:  # resolved Absent by a person: a fresh round
            state = SideEffectState.PENDING
        record = await self._write(record, state, f"send {len(sends)}", sends=sends)
        try:
            result = await _call(action.execute, action.key)
        except asyncio.CancelledError:
            # A cancel during the send: nobody knows whether it took effect. Never leave it Pending.
            await asyncio.shield(
                self._write(
                    record,
                    SideEffectState.UNKNOWN,
                    "cancelled during the send: outcome unknown",
                    sends=self._last_send(record, SendOutcome.UNKNOWN, None, "cancelled"),
                )
            )
            raise
        except Exception as exc:
            return await self._send_failed(record, action, tries, exc)
        reference = self._reference(result, action.reference_of)
        # Re-sent after a lookup found it absent: the lookup resolved the Unknown record.
        by_lookup = state_of(record) == SideEffectState.UNKNOWN
        confirmed = await self._confirm(record, result, reference, "executed", by_lookup=by_lookup)
        return confirmed, REUSE, await self._effect(confirmed, action.reference_of, executed_now=True)

    async def _confirm(
        self, record: SideEffect, result: Any, reference: str | None, why: str, *, by_lookup: bool
    ) -> SideEffect:
        """Records the action Confirmed (its result too when it fits the record's budget), then refuses
        to go on with a result that could not be recorded."""
        # Over the inline threshold with a store configured: the result goes there first (a store that
        # cannot take it now fails this Attempt before the record says Confirmed; the next one looks
        # the action up by its key, as after a crash between the send and its confirmation).
        blobs = await self.session.run_blobs()
        ref = await blobs.put(result) if blobs is not None and not fits_inline(result) else None
        too_large = None if ref is not None else _too_large(record, result)
        extra: dict[str, Any] = {"resolvedBy": f"lookup by {self.me.attempt}"} if by_lookup else {}
        if ref is not None:
            extra["resultRef"] = ref
        confirmed = await self._write(
            record,
            SideEffectState.CONFIRMED,
            why,
            sends=self._last_send(record, SendOutcome.CONFIRMED, reference),
            result=None if too_large or ref is not None else result,
            externalReference=reference,
            **extra,
        )
        _refuse_unrecorded(too_large)
        return confirmed

    async def _send_failed(
        self, record: SideEffect, action: _Action, tries: int, exc: Exception
    ) -> tuple[SideEffect, Decision, Effect | None]:
        message = f"{type(exc).__name__}: {exc}"[:1024]
        if isinstance(exc, action.unknown_on):
            record = await self._write(
                record,
                SideEffectState.UNKNOWN,
                f"outcome unknown: {message}",
                sends=self._last_send(record, SendOutcome.UNKNOWN, None, message),
            )
            return record, after_send(Answer.NO_ANSWER, record, self.session.clock.now()), None
        if isinstance(exc, TransientError | RateLimited):
            # A definite failure: nothing happened, so the same key may go again, within the bounds.
            # A 429 never marks the record Failed for good.
            retry_after = exc.retry_after if isinstance(exc, RateLimited) else None
            delay = backoff(tries, retry_after)
            record = await self._write(
                record,
                state_of(record),
                f"send failed ({exc.failure_class}): {message}",
                sends=self._last_send(record, SendOutcome.FAILED, None, message),
            )
            decision = after_send(Answer.RETRYABLE, record, self.session.clock.now(), delay)
            if decision.step == Step.EXECUTE:
                await self.session.clock.sleep(delay)
            return record, decision, None
        await self._write(
            record,
            SideEffectState.FAILED,
            f"failed: {message}",
            sends=self._last_send(record, SendOutcome.FAILED, None, message),
        )
        raise exc

    async def _stop(self, record: SideEffect, decision: Decision) -> None:
        """Records why the ledger stopped. A record whose sends all failed definitely stays as it is
        (MaxSendsReached); any other stop means nobody can tell: Unknown."""
        state = state_of(record)
        if decision.reason != StopReason.MAX_SENDS and state == SideEffectState.PENDING:
            state = SideEffectState.UNKNOWN
        await self._write(record, state, f"{decision.reason}: {decision.message}")

    def _wait(self, record: SideEffect, seconds: float) -> float:
        """A backoff never sleeps past the send deadline."""
        deadline = deadline_of(record)
        if deadline is None:
            return seconds
        return max(0.0, min(seconds, (deadline - self.session.clock.now()).total_seconds()))

    @staticmethod
    def _last_send(
        record: SideEffect, outcome: SendOutcome, reference: str | None, message: str | None = None
    ) -> list[dict[str, Any]]:
        """status.sends with the outcome of the last send set (the one in flight, or the one a lookup
        settled)."""
        sends = [s.to_api() for s in all_sends(record)]
        if sends:
            sends[-1]["outcome"] = outcome.value
            if reference:
                sends[-1]["reference"] = reference
            if message:
                sends[-1]["message"] = message[:1024]
        return sends

    async def _write(
        self, record: SideEffect, state: SideEffectState, message: str, **fields: Any
    ) -> SideEffect:
        return await self._set_state(record, state, message=message[:1024], **fields)

    async def _create(self, name: str, spec: dict[str, Any]) -> SideEffect:
        """Records the intent (Pending, with the request digest and an operationId) before any send;
        another writer's record of the same name is followed instead."""
        body = {
            "apiVersion": API_VERSION,
            "kind": "SideEffect",
            "metadata": await self.session.owned_metadata(name),
            "spec": {
                "runName": self.me.run,
                "operationId": f"op-{uuid.uuid4().hex[:20]}",
                "ledgerSequence": await self.session.next_ledger_sequence(),
                **spec,
            },
        }
        try:
            created = await self.session.api.create(self._path(), body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            existing = await self._record(name)
            assert existing is not None
            return existing
        record = SideEffect.model_validate(created)
        return await self._set_state(record, SideEffectState.PENDING, message="recorded before the send")

    @staticmethod
    def _reference(result: Any, reference_of: Callable[[Any], str | None] | None) -> str | None:
        if reference_of is not None:
            return reference_of(result)
        if isinstance(result, dict):
            ref = result.get("reference") or result.get("id")
            return str(ref) if ref is not None else None
        return None

    async def _effect(
        self, record: SideEffect, reference_of: Callable[[Any], str | None] | None, executed_now: bool
    ) -> Effect:
        status = record.status
        assert status is not None
        # a large result is in the state store: read and verified, the same value to the agent
        result = await self.session.value_of(
            status.result, status.result_ref, f"the result of side effect {record.metadata.name}"
        )
        return Effect(
            name=str(record.metadata.name),
            reference=status.external_reference or self._reference(result, reference_of),
            result=result,
            state=status.state,
            executed_now=executed_now,
            key=record.spec.idempotency_key,
            inherited=status.inherited_from is not None,
        )
