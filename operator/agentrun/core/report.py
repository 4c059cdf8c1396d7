"""The Run's account of the outside world: what happened, what was compensated, what cannot be undone."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentrun.api import SideEffect, SideEffectState
from agentrun.api.run import MAX_REPORT_NOTE_LENGTH, MAX_REPORTED_EFFECTS
from agentrun.core.ledger import is_compensation_record, is_inherited

MAX_REPORTED = MAX_REPORTED_EFFECTS  # the report's maxItems, inside the Run's status budget


def _state(effect: SideEffect) -> SideEffectState:
    return effect.status.state if effect.status else SideEffectState.PENDING


def own_effects(effects: Iterable[SideEffect]) -> list[SideEffect]:
    """The Run's own side effects: the records of their compensations (key <key>:compensate) are how an
    effect was undone, reported with it, not effects of their own."""
    return [e for e in effects if not is_compensation_record(e)]


def side_effect_counts(effects: Iterable[SideEffect]) -> dict[str, int]:
    counts = {"confirmed": 0, "compensated": 0, "unknown": 0, "irreversible": 0}
    for effect in own_effects(effects):
        state = _state(effect)
        if is_inherited(effect) and state != SideEffectState.UNKNOWN:
            continue  # the source's action, not this Run's (an open one still waits for a person)
        if state == SideEffectState.CONFIRMED:
            counts["confirmed"] += 1
            if not effect.spec.reversible:
                counts["irreversible"] += 1
        elif state == SideEffectState.COMPENSATED:
            counts["compensated"] += 1
        elif state in (SideEffectState.UNKNOWN, SideEffectState.PENDING):
            counts["unknown"] += 1
    return counts


def _note(effect: SideEffect) -> str | None:
    """Why an effect is not settled: the ledger's last word on it (the SDK's or the operator's); for an
    inherited one, whose action it was."""
    status = effect.status
    if status is not None and status.inherited_from is not None:
        source = status.inherited_from
        return (
            f"inherited from Run {source.run} ({source.record}): its action, reused by this Run, never "
            "executed nor compensated by it"
        )[:MAX_REPORT_NOTE_LENGTH]
    if status is None or status.state not in (SideEffectState.UNKNOWN, SideEffectState.PENDING):
        return None
    if status.conflict:
        return f"conflict: {status.conflict.message}"[:MAX_REPORT_NOTE_LENGTH]
    last = status.history[-1].message if status.history else None
    return last[:MAX_REPORT_NOTE_LENGTH] if last else None


def _deciders(effect: SideEffect) -> dict[str, str]:
    """Who approved the effect and who established its outcome, as its record names them."""
    status = effect.status
    named: dict[str, str] = {}
    if status and status.approval and status.approval.approved_by:
        named["approvedBy"] = status.approval.approved_by
    if status and status.resolved_by:
        named["resolvedBy"] = status.resolved_by
    return named


def cannot_be_undone(effect: SideEffect) -> bool:
    """It happened and nothing undoes it: irreversible, or without a compensation."""
    return _state(effect) == SideEffectState.CONFIRMED and not (
        effect.spec.reversible and effect.spec.compensation
    )


def fate_lists(effects: Iterable[SideEffect]) -> dict[str, list[str]]:
    """The report's four lists of SideEffect names, oldest first: what happened (and stands), what was
    compensated, what cannot be undone (a subset of happened), what nobody knows yet. What a fork
    inherited from its source is not its own: in none of them but unknown (effects[] marks it)."""
    lists: dict[str, list[str]] = {"happened": [], "compensated": [], "cannotBeUndone": [], "unknown": []}
    for effect in effects:
        state, name = _state(effect), str(effect.metadata.name)
        if is_inherited(effect):
            if state == SideEffectState.UNKNOWN:
                lists["unknown"].append(name)
            continue
        if state == SideEffectState.CONFIRMED:
            lists["happened"].append(name)
            if cannot_be_undone(effect):
                lists["cannotBeUndone"].append(name)
        elif state == SideEffectState.COMPENSATED:
            lists["compensated"].append(name)
        elif state in (SideEffectState.UNKNOWN, SideEffectState.PENDING):
            lists["unknown"].append(name)
    # Every list is written, empty ones too: a merge patch would keep a list that is left out.
    return {kind: names[:MAX_REPORTED] for kind, names in lists.items()}


def run_report(effects: Iterable[SideEffect]) -> dict[str, Any]:
    ordered = sorted(
        own_effects(effects), key=lambda e: (e.metadata.creation_timestamp or 0, e.metadata.name or "")
    )
    listed = [
        {
            "name": e.metadata.name,
            "tool": e.spec.tool,
            **({"target": e.spec.target} if e.spec.target else {}),
            "state": _state(e).value,
            **(
                {"externalReference": e.status.external_reference}
                if e.status and e.status.external_reference
                else {}
            ),
            "reversible": e.spec.reversible,
            **({"note": note} if (note := _note(e)) else {}),
            **_deciders(e),
            **({"inherited": True} if is_inherited(e) else {}),
        }
        for e in ordered
    ]
    return {
        "effects": listed[:MAX_REPORTED],
        "omitted": max(len(listed) - MAX_REPORTED, 0),
        **fate_lists(ordered),
    }


def unresolved(effects: Iterable[SideEffect]) -> list[SideEffect]:
    """Effects nobody knows the outcome of: they block automation and manual retries alike."""
    return [e for e in effects if _state(e) == SideEffectState.UNKNOWN]
