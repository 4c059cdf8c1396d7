"""worker.main(agent): run one Attempt of a Run inside its attempt Pod."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NoReturn

from agentrun.api import AttemptReason, FailureClass, RejectedCommitReason
from agentrun.core.failures import fingerprint
from agentrun.core.fence import fence_violation
from agentrun.core.traces import run_trace
from agentrun.kubeapi import ApiError, KubeApi, unanswered
from agentrun.statestore import StateStoreError
from agentrun.tracing import Tracing, attempt_parent
from agentrun.worker.blobs import as_sdk_error, open_state_store
from agentrun.worker.clock import SystemClock
from agentrun.worker.compensation import Lookup, Registered, compensate
from agentrun.worker.context import Context
from agentrun.worker.effects import Ledger
from agentrun.worker.errors import (
    AgentError,
    Cancelled,
    FenceRejected,
    Interrupted,
    LeaseLost,
    PermanentError,
    PodTerminated,
)
from agentrun.worker.identity import Identity
from agentrun.worker.progress import ProgressTimeout
from agentrun.worker.session import Session

log = logging.getLogger("agentrun.worker")
Agent = Callable[[Context], Coroutine[Any, Any, Any]]
EX_TEMPFAIL = 75
LAST_USAGE_SECONDS = 5.0
# Answers that mean the API server could not serve the request (not that it refused it).
UNAVAILABLE_STATUSES = frozenset({0, 429, 500, 502, 503, 504})
STALE_WORKER = RejectedCommitReason.STALE_WORKER


def _api_server_unavailable(exc: BaseException) -> bool:
    """The worker's own requests to the API server went unanswered (a restart of the control plane, a
    network blip): the infrastructure failed, not the agent, and another Attempt may well succeed."""
    if isinstance(exc, ApiError):
        return exc.status in UNAVAILABLE_STATUSES
    return unanswered(exc)


def _termination(exc: BaseException) -> tuple[dict[str, Any], int]:
    """{class, message, fingerprint} for the termination message, and the exit code."""
    if isinstance(exc, ApiError) and exc.too_large:
        exc = PermanentError(
            f"the API server refused a write as too large ({exc.status}: {exc.message}): store large data "
            "elsewhere and checkpoint a reference to it (stateRef)"
        )
    if isinstance(exc, StateStoreError):  # from an integration's own use of the store
        exc = as_sdk_error(exc)
    if isinstance(exc, AgentError):
        cls, message = exc.failure_class, str(exc) or type(exc).__name__
    elif isinstance(exc, asyncio.CancelledError):
        cls, message = FailureClass.CANCELLED, "the Attempt was stopped"
    elif _api_server_unavailable(exc):
        cls, message = (
            FailureClass.INFRASTRUCTURE,
            f"the API server was unavailable: {type(exc).__name__}: {exc}",
        )
    else:
        cls, message = FailureClass.DETERMINISTIC, f"{type(exc).__name__}: {exc}"
    report: dict[str, Any] = {
        "class": cls.value,
        "message": message[:1024],
        # the operator's normalisation: "timeout after 3012 ms" repeats "timeout after 2990 ms"
        "fingerprint": fingerprint(cls, f"{type(exc).__name__}: {message}"),
    }
    # a RateLimited, or a step that ran out of tries on one (StepFailed keeps its retry_after)
    retry_after = getattr(exc, "retry_after", None) if isinstance(exc, AgentError) else None
    if isinstance(retry_after, int | float):
        report["retryAfterSeconds"] = int(retry_after + 0.999)
    if reason := getattr(exc, "reason", None):
        report["reason"] = str(reason)  # the ledger's: MaxSendsReached, IdempotencyKeyReused, ...
    return report, EX_TEMPFAIL if cls == FailureClass.TRANSIENT else 1


async def run_attempt(
    agent: Agent,
    session: Session,
    *,
    stop_on_sigterm: bool = True,
    compensations: Mapping[str, Registered] | None = None,
    lookups: Mapping[str, Lookup] | None = None,
) -> None:
    """Runs the agent next to the lease keeper and the cancel watch; whichever ends first decides.
    A compensation Attempt (reason compensate) runs the registered compensations and lookups instead
    (worker.compensation), and commits nothing.

    stop_on_sigterm: SIGTERM (the Pod's deletion) sets `session.terminating`: the agent stops at once and
    the Attempt ends as cancelled if the Run was, else as PodTerminated (infrastructure: retried from the
    latest Checkpoint). A host that runs many attempts in one process (the local node's instant mode)
    passes False and sets it itself."""
    # The cancel watch first: its first event is the Run (no read). The Attempt is read only when it
    # carries an input value; the rest of it is on the Pod's annotations (session.read_attempt).
    watcher = asyncio.create_task(session.watch_cancel())
    # What this SDK reads (references into the state store), stated on its Attempt before any state is
    # read, beside the watch's first event: the operator gives a Run whose state may be in the store only
    # to an SDK that states it.
    stating = asyncio.create_task(session.state_what_it_reads())
    try:
        run = await session.first_run()
        if fence_violation(run, session.me.lease_epoch, session.me.cancel_epoch) == STALE_WORKER:
            raise LeaseLost(f"the Run's lease epoch is {run.status.lease_epoch}, not this worker's")
        attempt = await session.read_attempt()
        await stating
        compensating = attempt.spec.reason == AttemptReason.COMPENSATE
        resume_from = None if compensating else session.me.resume_from
        resumed = await session.load_checkpoint(resume_from) if resume_from else None
        # read (and verified) before the agent starts: it never sees a shorter or missing state
        resumed_state = await session.checkpoint_state(resumed) if resumed else None
    except BaseException:
        watcher.cancel()
        stating.cancel()
        raise
    if compensating:

        async def undo(_ctx: Context) -> None:
            await compensate(Ledger(session), attempt, compensations, lookups)

        agent = undo
    ctx = Context(session, run, attempt, resumed, resumed_state)
    lease = run.spec.lease
    # The agent's spans are children of this Attempt's span (TRACEPARENT, or derived from the Run alike).
    uid = str(run.metadata.uid or run.metadata.name)
    parent = attempt_parent() or run_trace(uid, run.metadata.annotations).attempt(session.me.attempt)
    with session.tracing.continuing(parent):
        agent_task: asyncio.Task[Any] = asyncio.create_task(agent(ctx), name="agent")
    flusher = asyncio.create_task(ctx._usage.keep_flushing())
    session.progress.timeout = run.spec.progress_timeout_seconds
    session.progress.report()  # the agent starts now
    keeper = asyncio.create_task(session.keep_lease(lease.renew_seconds, lease.duration_seconds))
    lost = asyncio.create_task(session.lost.wait())
    cancelled = asyncio.create_task(session.cancelled.wait())
    terminating = asyncio.create_task(session.terminating.wait())
    stalled = asyncio.create_task(session.progress.stall())
    if stop_on_sigterm:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, session.terminating.set)  # Pod deletion: stop fast
    try:
        stops = {agent_task, lost, cancelled, terminating, stalled}
        await asyncio.wait(stops, return_when=asyncio.FIRST_COMPLETED)
        if not agent_task.done():
            if stalled.done():
                keeper.cancel()  # no renewal while the agent stops: if it never does, the lease runs out
            agent_task.cancel()
            with contextlib.suppress(BaseException):
                await agent_task
            if session.lost.is_set():
                raise LeaseLost("the lease was lost; the agent was stopped")
            if stalled.done() and not session.cancelled.is_set():
                limit = session.progress.timeout
                raise ProgressTimeout(f"the agent showed no progress for {limit}s (progressTimeoutSeconds)")
            if session.cancelled.is_set() or not session.terminating.is_set():
                raise Cancelled("the Run was cancelled; the agent was stopped")
            raise PodTerminated(
                "the attempt Pod was stopped (SIGTERM: deleted, evicted or its node drained) before the "
                "agent finished; the Run was not cancelled"
            )
        result = agent_task.result()
        await ctx._usage.flush()  # before the commit: a Succeeded Run's usage is complete
        if compensating:
            return  # its end is its exit code: the Run's status is the operator's in Compensating
        with session.tracing.continuing(parent), session.tracing.span("commit"):
            await session.commit(result if isinstance(result, dict) else {"value": result})
    finally:
        for task in (keeper, watcher, lost, cancelled, terminating, stalled, flusher):
            task.cancel()
        await _last_usage(ctx)


async def _last_usage(ctx: Context) -> None:
    """However the Attempt ends, what it used is written (once, if anything changed since the last write);
    a failed Attempt's cost counts as much as a successful one's."""
    try:
        await asyncio.wait_for(ctx._usage.flush(), LAST_USAGE_SECONDS)
    except Exception as exc:
        log.warning("could not write the Attempt's usage: %s", exc)


async def attempt_exit_code(
    agent: Agent,
    session: Session,
    *,
    stop_on_sigterm: bool = True,
    compensations: Mapping[str, Registered] | None = None,
    lookups: Mapping[str, Lookup] | None = None,
) -> int:
    """Runs the Attempt to its end, writes the termination message and returns the exit code: what the
    attempt Pod's process reports, whichever way the Attempt ends."""
    me = session.me
    try:
        await run_attempt(
            agent, session, stop_on_sigterm=stop_on_sigterm, compensations=compensations, lookups=lookups
        )
    except Interrupted as stop:  # a clean end: the Run waits for its answer
        log.info("interrupted: waiting for request %s", stop.request_id)
        _write_termination(me, {"interrupted": stop.request_id})
        return 0
    except BaseException as exc:  # every way out writes its termination message
        report, code = _termination(exc)
        if isinstance(exc, FenceRejected):
            log.warning("commit rejected (%s): %s", exc.reason, exc)
        else:
            log.warning("attempt failed: %s", report["message"])
        _write_termination(me, report)
        return code
    _write_termination(me, {})
    return 0


def main(
    agent: Agent,
    compensations: Mapping[str, Registered] | None = None,
    lookups: Mapping[str, Lookup] | None = None,
) -> NoReturn:
    """Runs this Pod's Attempt: the agent, or for a compensation Attempt the `compensations` (by the
    name a side effect gave as its compensation: a worker.Compensation or a bare callable) after
    settling open records with `lookups` (by tool: fn(idempotency key) -> result or None)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    me = Identity.from_env()
    # the agent's own code finds its namespace where it always did, however the Pod was given it
    os.environ.setdefault("AGENTRUN_NAMESPACE", me.namespace)

    async def session_main() -> int:
        api = KubeApi()
        try:  # the state store the Pod's environment names, if any
            state_store = open_state_store(os.environ)
        except PermanentError as exc:
            report, code = _termination(exc)
            log.warning("attempt failed: %s", report["message"])
            _write_termination(me, report)
            await api.aclose()
            return code
        session = Session(api, me, SystemClock(), state_store)  # the one clock of this Attempt
        session.tracing = Tracing("agentrun-worker")  # on with OTEL_EXPORTER_OTLP_ENDPOINT
        try:
            return await attempt_exit_code(agent, session, compensations=compensations, lookups=lookups)
        finally:
            await api.aclose()
            await asyncio.to_thread(session.tracing.shutdown)

    sys.exit(asyncio.run(session_main()))


def _write_termination(me: Identity, report: dict[str, Any]) -> None:
    with contextlib.suppress(OSError), open(me.termination_message_path, "w") as f:
        f.write(json.dumps(report) if report else "")
