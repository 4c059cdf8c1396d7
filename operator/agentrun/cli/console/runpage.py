"""A Run's page: what `kubectl agentrun describe` and `report` show, as data for the browser."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from agentrun.api import STOPPED_PHASES, Attempt, Checkpoint, Run, SideEffect
from agentrun.cli import formats, timeline
from agentrun.cli.cluster import Cluster

JsonDict = dict[str, Any]


def _effect(e: SideEffect) -> JsonDict:
    status = e.status
    return {
        "name": e.metadata.name,
        "tool": e.spec.tool,
        "target": e.spec.target,
        "state": formats.effect_state(e).value,
        "reversible": e.spec.reversible,
        "reference": status.external_reference if status else None,
        "sends": len(status.sends or []) if status else 0,
        "maxSends": e.spec.max_sends,
        "resolvedBy": status.resolved_by if status else None,
        "approvedBy": status.approval.approved_by if status and status.approval else None,
    }


def page(
    body: JsonDict,
    attempts: list[JsonDict],
    checkpoints: list[JsonDict],
    effects: list[JsonDict],
    now: datetime,
) -> JsonDict:
    run = Run.model_validate(body)
    tried = sorted((Attempt.model_validate(a) for a in attempts), key=lambda a: a.spec.number)
    saved = sorted((Checkpoint.model_validate(c) for c in checkpoints), key=lambda c: c.spec.sequence)
    records = [SideEffect.model_validate(e) for e in effects]
    s = run.status
    if s.report is not None:
        listed, omitted = s.report.effects, s.report.omitted
    else:
        listed, omitted = formats.reported_effects(records), 0
    history = timeline.entries(run, tried, saved, records)
    return {
        "namespace": run.metadata.namespace,
        "name": run.metadata.name,
        "phase": s.phase.value if s.phase else "Pending",
        "phaseLine": formats.phase_line(run),
        "stopped": s.phase in STOPPED_PHASES,
        "latestCheckpoint": s.latest_checkpoint,
        "checkpoints": [c.spec.id for c in saved],
        "traceId": next((a.status.trace_id for a in reversed(tried) if a.status.trace_id), None),
        "timeline": [{"time": formats.rfc3339(e.time), "what": e.what, "detail": e.detail} for e in history],
        "describe": timeline.describe(run, tried, saved, records, now),
        "report": formats.report_text(run, listed, omitted, live=s.phase not in STOPPED_PHASES),
        "effects": [_effect(e) for e in sorted(records, key=lambda e: str(e.metadata.name))],
    }


async def load(cluster: Cluster, name: str, now: datetime) -> JsonDict | None:
    body = await cluster.find_run(name)
    if body is None:
        return None
    attempts, checkpoints, effects = await asyncio.gather(
        cluster.owned("attempts", name),
        cluster.owned("checkpoints", name),
        cluster.owned("sideeffects", name),
    )
    return page(body, attempts, checkpoints, effects, now)
