"""`describe`: a Run and everything it owns as one readable account, its history sorted by time."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from agentrun.api import (
    STOPPED_PHASES,
    Attempt,
    Checkpoint,
    CheckpointKind,
    ConditionStatus,
    ControlOp,
    ControlOutcome,
    Run,
    RunConditionType,
    SideEffect,
    StartKind,
    StartReason,
    StateStoreMode,
)
from agentrun.cli import formats
from agentrun.cli.hints import Target
from agentrun.cli.nextsteps import run_steps

LAST = 10**6  # sorts entries without an Attempt after those of the Attempts at the same second


@dataclass(frozen=True)
class Entry:
    time: datetime
    attempt: int  # the Attempt the entry belongs to, to order entries of the same second
    rank: int  # within an Attempt: start 1, checkpoint 2, side effect 3, end 9; before it: 0
    what: str
    detail: str = ""


def _number(attempt_name: str | None, run: str) -> int:
    match = re.fullmatch(rf"{re.escape(run)}-a(\d+)", attempt_name or "")
    return int(match.group(1)) if match else LAST


def _attempt_entries(a: Attempt) -> list[Entry]:
    n, s, out = a.spec.number, a.status, []
    start = s.start_time or a.metadata.creation_timestamp
    if start:
        detail = f"{a.spec.reason}, lease epoch {a.spec.lease_epoch}"
        if a.spec.resume_from:
            detail += f", from {a.spec.resume_from}"
        out.append(Entry(start, n, 1, f"attempt {n} started", detail))
    if s.completion_time and s.phase:
        parts = []
        if s.failure:
            parts.append(f"{s.failure.failure_class.value}: {s.failure.message or ''}".rstrip(": "))
            if s.failure.exit_code is not None:
                parts.append(f"exit code {s.failure.exit_code}")
        if s.usage and not s.usage.empty:
            parts.append(formats.usage_line(s.usage))
        out.append(Entry(s.completion_time, n, 9, f"attempt {n} {s.phase.value}", "; ".join(parts)))
    rejected = s.rejected_commit
    if rejected and rejected.time:
        detail = rejected.reason.value + (f": {rejected.message}" if rejected.message else "")
        out.append(Entry(rejected.time, n, 9, f"attempt {n} commit refused", detail))
    return out


def _checkpoint_entry(c: Checkpoint, run: str) -> list[Entry]:
    if not c.metadata.creation_timestamp:
        return []
    detail = c.spec.id + (f" at {c.spec.step}" if c.spec.step else "") + f" by {c.spec.attempt}"
    if c.spec.state_ref is not None:
        detail += f", state {formats.stored_in(c.spec.state_ref)}"
    n = _number(c.spec.attempt, run)
    if c.spec.kind != CheckpointKind.STATE:  # a journaled step result, a framework's pending writes
        what = f"{c.spec.kind.value.lower()} {c.spec.step or ''}".rstrip()
        return [Entry(c.metadata.creation_timestamp, n, 2, what, f"{c.spec.id} by {c.spec.attempt}")]
    return [Entry(c.metadata.creation_timestamp, n, 2, f"checkpoint {c.spec.sequence}", detail)]


def _effect_entries(e: SideEffect, run: str) -> list[Entry]:
    label = f"{e.spec.tool} ({e.metadata.name})"
    history = e.status.history if e.status and e.status.history else []
    out = [
        Entry(
            h.time,
            _number(h.attempt, run),
            3,
            f"side effect {h.state.value}",
            label + (f": {h.message}" if h.message else ""),
        )
        for h in history
    ]
    if not history and e.metadata.creation_timestamp:
        n = _number(e.status.attempt if e.status else None, run)
        out.append(
            Entry(e.metadata.creation_timestamp, n, 3, f"side effect {formats.effect_state(e).value}", label)
        )
    return out


def _control_entries(run: Run, attempts: Sequence[Attempt]) -> list[Entry]:
    """Control requests and recorded inputs; an accepted one sorts just before the Attempt it started."""
    reasons = [(a, StartReason.parse(a.spec.reason)) for a in attempts]
    resumed_by = {r.answered_request: a.spec.number for a, r in reasons if r.answered_request is not None}
    retried = {
        a.metadata.creation_timestamp: a.spec.number for a, r in reasons if r.kind == StartKind.MANUAL_RETRY
    }
    answered = {i.idempotency_key: i.request_id for i in run.status.inputs or []}
    out = []
    for record in run.status.controls or []:
        n = LAST  # a refused request started nothing: after whatever else happened that second
        if record.outcome == ControlOutcome.ACCEPTED and record.op == ControlOp.RESUME:
            n = resumed_by.get(answered.get(record.idempotency_key, ""), LAST)
        elif record.outcome == ControlOutcome.ACCEPTED and record.op == ControlOp.RETRY:
            n = retried.get(record.time, LAST)
        reason = record.reason if record.reason != record.outcome.value else None
        why = ": ".join(p for p in (reason, record.message) if p)
        by = f" by {record.requested_by}" if record.requested_by else ""
        detail = f"key {record.idempotency_key}{by}" + (f", {why}" if why else "")
        out.append(Entry(record.time, n, 0, f"{record.op.value.lower()} {record.outcome.value}", detail))
    for i in run.status.inputs or []:
        detail = f"request {i.request_id} at {i.checkpoint_id}, key {i.idempotency_key}, {i.digest[:19]}"
        detail += f", answered by {i.answered_by}" if i.answered_by else ""
        out.append(Entry(i.time, resumed_by.get(i.request_id, LAST), 0, "input recorded", detail))
    return out


# What the operator said of where it keeps agent state (status.stateStore, written with each phase change).
STORE_MODES: Final = {
    StateStoreMode.BUNDLED: "Bundled (the operator's bundled object store)",
    StateStoreMode.EXTERNAL: "External (the object store the operator is configured with)",
    StateStoreMode.INLINE: "Inline (the operator has no state store: state stays in the cluster)",
}


def _run_entries(run: Run) -> list[Entry]:
    """The Run's own turning points, from its conditions: a cancel asked for, and how it ended."""
    s, out = run.status, []
    conditions = {c.type: c for c in s.conditions or []}
    cancel = conditions.get(RunConditionType.CANCEL_REQUESTED)
    if cancel is not None and cancel.status == ConditionStatus.TRUE:
        epoch = f"cancel epoch {run.spec.cancel_epoch}"
        out.append(
            Entry(cancel.last_transition_time, 0, 0, "cancel requested", epoch)
        )  # what follows is its effect
    ended = conditions.get(RunConditionType.SUCCEEDED)
    stopped = s.phase in STOPPED_PHASES
    if stopped and s.phase and ended is not None and ended.status != ConditionStatus.UNKNOWN:
        out.append(Entry(ended.last_transition_time, LAST, 10, f"run {s.phase.value}", s.message or ""))
    return out


