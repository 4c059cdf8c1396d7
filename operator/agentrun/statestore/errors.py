"""How the state store fails, classified so that callers decide without reading messages.

- `StoreUnavailable`: the store is down, slow, answered 5xx, timed out or refused the connection. Worth
  another try (inside the step, then a new Attempt); never a permanent failure.
- `StateUnverifiable`: a referenced blob is missing, or its bytes do not match the size and sha256 the
  reference recorded. The state cannot be rebuilt as it was: never retried automatically, never replaced
  by a shorter state. It names the key.
- `StoreRefused`: the store understood and said no (credentials refused, a 4xx): retrying as is cannot help.
- `StoreConfigError`: the URL (or the store behind it) cannot be used as configured.
"""

from __future__ import annotations


class StateStoreError(Exception):
    """Base of every error the state store raises."""


class StoreConfigError(StateStoreError, ValueError):
    """The state store URL is malformed, names an unknown option, or carries credentials."""


class StoreUnavailable(StateStoreError):
    """Transient: the store could not be reached or did not answer well in time."""

    def __init__(self, operation: str, key: str, detail: str) -> None:
        super().__init__(f"state store unavailable during {operation} of {key}: {detail}")
        self.operation = operation
        self.key = key


class StoreRefused(StateStoreError):
    """The store refused the request (credentials, permissions, a malformed request): not transient."""

    def __init__(self, operation: str, key: str, detail: str) -> None:
        super().__init__(f"state store refused {operation} of {key}: {detail}")
        self.operation = operation
        self.key = key


class StateUnverifiable(StateStoreError):
    """A referenced blob is missing or is not the content its reference names (size or sha256)."""

    def __init__(self, key: str, detail: str, *, missing: bool = False) -> None:
        super().__init__(f"state blob {key} cannot be verified: {detail}")
        self.key = key
        self.detail = detail
        # True when no object is at the key (a 404), False when one is there with other content.
        self.missing = missing
