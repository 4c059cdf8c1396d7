"""ctx.side_effect: external actions through the ledger, executed at most once per idempotency key."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrun.api import API_VERSION, SideEffect, SideEffectState
from agentrun.api.budgets import SIDE_EFFECT_RESULT_BUDGET, over_budget
from agentrun.core.fence import fence_violation
from agentrun.core.ledger import Step, after_lookup, next_step, request_digest, side_effect_name
from agentrun.kubeapi import ApiError
from agentrun.worker.errors import FenceRejected, PermanentError, TransientError, UnknownSideEffect
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


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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

    async def _set_state(
        self, record: SideEffect, state: SideEffectState, *, message: str, **fields: Any
    ) -> SideEffect:
        history = [
            h.to_api() for h in (record.status.history if record.status and record.status.history else [])
        ]
        history = [
            *history,
            {"state": state.value, "time": _now(), "attempt": self.me.attempt, "message": message},
        ]
        status = {
            "state": state.value,
            "attempt": self.me.attempt,
            "leaseEpoch": self.me.lease_epoch,
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
    ) -> Effect:
        name = side_effect_name(self.me.run, key)
        digest = request_digest(tool, target)
        record = await self._record(name)
        decision = next_step(record, digest)
        if record is None:
            record, created = await self._create(
                name,
                tool=tool,
                key=key,
                target=target,
                digest=digest,
                compensation=compensation,
                reversible=reversible,
                step=step,
            )
            if not created:  # another writer recorded it first: follow what its record says
                decision = next_step(record, digest)
        if decision == Step.REFUSE:
            raise PermanentError(
                f"side effect {name} ({tool}, key {key}) cannot run: its record says "
                f"{record.status.state if record.status else 'Pending'} or belongs to another request"
            )
        if decision == Step.REUSE:
            assert record.status is not None
            return self._effect(record, reference_of, executed_now=False)
        resolved_by = None
        if decision == Step.LOOK_UP:
            found: bool | None
            result: Any = None
            try:
                result = await _call(lookup, key) if lookup else None
                found = None if lookup is None else result is not None
            except Exception as exc:  # the external system could not tell
                log.warning("lookup of %s failed: %s", key, exc)
                found = None
            decision = after_lookup(found, lookup is not None)
            resolved_by = f"lookup by {self.me.attempt}"
            if decision == Step.RECONCILE:
                await self._set_state(
                    record, SideEffectState.UNKNOWN, message="outcome unknown; lookup could not tell"
                )
                raise UnknownSideEffect(f"{tool} with key {key}: outcome unknown; resolve SideEffect {name}")
            if decision == Step.REUSE:
                too_large = over_budget(f"the result of {tool}", result, SIDE_EFFECT_RESULT_BUDGET, SMALLER)
                confirmed = await self._set_state(
                    record,
                    SideEffectState.CONFIRMED,
                    message="found by lookup",
                    result=None if too_large else result,
                    externalReference=self._reference(result, reference_of),
                    resolvedBy=resolved_by,
                )
                _refuse_unrecorded(too_large)
                return self._effect(confirmed, reference_of, executed_now=False)
        return await self._execute(
            record,
            key,
            execute,
            reference_of=reference_of,
            resolved_by=resolved_by,
            unknown_on=UNKNOWN_OUTCOME + unknown_on,
        )

    async def _execute(
        self,
        record: SideEffect,
        key: str,
        execute: Callable[[str], Any],
        *,
        reference_of: Callable[[Any], str | None] | None,
        resolved_by: str | None,
        unknown_on: tuple[type[BaseException], ...],
    ) -> Effect:
        await self._check_fence()
        try:
            result = await _call(execute, key)
        except Exception as exc:
            if isinstance(exc, unknown_on):
                await self._set_state(record, SideEffectState.UNKNOWN, message=f"outcome unknown: {exc}")
                raise UnknownSideEffect(
                    f"{record.spec.tool} with key {key}: outcome unknown ({exc})"
                ) from exc
            if isinstance(exc, TransientError):
                raise  # the record stays Pending: a later Attempt looks the action up before trying again
            await self._set_state(record, SideEffectState.FAILED, message=f"failed: {exc}")
            raise
        extra: dict[str, Any] = {"resolvedBy": resolved_by} if resolved_by else {}
        too_large = over_budget(
            f"the result of {record.spec.tool}", result, SIDE_EFFECT_RESULT_BUDGET, SMALLER
        )
        confirmed = await self._set_state(
            record,
            SideEffectState.CONFIRMED,
            message="executed",
            result=None if too_large else result,
            externalReference=self._reference(result, reference_of),
            **extra,
        )
        _refuse_unrecorded(too_large)
        return self._effect(confirmed, reference_of, executed_now=True)

    async def _create(
        self,
        name: str,
        *,
        tool: str,
        key: str,
        target: str | None,
        digest: str,
        compensation: str | None,
        reversible: bool,
        step: str | None,
    ) -> tuple[SideEffect, bool]:
        spec: dict[str, Any] = {
            "runName": self.me.run,
            "tool": tool,
            "idempotencyKey": key,
            "requestDigest": digest,
            "compensation": compensation or "",
            "reversible": reversible,
        }
        if target:
            spec["target"] = target
        if step:
            spec["step"] = step
        body = {
            "apiVersion": API_VERSION,
            "kind": "SideEffect",
            "metadata": await self.session.owned_metadata(name),
            "spec": spec,
        }
        try:
            created = await self.session.api.create(self._path(), body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            existing = await self._record(name)
            assert existing is not None
            return existing, False
        record = SideEffect.model_validate(created)
        return await self._set_state(
            record, SideEffectState.PENDING, message="recorded before executing"
        ), True

    @staticmethod
    def _reference(result: Any, reference_of: Callable[[Any], str | None] | None) -> str | None:
        if reference_of is not None:
            return reference_of(result)
        if isinstance(result, dict):
            ref = result.get("reference") or result.get("id")
            return str(ref) if ref is not None else None
        return None

    def _effect(
        self, record: SideEffect, reference_of: Callable[[Any], str | None] | None, executed_now: bool
    ) -> Effect:
        status = record.status
        assert status is not None
        return Effect(
            name=str(record.metadata.name),
            reference=status.external_reference or self._reference(status.result, reference_of),
            result=status.result,
            state=status.state,
            executed_now=executed_now,
        )
