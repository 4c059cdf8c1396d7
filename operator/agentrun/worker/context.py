"""What an agent sees: its identity, its input, the state it resumes from, and the fenced operations."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from agentrun.api import Attempt, Checkpoint, InterruptReason, Resend, Run, SideEffectState
from agentrun.api.budgets import ACCEPTED_SCHEMA_BUDGET
from agentrun.core import interrupts, ledger
from agentrun.core.ledger import side_effect_name
from agentrun.core.steps import StepRetry, journal_replays
from agentrun.worker.effects import Effect, Ledger
from agentrun.worker.errors import Interrupted, PermanentError, TransientError
from agentrun.worker.port import RunPort, answered_request
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
    def __init__(
        self,
        session: Session,
        run: Run,
        attempt: Attempt,
        resumed_from: Checkpoint | None,
        resumed_state: Any = _KEEP,
    ) -> None:
        """resumed_state: the state of `resumed_from` when the caller has read it (from the state store,
        verified: Session.checkpoint_state); by default its inline state."""
        self._session = session
        # The public port for framework integrations: fenced access to the Run (worker.RunPort).
        self.store = RunPort(session)
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
        if resumed_state is _KEEP:
            if resumed_from is not None and resumed_from.spec.state_ref is not None:
                raise ValueError("the checkpoint's state is in the state store: pass it as resumed_state")
            resumed_state = resumed_from.spec.state if resumed_from else None
        self.state: Any = resumed_state
        self._latest_state: Any = resumed_state  # the state self._latest saved
        # True on every Attempt that continues from a Checkpoint (an answer, a crash, a lease takeover,
        # a retry), and once an answer arrives within a hold: what the agent observed before is stale,
        # it must look at its world again. resume_reason says why (the Attempt's reason).
        self.resumed = resumed_from is not None
        self.resume_reason: str | None = interrupts.resume_reason(attempt)
        self._answering = interrupts.answered(run, attempt)  # the request this Attempt brings the answer to
        self.resume_value: Any = attempt.spec.input if self._answering else None
        self._answered = {i.request_id for i in run.status.inputs or []}
        self._approve_irreversible = bool(run.spec.approvals and run.spec.approvals.irreversible)
        self._usage = UsageMeter(session.write_usage, session.clock)
        self._journal = Journal(
            session, journal_replays(attempt.spec.reason), resumed_from, answered_request(run, attempt)
        )

    # ---- step boundaries ---------------------------------------------------------------------------

    async def _boundary(self, fresh: bool = True) -> None:
        """A step boundary (every checkpoint, step, side_effect and interrupt): progress (progress()); if
        someone asked the Run
        to pause (spec.pause), the agent stops here as if it had called interrupt(reason="paused"), from
        its latest Checkpoint. `fresh` reads the Run first; otherwise the newest Run seen (the watch,
        the last write) decides: a caller in a hot loop (ctx.step) may prefer that."""
        self._session.progress.report()
        run = await self._session.read_run() if fresh else (self._session.observed or self._session.run)
        pause = run.spec.pause if run else None
        if pause and interrupts.pause_due(pause.request_id, frozenset(self._answered), self._answering):
            await self._raise_interrupt(InterruptReason.PAUSED, pause.reason, None, None, pause.request_id)

    def progress(self) -> None:
        """Says the agent is alive and moving (spec.progressTimeoutSeconds): without progress for that
        long, the Attempt is stopped (ProgressTimeout, retried per policy). Costs no API request; every
        checkpoint, step, side_effect and interrupt counts as progress too."""
        self._session.progress.report()

    # ---- checkpoints and interrupts ----------------------------------------------------------------

    async def checkpoint(self, state: Any, step: str | None = None) -> str:
        """Saves `state` as the Run's latest Checkpoint (fenced): the next Attempt continues from it.

        A checkpoint is a step boundary: if someone asked the Run to pause (spec.pause), the agent
        stops here as if it had called interrupt(reason="paused").
        """
        self._latest = await self._session.save_checkpoint(state, step, self._latest)
        self.state = self._latest_state = state
        await self._boundary(fresh=False)  # its fenced write has just read the Run
        return self._latest.spec.id

    async def interrupt(  # noqa: PLR0917 (the public signature, kept positional)
        self,
        reason: str = InterruptReason.INPUT_REQUIRED,
        prompt: str | None = None,
        schema: dict[str, Any] | None = None,
        expires_in: float | None = None,
        state: Any = _KEEP,
        hold_seconds: float | None = None,
    ) -> Any:
        """Pauses the Run here until someone answers; returns the answer.

        Saves a Checkpoint (of `state`, or the latest state) and the typed request. Without a hold it
        then ends this Attempt and releases the worker: the Attempt that resumes runs the agent again
        from that Checkpoint, and this same call returns the accepted value instead of pausing again.
        With `hold_seconds`, this Attempt keeps its lease and waits that long: an answer accepted in time
        is returned here, by the same Attempt (ctx.resumed becomes True); after that the hold is
        released and the answer goes to a new Attempt as without one.
        """
        if interrupts.answers_question(self._answering):
            value = self.resume_value
            self._answering = None  # one answer per resumed Attempt: a later interrupt pauses again
            _check_answer(value, schema)
            return value
        if schema is not None:  # before anything is sent: the request could not be written after it
            refuse_over_budget("the interrupt's schema", schema, ACCEPTED_SCHEMA_BUDGET, SCHEMA_ADVICE)
        await self._boundary()  # a pending pause first: the question is asked after it
        if state is not _KEEP:
            self.state = state
        value = await self._raise_interrupt(
            InterruptReason(reason), prompt, schema, expires_in, None, hold_seconds=hold_seconds
        )
        _check_answer(value, schema)
        return value

    async def _raise_interrupt(  # noqa: PLR0917 (the request's fields, in their order)
        self,
        reason: InterruptReason,
        prompt: str | None,
        schema: dict[str, Any] | None,
        expires_in: float | None,
        request_id: str | None,
        hold_seconds: float | None = None,
        action: dict[str, Any] | None = None,
    ) -> Any:
        """Saves the Checkpoint and the request (with the `action` an approval approves); raises
        Interrupted (the Attempt ends), or returns the answer accepted within the hold."""
        if self._latest is None or self._latest_state != self.state:
            self._latest = await self._session.save_checkpoint(
                self.state, f"interrupt:{reason}", self._latest
            )
            self._latest_state = self.state
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
        if hold_seconds:
            pending["holdSeconds"] = max(1, math.ceil(hold_seconds))
            pending["heldBy"] = self.attempt
        if action is not None:
            pending["action"] = action
        await self._session.fenced_status_write({"pendingRequest": pending}, f"input request {request_id}")
        return await self.held_answer(request_id, hold_seconds)

    async def held_answer(self, request_id: str, hold_seconds: float | None) -> Any:
        """After request `request_id` was written (with heldBy this Attempt when `hold_seconds`): the answer
        accepted within the hold, or Interrupted (the Attempt ends and a new one gets the answer). For
        integrations that write their own request (agentrun.integrations.langgraph)."""
        if hold_seconds:
            with self._session.progress.holding():  # waiting for a person is no stall
                answered, value = await self._hold(request_id, hold_seconds)
            if answered:
                self._answered.add(request_id)
                self._answering = None
                self.resumed, self.resume_reason = True, f"resume:{request_id}"
                return value
        raise Interrupted(request_id)

    async def _hold(self, request_id: str, seconds: float) -> tuple[bool, Any]:
        """Waits (on the Run watch, never polling) until the operator accepts an answer or the hold ends;
        then releases it with a write preconditioned on the newest Run seen. Exactly one of the two
        writes lands: a release that conflicts looks again at what the operator wrote."""
        session = self._session
        deadline = session.clock.monotonic() + seconds
        while True:
            session.changed.clear()  # before looking: a change after this wakes the wait below
            run = session.observed or await session.read_run()
            state = interrupts.hold_state(run, self.attempt, request_id)
            if state == interrupts.HoldState.ANSWERED:
                found, value = interrupts.held_answer(run, request_id)
                if not found:  # only for an answer accepted before status.acceptedInput: no longer readable
                    raise TransientError(f"the answer to {request_id} was accepted but is no longer readable")
                return True, value
            if state == interrupts.HoldState.ENDED:
                return False, None
            remaining = deadline - session.clock.monotonic()
            if remaining <= 0:
                await session.release_hold(request_id)
                continue  # released, or the Run changed first: decide on what is stored now
            await session.next_change(remaining)

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
        request: Any = None,
        resend: str = "Never",
        max_sends: int = 3,
        send_deadline_seconds: int = 300,
    ) -> Effect:
        """Runs an external action at most once per idempotency key, through the SideEffect ledger.

        `execute(key)` performs it and returns its result; `lookup(key)` returns that result if the
        action happened, None if it did not, and raises if it cannot tell. An exception from execute of
        a type in `unknown_on` (or a timeout or lost connection) means nobody knows whether the action
        happened: the record becomes Unknown and is looked up by key before anything else; when nobody
        can tell, the Run waits for reconciliation (NeedsReconciliation, with the reason).

        `request` is what is asked (its digest is compared on every replay: the same key with another
        request is refused, IdempotencyKeyReused). Definite transient or rate-limited failures are sent
        again with the same key within `max_sends` and `send_deadline_seconds`; an unknown outcome is
        looked up first, or sent again without a lookup only with `resend="WithSameKey"`, and never
        for an irreversible action. A `lookup` may raise worker.ConflictingResult.

        With `requires_approval` (or an irreversible action under the Run's spec.approvals.irreversible),
        the Run first waits for a person (an interrupt with reason auth_required, answered with
        {"approved": true}), bound to the request's digest; the operator records the approval on the
        SideEffect.
        """
        await self._boundary()  # before the send, never between the send and its confirmation
        if ledger.needs_approval(requires_approval, reversible, self._approve_irreversible):
            digest = ledger.request_digest(tool, target, request)
            await self._approve(
                tool,
                key,
                target,
                digest,
                ledger.approval_action(tool, target, key, request, digest, reversible),
            )
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
                request=request,
                resend=Resend(resend),
                max_sends=max_sends,
                send_deadline_seconds=send_deadline_seconds,
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

    async def _approve(
        self, tool: str, key: str, target: str | None, digest: str, action: dict[str, Any]
    ) -> None:
        """Returns once the gated action is approved (now or before); raises if it was refused.

        The approval is an interrupt whose request id names the action's SideEffect. Its answer comes
        back as the input of the Attempt that resumes; the operator records it on the SideEffect (a Pod
        never writes an approval), so a later Attempt finds it there or on that Attempt."""
        record = await self._ledger.record_for(key)
        if record is not None and record.spec.request_digest not in (None, digest):
            return  # another request under this key: the ledger refuses it (IdempotencyKeyReused)
        if record is not None and record.status is not None:
            done = record.status.state in (SideEffectState.CONFIRMED, SideEffectState.COMPENSATED)
            if done or ledger.approval_holds(record, digest):
                return
        # The request id carries the digest: an approval of one request never approves another.
        request_id = ledger.approval_request_id(side_effect_name(self.run_name, key), digest)
        if interrupts.answers_approval(self._answering, request_id):
            answer = self.resume_value
            self._answering = None
        else:
            answer = ledger.approval_answer(await self._session.read_attempts(), request_id)
        if answer is None:
            on = f" on {target}" if target else ""
            prompt = (
                f"Approve {tool}{on} (idempotency key {key}, request {digest})? "
                'Answer {"approved": true} or false.'
            )
            await self._raise_interrupt(
                InterruptReason.AUTH_REQUIRED, prompt, APPROVAL_SCHEMA, None, request_id, action=action
            )
        if not ledger.approved(answer):
            raise PermanentError(f"{tool} (key {key}) was not approved")


def _check_answer(value: Any, schema: dict[str, Any] | None) -> None:
    if schema is None:
        return
    import jsonschema  # noqa: PLC0415 (only an answer to a request with a schema needs it)

    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        raise PermanentError(f"the resume value does not match the request's schema: {exc.message}") from None
