"""Byte budgets: how large each agentrun object, and each free-form JSON field in it, may grow.

Why: etcd refuses a write over its request limit (1.5 MiB by default), and the API server answers it
with a 500 that looks like an outage. So every object must fit with room to spare: the CRD bounds
every string, list and map (checked by the API server), and the free-form JSON fields, which CEL
cannot measure, have a budget here that their writer measures before sending (the SDK for result,
checkpoint state, interrupt schema and side-effect result; the operator for what it copies or
starts from: input, resume value, Pod template). tests/unit/test_budgets.py adds up the declared
maxima of each kind from its generated CRD schema and these budgets, and checks they fit.

Sizes are of the JSON the API server stores (see stored_size), not of Python objects.
"""

from __future__ import annotations

import json
from typing import Final

from pydantic import JsonValue

KIB: Final = 1024

# etcd's default --max-request-bytes: the largest object (plus a little framing) etcd accepts.
ETCD_REQUEST_LIMIT: Final = 1536 * KIB
# metadata: annotations may take 256 KiB (the API server's own limit, which kubectl's
# last-applied-configuration counts against); labels, owners, finalizers and managedFields the rest.
METADATA_ALLOWANCE: Final = 320 * KIB

# A Run's whole status (its declared maxima: who answered, approved and resolved, the action an approval
# shows, then a finished Run's checkpoint index, expiry and fork source, took it past 256 KiB; the Run
# still fits etcd; then the accepted answer's value, 64 KiB more, so that no later spec.resume can take
# it away), and an inline Checkpoint state (larger state goes to spec.stateRef).
RUN_STATUS_BUDGET: Final = 356 * KIB
CHECKPOINT_STATE_BUDGET: Final = 256 * KIB

# Free-form fields inside the Run status budget (the bounded rest of the status takes < 200 KiB).
RESULT_BUDGET: Final = 64 * KIB
ACCEPTED_SCHEMA_BUDGET: Final = 16 * KIB
# The request an approval shows (pendingRequest.action.request); a larger one is left out, its digest kept.
ACTION_REQUEST_BUDGET: Final = 8 * KIB
# Free-form fields of a Run's spec; with its bounded fields they leave the status budget free.
RUN_INPUT_BUDGET: Final = 256 * KIB
RESUME_VALUE_BUDGET: Final = 64 * KIB  # also an Attempt's spec.input, which carries the answer
POD_SPEC_BUDGET: Final = 128 * KIB
SIDE_EFFECT_RESULT_BUDGET: Final = 64 * KIB

# kind -> path of each free-form field in its CRD schema -> its budget.
FREE_JSON_BUDGETS: Final[dict[str, dict[str, int]]] = {
    "Run": {
        ".spec.input": RUN_INPUT_BUDGET,
        ".spec.resume.value": RESUME_VALUE_BUDGET,
        ".spec.agent.podTemplate.spec": POD_SPEC_BUDGET,
        ".status.result": RESULT_BUDGET,
        ".status.acceptedInput.value": RESUME_VALUE_BUDGET,
        ".status.pendingRequest.acceptedSchema": ACCEPTED_SCHEMA_BUDGET,
        ".status.pendingRequest.action.request": ACTION_REQUEST_BUDGET,
    },
    "Attempt": {".spec.input": RESUME_VALUE_BUDGET},
    "Checkpoint": {".spec.state": CHECKPOINT_STATE_BUDGET},
    "SideEffect": {".status.result": SIDE_EFFECT_RESULT_BUDGET},
}

STORE_ELSEWHERE: Final = "store large data elsewhere (a bucket, a volume) and keep a reference to it here"

# Characters Go's encoding/json (the API server's) escapes as \u00XX or \u20XX: 6 bytes each.
_SIX_BYTE_ESCAPES: Final = ("<", ">", "&", "\u2028", "\u2029")


def stored_size(value: JsonValue) -> int:
    """Bytes of `value` as the API server stores it: compact JSON, UTF-8, HTML characters escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    escaped = sum(text.count(char) * (6 - len(char.encode())) for char in _SIX_BYTE_ESCAPES)
    return len(text.encode()) + escaped


def over_budget(what: str, value: JsonValue, budget: int, advice: str = STORE_ELSEWHERE) -> str | None:
    """Why `value` cannot be written as `what`, or None when it fits its budget."""
    size = stored_size(value)
    if size <= budget:
        return None
    return f"{what} is {size} bytes of JSON, over its budget of {budget} bytes: {advice}"
