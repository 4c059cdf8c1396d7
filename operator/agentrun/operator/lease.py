"""When the holder's Lease of each Run runs out, on the operator's clock, looked at without reading the
Run: from when this operator first saw the Lease's current version (a renewal is a new version) and the
duration the Run's spec gives (never the Lease's own leaseDurationSeconds: its holder may write it)."""

from __future__ import annotations

from typing import Final

from agentrun.api import lease_name
from agentrun.clock import Clock
from agentrun.core.identity import owned_by
from agentrun.core.lease import LeaseView, lease_view, seconds_until_expiry
from agentrun.operator.cache import Key, OwnedObjects

# A lease check comes this long after the expiry, so that it finds the Lease expired, not just about to.
LEASE_CHECK_SLACK: Final = 0.05


class LeaseExpiry:
    def __init__(self, cache: OwnedObjects, clock: Clock) -> None:
        self.cache = cache
        self.clock = clock
        # The uid and spec.lease.durationSeconds of each Run, as last decided on.
        self._runs: dict[Key, tuple[str, int]] = {}

    def remember(self, key: Key, uid: str, duration_seconds: int) -> None:
        """The Run as it is decided on now: whose Lease to look at, and for how long it holds."""
        self._runs[key] = (uid, duration_seconds)

    def forget(self, key: Key) -> None:
        self._runs.pop(key, None)

    def lease(self, key: Key) -> LeaseView | None:
        """The Run's Lease, from the cache, if the Run controls it."""
        name, (uid, _) = lease_name(key[1]), self._runs.get(key, ("", 0))
        lease = next(
            (
                o
                for o in self.cache.of("leases", key)
                if o["metadata"]["name"] == name and owned_by(o, uid, controller=True)
            ),
            None,
        )
        return lease_view(lease) if lease else None

    def expires_in(self, key: Key, lease: LeaseView | None) -> float | None:
        """Seconds until the holder's Lease runs out (<= 0: it has), None before the Lease was seen."""
        if lease is None or key not in self._runs:
            return None
        duration = self._runs[key][1]
        sighting = self.cache.sighting(key[0], lease_name(key[1]))
        started = self.cache.running_seen(key[0], lease.holder) if lease.holder else None
        return seconds_until_expiry(sighting, duration, self.clock.monotonic(), started)

    def due(self, key: Key) -> float | None:
        """The holder's Lease was due to expire (the work queue's lease check). Renewed since (as a
        healthy worker does every renewSeconds): the seconds until the new expiry, no reconcile.
        Otherwise None: the Run is decided again, which judges the expiry. A change of holder or epoch
        queues the Run through its watch event anyway."""
        left = self.expires_in(key, self.lease(key))
        return left + LEASE_CHECK_SLACK if left is not None and left > 0 else None
