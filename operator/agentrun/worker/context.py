"""What an agent sees: its identity, its input, the state it resumes from, and the fenced operations."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jsonschema

from agentrun.api import Attempt, Checkpoint, InterruptReason, Run, SideEffectState
from agentrun.api.budgets import ACCEPTED_SCHEMA_BUDGET
from agentrun.core import ledger
from agentrun.core.ledger import side_effect_name
from agentrun.core.steps import StepRetry, journal_replays
from agentrun.worker.effects import Effect, Ledger
from agentrun.worker.errors import Interrupted, PermanentError
from agentrun.worker.session import Session, refuse_over_budget
from agentrun.worker.steps import Journal, run_step
from agentrun.worker.usage import UsageMeter

_KEEP = object()
APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "comment": {"type": "string", "maxLength": 1024}},
    "required": ["approved"],
}


SCHEMA_ADVICE = "ask for a smaller answer (a reference to large data), with a simpler schema"


class Context:
    def __init__(self, session: Session, run: Run, attempt: Attempt, resumed_from: Checkpoint | None) -> None:
        self._session = session
        self._ledger = Ledger(session)
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
        # True when this Attempt continues after a pause: observations made before it are stale, and
        # the agent must look at its world again.
        self._answering = answered_request(run, attempt)
        self.resumed = self._answering is not None
        self.resume_value: Any = attempt.spec.input if self.resumed else None
        self._answered = {i.request_id for i in run.status.inputs or []}
        self._usage = UsageMeter(session.write_usage)
        self._journal = Journal(
            session, journal_replays(attempt.spec.reason), resumed_from, answered_request(run, attempt)
        )

    # ---- checkpoints and interrupts ----------------------------------------------------------------

    async def checkpoint(self, state: Any, step: str | None = None) -> str:
        """Saves `state` as the Run's latest Checkpoint (fenced): the next Attempt continues from it.

        A checkpoint is a step boundary: if someone asked the Run to pause (spec.pause), the agent
        stops here as if it had called interrupt(reason="paused").
        """
        self._latest = await self._session.save_checkpoint(state, step, self._latest)
        self.state = state
        pause = self._session.run.spec.pause if self._session.run else None
        if pause and pause.request_id not in self._answered and pause.request_id != self._answering:
            await self._raise_interrupt(InterruptReason.PAUSED, pause.reason, None, None, pause.request_id)
        return self._latest.spec.id

    async def interrupt(
        self,
        reason: str = InterruptReason.INPUT_REQUIRED,
        prompt: str | None = None,
        schema: dict[str, Any] | None = None,
        expires_in: float | None = None,
        state: Any = _KEEP,
    ) -> Any:
        """Pauses the Run here until someone answers; returns the answer in the Attempt that resumes.

        Saves a Checkpoint (of `state`, or the latest state) and the typed request, then ends this
        Attempt and releases the worker. The Attempt that resumes runs the agent again from that
        Checkpoint, and this same call returns the accepted value instead of pausing again.
        """
        if self._answering is not None:
            value = self.resume_value
            self._answering = None  # one answer per resumed Attempt: a later interrupt pauses again
            if schema is not None:
                try:
                    jsonschema.validate(value, schema)
                except jsonschema.ValidationError as exc:
                    raise PermanentError(
                        f"the resume value does not match the request's schema: {exc.message}"
                    ) from None
            return value
        if schema is not None:  # before the checkpoint: the request could not be written after it
            refuse_over_budget("the interrupt's schema", schema, ACCEPTED_SCHEMA_BUDGET, SCHEMA_ADVICE)
        if state is not _KEEP:
            self.state = state
        await self._raise_interrupt(InterruptReason(reason), prompt, schema, expires_in, None)

    async def _raise_interrupt(
        self,
        reason: InterruptReason,
        prompt: str | None,
        schema: dict[str, Any] | None,
        expires_in: float | None,
        request_id: str | None,
    ) -> None:
        if self._latest is None or self._latest.spec.state != self.state:
            self._latest = await self._session.save_checkpoint(
                self.state, f"interrupt:{reason}", self._latest
            )
        request_id = request_id or f"{self.run_name}-r{self._latest.spec.sequence}"
        pending: dict[str, Any] = {
            "requestId": request_id,
            "reason": reason.value,
            "checkpointId": self._latest.spec.id,
        }
        if prompt:
            pending["prompt"] = prompt
        if schema is not None:
            pending["acceptedSchema"] = schema
        if expires_in:
            # The operator derives expiresAt on its own clock: this machine's clock may be off.
            pending["expiresInSeconds"] = max(1, math.ceil(expires_in))
        await self._session.fenced_status_write({"pendingRequest": pending}, f"input request {request_id}")
        raise Interrupted(request_id)

    # ---- side effects ------------------------------------------------------------------------------

    async def side_effect(
        self,
        tool: str,
        key: str,
        execute: Callable[[str], Any],
        *,
        target: str | None = None,
        lookup: Callable[[str], Any] | None = None,
        compensation: str | None = None,
        reversible: bool = False,
        step: str | None = None,
        reference_of: Callable[[Any], str | None] | None = None,
        unknown_on: tuple[type[BaseException], ...] = (),
        requires_approval: bool = False,
    ) -> Effect:
        """Runs an external action at most once per idempotency key, through the SideEffect ledger.

        `execute(key)` performs it and returns its result; `lookup(key)` returns that result if the
        action happened, None if it did not, and raises if it cannot tell. An exception from execute of
        a type in `unknown_on` (or a timeout or lost connection) means nobody knows whether the action
        happened: the record becomes Unknown and the Run waits for reconciliation.

        With `requires_approval`, the Run first waits for a person (an interrupt with reason
        auth_required, answered with {"approved": true}); the operator records the approval on the
        SideEffect.
        """
        if requires_approval:
            await self._approve(tool, key, target)
        with self._session.tracing.span("side effect", {"agentrun.tool": tool, "agentrun.key": key}):
            return await self._ledger.perform(
                tool=tool,
                key=key,
                target=target,
                execute=execute,
                lookup=lookup,
                compensation=compensation,
                reversible=reversible,
                step=step,
                reference_of=reference_of,
                unknown_on=unknown_on,
            )

    # ---- steps and usage ---------------------------------------------------------------------------

    async def step(
        self,
        name: str,
        fn: Callable[[], Any],
        *,
        retry: StepRetry | None = None,
        journal: bool = False,
        retry_on: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """Calls `fn()` (plain or async) and returns its result: the retry layer inside the Attempt.

        TransientError and RateLimited (and the exception types in `retry_on`) are retried here with
        capped, jittered backoff (`retry`, default StepRetry(): 3 tries), a rate limit's retry_after
        honoured; a cancel stops the wait at once. Each retry counts in usage.stepRetries; only a step out
        of tries fails the Attempt. With journal=True the result (JSON) is recorded, and an Attempt that
        continues after a crash, a lease loss or a retry returns it instead of calling fn again; never one
        that continues after an answer or a pause. A step is a step boundary: a requested pause is
        honoured before it.
        """
        await self._boundary()
        self._journal.moved_to(self._latest)
        return await run_step(
            self._session,
            journal=self._journal,
            usage=self._usage,
            name=name,
            fn=fn,
            retry=retry,
            journaled=journal,
            retry_on=retry_on,
        )

    def add_usage(
        self, input_tokens: int = 0, output_tokens: int = 0, cost_usd: float = 0.0, model_calls: int = 0
    ) -> None:
        """Adds to this Attempt's usage (in memory: written every few seconds at most, and at the end)."""
        self._usage.add(input_tokens, output_tokens, cost_usd, model_calls)

    async def _boundary(self) -> None:
        """A step boundary (before every step): where a requested pause is to be honoured."""

    async def _approve(self, tool: str, key: str, target: str | None) -> None:
        """Returns once the gated action is approved (now or before); raises if it was refused.

        The approval is an interrupt whose request id names the action's SideEffect. Its answer comes
        back as the input of the Attempt that resumes; the operator records it on the SideEffect (a Pod
        never writes an approval), so a later Attempt finds it there or on that Attempt."""
        record = await self._ledger.record_for(key)
        if record is not None and record.status is not None:
            done = record.status.state in (SideEffectState.CONFIRMED, SideEffectState.COMPENSATED)
            if done or record.status.approval is not None:
                return
        request_id = ledger.approval_request_id(side_effect_name(self.run_name, key))
        if self._answering == request_id:
            answer = self.resume_value
            self._answering = None
        else:
            answer = ledger.approval_answer(await self._session.read_attempts(), request_id)
        if answer is None:
            on = f" on {target}" if target else ""
            prompt = f'Approve {tool}{on} (idempotency key {key})? Answer {{"approved": true}} or false.'
            await self._raise_interrupt(
                InterruptReason.AUTH_REQUIRED, prompt, APPROVAL_SCHEMA, None, request_id
            )
        if not ledger.approved(answer):
            raise PermanentError(f"{tool} (key {key}) was not approved")


def answered_request(run: Run, attempt: Attempt) -> str | None:
    """The request this Attempt brings the answer to: named by a resume's reason; for an automatic retry
    that carries the answer on (spec.input, same Checkpoint), the newest input accepted for that
    Checkpoint."""
    if attempt.spec.reason.startswith("resume:"):
        return attempt.spec.reason.removeprefix("resume:")
    if attempt.spec.input is None or not attempt.spec.resume_from:
        return None
    for recorded in reversed(run.status.inputs or []):
        if recorded.checkpoint_id == attempt.spec.resume_from:
            return recorded.request_id
    return None
