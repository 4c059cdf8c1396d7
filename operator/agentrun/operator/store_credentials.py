"""Whether a Run's namespace holds the Secret of its state-store credentials, asked of the API server.

Before a Pod takes the credentials by secretKeyRef, the operator reads the Secret (by name only: its RBAC
grants `get` on that one name, never a list of the namespace's Secrets), so a missing one fails the Run
with what to create (core.store_access) instead of leaving its Pod in CreateContainerConfigError. A
namespace found to hold it is not asked again for a while; one found without it is asked again at the
next look, so a Secret created since is seen at once.
"""

from __future__ import annotations

import logging

from agentrun.clock import Clock
from agentrun.core.pods import StateStorePodEnv
from agentrun.core.store_access import needs_secret
from agentrun.kubeapi import ApiError, KubeApi

log = logging.getLogger("agentrun.operator")

# How long a namespace found holding the Secret is taken as holding it (one deleted meanwhile is seen this
# late: its Pod then waits for the Secret, as Kubernetes shows).
FOUND_SECONDS = 60.0


class StoreCredentials:
    """The state store attempt Pods are told of, and which namespaces hold its credentials' Secret."""

    def __init__(self, api: KubeApi, clock: Clock, store: StateStorePodEnv | None) -> None:
        self.api, self.clock, self.store = api, clock, store
        self._found_until: dict[str, float] = {}
        self._unchecked_said = False

    async def missing(self, namespace: str) -> bool:
        """Whether attempt Pods of `namespace` would lack the store's Secret (False when no Secret is
        needed, or when this operator may not read it: it says so once, and Pods start as they would)."""
        if self.store is None or not needs_secret(self.store):
            return False
        until = self._found_until.get(namespace)
        if until is not None and self.clock.monotonic() < until:
            return False
        try:
            secret = await self.api.get(self.api.core_path("secrets", namespace, self.store.secret))
            found = secret is not None
        except ApiError as exc:
            if exc.status != 403:
                raise
            if not self._unchecked_said:
                self._unchecked_said = True
                log.warning(
                    "cannot check for the state store's Secret %s in agents' namespaces (%s): grant the "
                    "operator `get secrets` on that name, as its chart does",
                    self.store.secret,
                    exc,
                )
            found = True
        if found:
            self._found_until[namespace] = self.clock.monotonic() + FOUND_SECONDS
        else:
            self._found_until.pop(namespace, None)
        return not found
