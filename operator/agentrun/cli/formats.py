"""Text for people: tables, ages, one-line summaries and the side-effect report. Pure functions."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from agentrun.api import (
    Attempt,
    BlobRef,
    ControlOutcome,
    ControlRecord,
    Run,
    SideEffect,
    SideEffectState,
    Usage,
)
from agentrun.api.run import ReportedEffect
from agentrun.api.usage import MICRO, usage_sum
from agentrun.cli.hints import Target
from agentrun.cli.nextsteps import report_steps
from agentrun.core.ledger import is_compensation_record

NONE = "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns like kubectl's: upper-case headers, left-aligned, three spaces apart."""
    cells = [[NONE if c is None or c == "" else str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = [
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [list(headers), *cells]
    ]
    return "\n".join(lines)


def age(since: datetime | None, now: datetime) -> str:
    """kubectl's short human duration: 45s, 3m12s, 5h, 2d3h."""
    if since is None:
        return NONE
    seconds = max(int((now - since).total_seconds()), 0)
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d" if days < 365 * 8 else f"{days // 365}y"


def clock(moment: datetime | None, with_date: bool = False) -> str:
    if moment is None:
        return NONE
    return moment.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")


def rfc3339(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment else NONE


def usd(micro: int) -> str:
    """$0.004210 from 4210 micro-USD: exact, as stored."""
    return f"${micro // MICRO}.{micro % MICRO:06d}"


def usage_line(usage: Usage) -> str:
    """One line of counters, e.g. "1200 input + 310 output tokens, 3 model calls, $0.004000, 2 step
    retries"."""
    return (
        f"{usage.input_tokens} input + {usage.output_tokens} output tokens, {usage.model_calls} model "
        f"calls, {usd(usage.cost_micro_usd)}, {usage.step_retries} step retries"
    )


def usage_table(run: Run, attempts: Sequence[Attempt]) -> str:
    """Usage per Attempt and in total (the Run's sum, or the Attempts' while the operator has not
    written it yet)."""
    rows: list[list[object]] = []
    for a in sorted(attempts, key=lambda a: a.spec.number):
        u = a.status.usage or Usage()
        phase = a.status.phase.value if a.status.phase else None
        rows.append([a.metadata.name, phase, *_usage_cells(u)])
    total = run.status.usage or usage_sum([a.status.usage for a in attempts])
    rows.append(["total", None, *_usage_cells(total)])
    headers = ["ATTEMPT", "PHASE", "INPUT", "OUTPUT", "MODEL-CALLS", "COST", "STEP-RETRIES"]
    return table(headers, rows)


def _usage_cells(u: Usage) -> list[object]:
    return [u.input_tokens, u.output_tokens, u.model_calls, usd(u.cost_micro_usd), u.step_retries]


def stored_in(ref: BlobRef) -> str:
    """Where a value lives in the agent-state store: `kubectl agentrun state` fetches and verifies it."""
    return f"in the state store at {ref.key} ({ref.size} bytes, sha256 {ref.sha256[:12]}...)"


def compact_json(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, separators=(", ", ": "), ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def elapsed(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m{seconds % 60}s"


# ---- Runs ------------------------------------------------------------------------------------------------


def runs_table(runs: Sequence[Run], now: datetime, with_namespace: bool = False) -> str:
    headers = ["NAME", "PHASE", "ATTEMPT", "LEASE-EPOCH", "CANCEL-EPOCH", "WAITING-FOR", "HELD-BY", "AGE"]
    rows = []
    for run in runs:
        s = run.status
        row: list[object] = [
            run.metadata.name,
            s.phase.value if s.phase else "Pending",
            s.current_attempt,
            s.lease_epoch,
            run.spec.cancel_epoch,
            s.pending_request.request_id if s.pending_request else None,
            s.pending_request.held_by if s.pending_request else None,  # the Attempt waiting in its hold
            age(run.metadata.creation_timestamp, now),
        ]
        rows.append([run.metadata.namespace, *row] if with_namespace else row)
    return table(["NAMESPACE", *headers] if with_namespace else headers, rows)


def phase_line(run: Run) -> str:
    """`Succeeded: ask-a2 committed the result`."""
    phase = run.status.phase.value if run.status.phase else "Pending"
    return f"{phase}: {run.status.message}" if run.status.message else phase


def control_line(record: ControlRecord) -> str:
    """`Resume k3: Accepted (answer to ask-r1 accepted)`; `Resume k2 by bob: Rejected, SchemaMismatch: x`."""
    by = f" by {record.requested_by}" if record.requested_by else ""
    head = f"{record.op.value} {record.idempotency_key}{by}: {record.outcome.value}"
    if record.outcome == ControlOutcome.ACCEPTED:
        return f"{head} ({record.message})" if record.message else head
    detail = ": ".join(p for p in (record.reason, record.message) if p)
    return f"{head}, {detail}" if detail else head


# ---- side effects ------------------------------------------------------------------------------------


def effect_state(effect: SideEffect) -> SideEffectState:
    return effect.status.state if effect.status else SideEffectState.PENDING


def effects_table(effects: Sequence[SideEffect]) -> str:
    rows = [
        [
            e.metadata.name,
            e.spec.tool,
            effect_state(e).value,
            e.status.external_reference if e.status else None,
            "yes" if e.spec.reversible else "no",
            e.status.attempt if e.status else None,
            f"{len(e.status.sends or []) if e.status else 0}/{e.spec.max_sends}",
        ]
        for e in effects
    ]
    return table(["NAME", "TOOL", "STATE", "REFERENCE", "REVERSIBLE", "ATTEMPT", "SENDS"], rows)


def reported_effects(effects: Sequence[SideEffect]) -> list[ReportedEffect]:
    """The report's view of live SideEffects, oldest first (for a Run that has not stopped yet); the
    records of compensations (<key>:compensate) are how an effect was undone, not effects of their own."""
    own = [e for e in effects if not is_compensation_record(e)]
    ordered = sorted(own, key=lambda e: (rfc3339(e.metadata.creation_timestamp), e.metadata.name or ""))
    return [
        ReportedEffect(
            name=str(e.metadata.name),
            tool=e.spec.tool,
            target=e.spec.target,
            state=effect_state(e),
            external_reference=e.status.external_reference if e.status else None,
            reversible=e.spec.reversible,
        )
        for e in ordered
    ]


def _effect_item(e: ReportedEffect) -> str:
    parts = [e.tool]
    if e.external_reference:
        parts.append(e.external_reference)
    if e.target:
        parts.append(f"on {e.target}")
    return f"  - {' '.join(parts)}   ({e.name})"


def report_text(
    run: Run,
    effects: Sequence[ReportedEffect],
    omitted: int = 0,
    live: bool = False,
    *,
    where: Target | None = None,
    compensable: Collection[str] = (),
) -> str:
    """What the Run did to the outside world: happened, compensated, cannot be undone, unknown; then
    the ways out (`where`: the namespace and context the commands act in; default the Run's)."""
    name = run.metadata.name
    where = where or Target(run.metadata.namespace or "default")
    lines = [f"Run {name}: {phase_line(run)}"]
    if run.status.result is not None:
        lines.append(f"Result: {compact_json(run.status.result)}")
    elif run.status.result_ref is not None:
        lines.append(f"Result: {stored_in(run.status.result_ref)}")
    if run.status.failure is not None:
        f = run.status.failure
        lines.append(
            f"Failure: {f.failure_class.value}"
            + (f" ({f.reason})" if f.reason else "")
            + f": {f.message or ''}"
        )
    if live:
        lines.append("(the Run has not stopped: this is the ledger so far)")
    if not effects:
        lines.append("No external side effects: nothing to compensate, nothing that cannot be undone.")
        return "\n".join(lines)
    by_state: dict[SideEffectState, list[ReportedEffect]] = {}
    for e in effects:
        by_state.setdefault(e.state, []).append(e)
    happened = by_state.get(SideEffectState.CONFIRMED, []) + by_state.get(SideEffectState.COMPENSATED, [])
    sections: list[tuple[str, list[ReportedEffect]]] = [
        ("What happened", happened),
        ("What was compensated", by_state.get(SideEffectState.COMPENSATED, [])),
        (
            "What cannot be undone",
            [e for e in by_state.get(SideEffectState.CONFIRMED, []) if not e.reversible],
        ),
        (
            "Could still be compensated",
            [e for e in by_state.get(SideEffectState.CONFIRMED, []) if e.reversible],
        ),
        ("Did not happen (failed)", by_state.get(SideEffectState.FAILED, [])),
        (
            "Unknown: nobody knows whether it happened",
            by_state.get(SideEffectState.UNKNOWN, []) + by_state.get(SideEffectState.PENDING, []),
        ),
    ]
    for title, items in sections:
        if not items and title not in ("What happened", "What was compensated", "What cannot be undone"):
            continue
        lines.append(f"{title} ({len(items)}):" if items else f"{title}: none")
        lines.extend(_effect_item(e) for e in items)
    lines += report_steps(run, effects, where, compensable=compensable, omitted=omitted, live=live)
    return "\n".join(lines)
