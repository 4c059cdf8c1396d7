"""What the store reports about each request: for metrics, without tying the store to an exporter.

The worker SDK and the operator both use the store; only the operator exports Prometheus metrics
(agentrun.operator.storemetrics turns these records into counters and a histogram).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

Operation = Literal["put", "get", "verify", "list", "copy", "delete"]
Outcome = Literal["created", "exists", "ok", "missing", "mismatch", "unavailable", "refused"]

OPERATIONS: Final[tuple[Operation, ...]] = ("put", "get", "verify", "list", "copy", "delete")
OUTCOMES: Final[tuple[Outcome, ...]] = (
    # put: written now, or already there (then verified by a "verify" request)
    "created",
    "exists",
    # get and verify: the bytes matched the reference
    "ok",
    # get and verify: no object at the key, or not the content the reference names
    "missing",
    "mismatch",
    # any operation: transient, or refused by the store
    "unavailable",
    "refused",
)


@dataclass(frozen=True)
class StoreRequest:
    """One request to the store: put (a blob written put-if-absent), get (a blob read and verified), or
    verify (an existing blob read back after a put found it there); and the operator's own list, copy
    and delete (statestore.operatorstore), which move no bytes through the client. `size` is the bytes
    moved: sent by a put that created, received by a read; 0 when nothing moved."""

    operation: Operation
    outcome: Outcome
    seconds: float
    size: int


Observer = Callable[[StoreRequest], None]