def entries(
    run: Run, attempts: Sequence[Attempt], checkpoints: Sequence[Checkpoint], effects: Sequence[SideEffect]
) -> list[Entry]:
    """Everything that happened to the Run, oldest first."""
    name = str(run.metadata.name)
    out: list[Entry] = []
    if run.metadata.creation_timestamp:
        out.append(Entry(run.metadata.creation_timestamp, 0, 0, "run created"))
    for a in attempts:
        out += _attempt_entries(a)
    for c in checkpoints:
        out += _checkpoint_entry(c, name)
    for e in effects:
        out += _effect_entries(e, name)
    out += _control_entries(run, attempts)
    out += _run_entries(run)
    return sorted(out, key=lambda e: (e.time, e.attempt, e.rank))


def _fork_line(run: Run) -> str:
    """Where a fork started: its source and checkpoint, and what it inherited once it started."""
    wanted, started = run.spec.fork_from, run.status.fork
    assert wanted is not None
    line = f"run {wanted.run} at checkpoint {wanted.checkpoint_id}"
    if started is None:
        return line + " (not started)"
    archived = ", from its archive" if started.archived else ""
    return line + f" (uid {started.uid}{archived}; {started.inherited} side effect(s) inherited)"


def _section(title: str, body: str) -> list[str]:
    return ["", f"{title}:", *("  " + line if line else "" for line in body.splitlines())]


