"""Whether this operator replica may act, judged from kopf's peering object as kopf judges it.

kopf keeps one entry per replica in the peering object's status (`{identity: {priority, lifetime,
lastseen}}`), renewed as a heartbeat, and pauses a replica that sees a live peer of higher priority, or
of the same priority (then every such replica pauses). kopf offers no hook that tells its pause state,
so agentrun's runtime reads the same object and applies the same rule (tests/unit/test_peering.py pins
it against kopf's own function). A peer is live until `lastseen + lifetime`; an entry without a
lastseen counts as seen now, one without a lifetime as 60 s, without a priority as 0 (kopf's defaults).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

DEFAULT_LIFETIME_SECONDS: Final = 60


@dataclass(frozen=True)
class Peer:
    identity: str
    priority: int
    deadline: datetime  # when its heartbeat stops counting


@dataclass(frozen=True)
class Standing:
    """What a replica may do now: act, or stand by (and why), and in how many seconds the standing
    changes by itself (the heartbeat of a peer that blocks it runs out), None if it does not."""

    active: bool
    reason: str
    recheck_in: float | None = None


class MalformedPeering(ValueError):
    """A peering entry kopf itself could not judge: the standing stays as it was."""


def peers(status: Mapping[str, Any] | None, now: datetime) -> list[Peer]:
    """The entries of a peering object's status (kopf's shape), as peers."""
    found = []
    for identity, entry in (status or {}).items():
        if not isinstance(entry, Mapping):
            raise MalformedPeering(f"peer {identity!r}: {entry!r} is not an object")
        priority, seen = entry.get("priority", 0), entry.get("lastseen")
        if not isinstance(priority, int):  # kopf compares it as it is: not a number, its check fails
            raise MalformedPeering(f"peer {identity!r}: priority {priority!r} is not an integer")
        try:
            lifetime = timedelta(seconds=int(entry.get("lifetime", DEFAULT_LIFETIME_SECONDS)))
            last_seen = now if seen is None else datetime.fromisoformat(str(seen))
        except (TypeError, ValueError) as exc:
            raise MalformedPeering(f"peer {identity!r}: {exc}") from None
        if last_seen.tzinfo is None:  # kopf reads a time without a zone as UTC
            last_seen = last_seen.replace(tzinfo=UTC)
        found.append(Peer(str(identity), priority, last_seen + lifetime))
    return found


def standing(status: Mapping[str, Any] | None, *, identity: str, priority: int, now: datetime) -> Standing:
    """This replica's standing in one peering object (raises MalformedPeering on an entry kopf could
    not read either)."""
    live = [p for p in peers(status, now) if p.deadline > now and p.identity != identity]
    higher = [p for p in live if p.priority > priority]
    same = [p for p in live if p.priority == priority]
    blocking = higher or same
    if not blocking:
        return Standing(True, "no live peer of higher or equal priority")
    recheck_in = min((p.deadline - now).total_seconds() for p in higher + same)
    if higher:
        names = ", ".join(f"{p.identity} (priority {p.priority})" for p in higher)
        return Standing(False, f"a peer of higher priority is active: {names}", recheck_in)
    names = ", ".join(p.identity for p in same)
    reason = f"peers of the same priority {priority}: {names}; every one of them pauses"
    return Standing(False, reason, recheck_in)


def combined(standings: Mapping[str, Standing | None]) -> Standing:
    """The standing of a replica over all its peering objects (one per watched namespace, or one for
    the cluster), by where they are: active only when every one lets it act (kopf pauses on any). An
    object not read yet (None) holds it back, as kopf starts paused until it has read its peering."""
    reasons, rechecks = [], []
    for where, found in sorted(standings.items()):
        if found is None:
            reasons.append(f"{where}: the peering object is not read yet")
        elif not found.active:
            reasons.append(f"{where}: {found.reason}")
            if found.recheck_in is not None:
                rechecks.append(found.recheck_in)
    if reasons:
        return Standing(False, "; ".join(reasons), min(rechecks) if rechecks else None)
    return Standing(True, "no live peer of higher or equal priority")
