"""Telling people that a Run waits for them: which notification is due, where it may go, and the
CloudEvent (HTTP binary mode) that carries it. Pure: the operator's notifier sends what these say.

Each notification has an id that names what it is about, not when it was sent: `<run uid>/<request id>`
for a question or an approval, `<run uid>/<reason>-<attempt count>` for a reconciliation. A restarted
operator sends the same ids again (at least once); receivers deduplicate by id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from agentrun.api import API_VERSION, Run, RunPhase
from agentrun.core.interrupts import APPROVAL_PREFIX

SPEC_VERSION: Final = "1.0"
TYPE_PREFIX: Final = "dev.agentrun.run."
INPUT_REQUIRED: Final = TYPE_PREFIX + "input_required"
AUTH_REQUIRED: Final = TYPE_PREFIX + "auth_required"
APPROVAL_WAITING: Final = TYPE_PREFIX + "approval_waiting"
NEEDS_RECONCILIATION: Final = TYPE_PREFIX + "needs_reconciliation"
# Retries of a delivery: capped exponential backoff (seconds).
FIRST_RETRY_SECONDS: Final = 1.0
MAX_RETRY_SECONDS: Final = 60.0


@dataclass(frozen=True)
class Notice:
    """A notification that is due: what it says, and the sink the Run asked for (if any)."""

    id: str
    type: str
    namespace: str
    run: str
    uid: str
    phase: str
    reason: str
    request_id: str | None = None
    checkpoint_id: str | None = None
    prompt: str | None = None
    action: dict[str, Any] | None = None  # an approval's tool and target (agent-provided text)
    requested_sink: str | None = None


def due(run: Run) -> Notice | None:
    """The notification the Run's current state calls for, or None (it waits for nobody)."""
    meta, status = run.metadata, run.status
    uid = str(meta.uid or "")
    if not uid or status.phase is None:
        return None
    base = Notice(
        id=uid,
        type="",
        namespace=str(meta.namespace),
        run=str(meta.name),
        uid=uid,
        phase=status.phase.value,
        reason="",
        requested_sink=run.spec.notify.sink if run.spec.notify else None,
    )
    pending = status.pending_request
    if status.phase in (RunPhase.INPUT_REQUIRED, RunPhase.AUTH_REQUIRED) and pending is not None:
        approval = status.phase == RunPhase.AUTH_REQUIRED and pending.request_id.startswith(APPROVAL_PREFIX)
        kind = (
            APPROVAL_WAITING
            if approval
            else (INPUT_REQUIRED if status.phase == RunPhase.INPUT_REQUIRED else AUTH_REQUIRED)
        )
        action = pending.action
        return replace(
            base,
            id=f"{uid}/{pending.request_id}",
            type=kind,
            reason=pending.reason.value,
            request_id=pending.request_id,
            checkpoint_id=pending.checkpoint_id,
            prompt=pending.prompt,
            action={"tool": action.tool, "target": action.target} if action else None,
        )
    if status.phase == RunPhase.NEEDS_RECONCILIATION:
        reason = (status.failure.reason if status.failure else None) or "NeedsReconciliation"
        return replace(
            base, id=f"{uid}/{reason}-{status.attempts or 0}", type=NEEDS_RECONCILIATION, reason=reason
        )
    return None


@dataclass(frozen=True)
class Destination:
    """Where a notice goes (None: nowhere), and why the Run's own choice was refused, if it was."""

    sink: str | None
    refusal: str | None = None


def destination(requested: str | None, allowed: Iterable[str], default: str | None) -> Destination:
    """Only sinks the operator was told about: a Run cannot make the operator call a URL of its choice
    (no request forgery through the operator). A refused sink falls back to the default one."""
    allowed = tuple(allowed)
    if requested is None or requested == default or requested in allowed:
        return Destination(requested or default)
    listed = ", ".join(allowed) or "none"
    fallback = f"the default sink is told instead ({default})" if default else "no notification is sent"
    return Destination(
        default,
        f"spec.notify.sink {requested} is not on the operator's allow-list ({listed}): {fallback}; an "
        "administrator adds sinks to the operator's settings (AGENTRUN_NOTIFY_SINKS)",
    )


def console_link(base_url: str | None, notice: Notice) -> str | None:
    """The Run's page in the console, when the operator knows where the console is."""
    if not base_url:
        return None
    return f"{base_url.rstrip('/')}/runs/{notice.namespace}/{notice.run}"  # DNS names: URL-safe


def data(notice: Notice, console_url: str | None, with_prompt: bool) -> dict[str, Any]:
    """The event's JSON body: ids, reason and a link; the agent's own text (its prompt, what an approval
    would do) only where the namespace opts in."""
    body: dict[str, Any] = {
        "namespace": notice.namespace,
        "run": notice.run,
        "uid": notice.uid,
        "phase": notice.phase,
        "reason": notice.reason,
    }
    if notice.request_id:
        body |= {"requestId": notice.request_id, "checkpointId": notice.checkpoint_id}
    if link := console_link(console_url, notice):
        body["console"] = link
    if with_prompt and notice.prompt:
        body["prompt"] = notice.prompt
    if with_prompt and notice.action:
        body["action"] = {k: v for k, v in notice.action.items() if v is not None}
    return body


def headers(notice: Notice, now: datetime) -> dict[str, str]:
    """The CloudEvents attributes as HTTP headers (binary content mode)."""
    group, version = API_VERSION.split("/")
    return {
        "ce-specversion": SPEC_VERSION,
        "ce-id": notice.id,
        "ce-source": f"/apis/{group}/{version}/namespaces/{notice.namespace}/runs/{notice.run}",
        "ce-type": notice.type,
        "ce-subject": notice.run,
        "ce-time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "content-type": "application/json",
    }


def retry_delay(tries: int) -> float:
    """Seconds before delivery try `tries` + 1: capped exponential backoff."""
    return float(min(FIRST_RETRY_SECONDS * 2.0 ** max(tries - 1, 0), MAX_RETRY_SECONDS))