def describe(
    run: Run,
    attempts: Sequence[Attempt],
    checkpoints: Sequence[Checkpoint],
    effects: Sequence[SideEffect],
    now: datetime,
    *,
    where: Target | None = None,
    archived: str | None = None,
) -> str:
    """The account of a Run; `where` is the namespace and context the suggested commands act in
    (default: the Run's namespace). `archived`: the Run is gone from the cluster, this is its archive
    (what to say about it): no command is suggested."""
    s, meta = run.status, run.metadata
    where = where or Target(meta.namespace or "default")
    cancel = f"{run.spec.cancel_epoch} (observed {s.observed_cancel_epoch or 0})"
    lines = [
        f"Name:          {meta.name}",
        f"Namespace:     {meta.namespace}",
        f"Phase:         {formats.phase_line(run)}",
        f"Attempts:      {s.attempts or 0}"
        + (f" (current {s.current_attempt})" if s.current_attempt else ""),
        f"Epochs:        lease {s.lease_epoch or 0}, cancel {cancel}",
        f"Checkpoint:    {s.latest_checkpoint or formats.NONE}",
        *([f"State store:   {STORE_MODES[s.state_store]}"] if s.state_store else []),
        f"Created:       {formats.rfc3339(meta.creation_timestamp)} "
        f"({formats.age(meta.creation_timestamp, now)} ago)",
    ]
    if archived:
        lines.append(f"Archived:      {archived}")
    elif s.expires_time:
        lines.append(f"Expires:       {formats.rfc3339(s.expires_time)} (archived, then deleted)")
    if run.spec.fork_from is not None:
        lines.append(f"Forked from:   {_fork_line(run)}")
    if s.next_attempt_time:
        lines.append(f"Next attempt:  {formats.rfc3339(s.next_attempt_time)}")
    by = f" (committed by {s.committed_by.attempt})" if s.committed_by else ""
    if s.result is not None:
        lines.append(f"Result:        {formats.compact_json(s.result)}{by}")
    elif s.result_ref is not None:
        lines.append(f"Result:        {formats.stored_in(s.result_ref)}{by}")
    if s.failure:
        f = s.failure
        lines.append(
            f"Failure:       {f.failure_class.value}"
            + (f" ({f.reason})" if f.reason else "")
            + f": {f.message or ''}"
        )
    if s.pending_request:
        p = s.pending_request
        waiting = [f"request {p.request_id} ({p.reason.value}) at checkpoint {p.checkpoint_id}"]
        if p.prompt:
            waiting.append(f"Prompt:  {p.prompt}")
        if p.accepted_schema is not None:
            waiting.append(f"Schema:  {formats.compact_json(p.accepted_schema, 400)}")
        if p.expires_at:
            waiting.append(f"Expires: {formats.rfc3339(p.expires_at)}")
        value = ("--value", "JSON") if p.accepted_schema is not None else ()
        waiting.append(f"Answer:  {where.command('resume', str(meta.name), *value)}")
        lines += _section("Waiting for", "\n".join(waiting))

    history = entries(run, attempts, checkpoints, effects)
    if history:
        with_date = len({e.time.date() for e in history}) > 1
        width = max(len(e.what) for e in history)
        body = "\n".join(
            f"{formats.clock(e.time, with_date)}  {e.what.ljust(width)}  {e.detail}".rstrip() for e in history
        )
        lines += _section("Timeline (UTC)", body)
    if run.status.usage or any(a.status.usage for a in attempts):
        lines += _section("Usage", formats.usage_table(run, attempts))
    if effects:
        lines += _section("Side effects", formats.effects_table(effects))
    if s.conditions:
        rows = [
            [c.type, c.status.value, c.reason, formats.age(c.last_transition_time, now)] for c in s.conditions
        ]
        lines += _section("Conditions", formats.table(["TYPE", "STATUS", "REASON", "AGE"], rows))
    if s.report is not None or s.side_effects is not None:
        counts = s.side_effects
        if counts is None or not (counts.confirmed or counts.compensated or counts.unknown):
            summary = "no external side effects"
        else:
            summary = (
                f"{counts.confirmed} confirmed ({counts.irreversible} cannot be undone), "
                f"{counts.compensated} compensated, {counts.unknown} unknown"
            )
        details = "" if archived else f"; details: {where.command('report', str(meta.name))}"
        lines += _section("Side-effect report", f"{summary}{details}")
    if not archived and s.phase in STOPPED_PHASES and (steps := run_steps(run, where)):
        lines += _section("Next", "\n".join(steps))
    return "\n".join(lines)
