"""Delta ancestry: what a LangGraph checkpoint's state is rebuilt from, recorded when it is saved and
walked when it is read, without I/O.

A DeltaChannel (beta in LangGraph 1.x) stores no value in most checkpoints: its value is rebuilt by
replaying the writes of every ancestor back to the nearest one that stores a value (a snapshot, every
`snapshot_frequency` updates, or the thread's root). So a checkpoint is only whole with that chain of
ancestors and their writes. When saving, the saver records per delta channel where that walk ends
(`deltaSeeds`) and the oldest such ancestor (the Checkpoint's `spec.deltaBase`), which retention keeps.
When reading, it walks the chain itself (LangGraph's default walk stops quietly at the first missing
ancestor and rebuilds a shorter state): a missing ancestor, or missing writes where a channel changed,
is StateUnverifiable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import DeltaChannelHistory, PendingWrite
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from agentrun.worker import StateUnverifiable

COUNTERS = "counters_since_delta_snapshot"  # LangGraph's metadata key: one entry per delta channel


@dataclass(frozen=True)
class Seed:
    """Where the walk for one delta channel ends, starting at a given checkpoint (inclusive)."""

    checkpoint: str
    sequence: int

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "sequence": self.sequence}

    @classmethod
    def from_json(cls, value: Any) -> Seed | None:
        if isinstance(value, dict) and isinstance(value.get("checkpoint"), str):
            sequence = value.get("sequence")
            if isinstance(sequence, int) and not isinstance(sequence, bool):
                return cls(value["checkpoint"], sequence)
        return None


def seeds_of(stored: Any) -> dict[str, Seed]:
    """The deltaSeeds a State checkpoint's stored JSON records (none for one saved before them)."""
    found = stored.get("deltaSeeds") if isinstance(stored, dict) else None
    if not isinstance(found, dict):
        return {}
    return {ch: seed for ch, value in found.items() if (seed := Seed.from_json(value)) is not None}


def delta_channels(checkpoint: Mapping[str, Any], metadata: Mapping[str, Any]) -> set[str]:
    """The delta channels of a checkpoint LangGraph is saving: those it counts updates for since their
    last snapshot, and those it snapshots now."""
    counters = metadata.get(COUNTERS) or {}
    values = checkpoint.get("channel_values") or {}
    return set(counters) | {k for k, v in values.items() if isinstance(v, _DeltaSnapshot)}


@dataclass(frozen=True)
class Recorded:
    seeds: dict[str, Seed]  # every delta channel known here: where its walk from here ends
    base: Seed | None  # the oldest ancestor this checkpoint's state is rebuilt from
    unknown: frozenset[str]  # delta channels the parent recorded nothing for: walk to find their seed


def record(
    name: str,
    sequence: int,
    checkpoint: Mapping[str, Any],
    metadata: Mapping[str, Any],
    parent_seeds: Mapping[str, Seed] | None,
) -> Recorded:
    """The delta ancestry of checkpoint `name` (at `sequence`), from its parent's (None: no parent).

    A channel stored in this checkpoint ends its walk here; any other ends where its walk from the
    parent ends (the parent's seed), or at this checkpoint when it is the root. The base is the oldest
    seed of the channels this checkpoint's state replays (versioned, no value stored here)."""
    values = checkpoint.get("channel_values") or {}
    versions = checkpoint.get("channel_versions") or {}
    here = Seed(name, sequence)
    seeds: dict[str, Seed] = {}
    unknown: set[str] = set()
    for ch in delta_channels(checkpoint, metadata) | set(parent_seeds or {}):
        if ch in values or parent_seeds is None:
            seeds[ch] = here
        elif ch in parent_seeds:
            seeds[ch] = parent_seeds[ch]
        else:
            unknown.add(ch)
    replayed = [seeds[ch] for ch in seeds if ch in versions and ch not in values and seeds[ch] != here]
    base = min(replayed, key=lambda s: s.sequence) if replayed else None
    return Recorded(seeds, base, frozenset(unknown & set(versions)))


def seed_by_walking(start: str, channel: str, states: Mapping[str, Stored]) -> Seed | None:
    """Where the walk for `channel` from `start` (inclusive) ends: the nearest checkpoint storing its
    value, else the last one reachable (the root, or the last before a missing ancestor). For a parent
    saved without deltaSeeds (before they were recorded)."""
    node = states.get(start)
    while node is not None:
        if channel in node.values or node.parent is None or node.parent not in states:
            return Seed(node.name, node.sequence)
        node = states[node.parent]
    return None


@dataclass(frozen=True)
class Stored:
    """What the walk reads of one State checkpoint of a thread."""

    name: str
    sequence: int
    parent: str | None  # the parent's checkpoint name
    values: Mapping[str, Any]  # channel_values, decoded
    versions: Mapping[str, Any]  # channel_versions


def history(
    target: str,
    states: Mapping[str, Stored],
    pending: Mapping[str, Sequence[PendingWrite]],
    channels: Sequence[str],
) -> dict[str, DeltaChannelHistory]:
    """LangGraph's delta-channel history of checkpoint `target` (BaseCheckpointSaver's contract): per
    channel, the writes of each ancestor from the parent back to the nearest one storing the channel's
    value (its seed), oldest first; no seed when the walk reached the root.

    `states` are the thread's State checkpoints by name, `pending` each one's writes in
    writes_sort_key order. Raises StateUnverifiable when an ancestor on the way is missing, or when a
    channel changed between an ancestor and its child without any write of it stored at the ancestor:
    then the rebuilt value would silently lack what was lost."""
    if not channels:
        return {}
    if target not in states:
        raise StateUnverifiable(f"the checkpoint {target} is missing: its state cannot be rebuilt")
    collected: dict[str, list[PendingWrite]] = {ch: [] for ch in channels}
    seeds: dict[str, Any] = {}
    remaining = set(channels)
    child = states[target]
    while child.parent is not None and remaining:
        node = states.get(child.parent)
        if node is None:
            raise StateUnverifiable(
                f"the state of checkpoint {target} cannot be rebuilt: its ancestor {child.parent} is "
                f"missing, and the channels {sorted(remaining)} replay the writes of every ancestor back "
                "to their last snapshot; it was not loaded (restore that checkpoint, or retry the Run "
                "from a checkpoint whose state is whole)"
            )
        writes = pending.get(node.name, ())
        written = {w[1] for w in writes}
        for ch in sorted(remaining):
            changed = child.versions.get(ch) != node.versions.get(ch)
            if changed and ch not in child.values and ch not in written:
                raise StateUnverifiable(
                    f"the state of checkpoint {target} cannot be rebuilt: the channel {ch} changed "
                    f"between {node.name} and {child.name}, and no write of it is stored for "
                    f"{node.name} (its Writes are missing); it was not loaded"
                )
        for write in reversed(writes):
            if write[1] in remaining:
                collected[write[1]].append(write)
        for ch in sorted(remaining):
            if ch in node.values:
                seeds[ch] = node.values[ch]
                remaining.discard(ch)
        child = node
    result: dict[str, DeltaChannelHistory] = {}
    for ch in channels:
        entry: DeltaChannelHistory = {"writes": list(reversed(collected[ch]))}
        if ch in seeds:
            entry["seed"] = seeds[ch]
        result[ch] = entry
    return result
