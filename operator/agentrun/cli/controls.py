"""The control requests the plugin writes: default keys, local checks and the patches themselves.

Pure functions: the commands read the Run, ask these what to send, and send it. `by` is the sender's
user name as the API server knows it (SelfSubjectReview, what `kubectl auth whoami` shows): every request
names its sender with it (the API server refuses any other name), and a default key covers it, so two
people sending the same request at once send two requests and each sees the operator's verdict on their
own.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import jsonschema
from pydantic import JsonValue

from agentrun.api import ControlRecord, Run, json_digest
from agentrun.api.common import IDENTIFIER_PATTERN, MAX_IDENTIFIER_LENGTH

IDENTIFIER_RULE = (
    f"1 to {MAX_IDENTIFIER_LENGTH} characters: letters, digits and . _ : / @ = + -, "
    "starting and ending with a letter or digit"
)


def identifier_problem(value: str) -> str | None:
    """Why the API server would refuse `value` as an idempotency key or request id (the CRD's pattern
    and length), or None: checked before anything is sent."""
    if len(value) > MAX_IDENTIFIER_LENGTH:
        return f"it is {len(value)} characters long; a key is {IDENTIFIER_RULE}"
    if not re.fullmatch(IDENTIFIER_PATTERN, value):
        return f"a key is {IDENTIFIER_RULE}"
    return None


def _short_hash(*parts: object, by: str | None = None) -> str:
    named = (*parts, by) if by else parts
    return hashlib.sha256("\n".join(str(p) for p in named).encode()).hexdigest()[:20]


def _named(request: dict[str, Any], field: str, by: str | None) -> dict[str, Any]:
    return {**request, field: by} if by else request


def resume_key(
    run_uid: str, request_id: str, checkpoint_id: str, value: JsonValue, by: str | None = None
) -> str:
    """The default idempotency key of a resume: the same answer of the same person to the same request
    of the same Run always gets the same key, so repeating a command changes nothing."""
    return f"cli-resume-{_short_hash(run_uid, request_id, checkpoint_id, json_digest(value), by=by)}"


def retry_key(run: Run, from_checkpoint: str | None, reason: str | None, by: str | None = None) -> str:
    """The default key of a manual retry: one per failure of the Run (its attempt count), so a double
    click asks for one Attempt, and a retry after the next failure is a new request."""
    failure = run.status.failure.fingerprint if run.status.failure else None
    parts = (run.metadata.uid, run.status.attempts or 0, failure, from_checkpoint or "", reason or "")
    return f"cli-retry-{_short_hash(*parts, by=by)}"


def pause_request_id(run: Run, reason: str | None) -> str:
    """The default id of a pause: one per Attempt and checkpoint, so repeating it asks for one pause."""
    parts = (run.metadata.uid, run.status.attempts or 0, run.status.latest_checkpoint or "", reason or "")
    return f"cli-pause-{_short_hash(*parts)}"


def schema_problem(value: JsonValue, schema: dict[str, Any] | None) -> str | None:
    """Why `value` does not satisfy the pending request's JSON Schema (the operator's wording), or None."""
    if schema is None:
        return None
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"value at {where}: {exc.message}"
    except jsonschema.SchemaError as exc:
        return f"the request's schema is invalid: {exc.message}"
    return None


def recorded(run: Run, key: str) -> ControlRecord | None:
    """The outcome the operator recorded for `key`, if it has processed it."""
    return next((c for c in run.status.controls or [] if c.idempotency_key == key), None)


def resume_operations(  # noqa: PLR0917 (the answer's fields, in their order)
    resource_version: str,
    request_id: str,
    checkpoint_id: str,
    value: JsonValue,
    key: str,
    by: str | None = None,
) -> list[dict[str, Any]]:
    """A JSON patch that sets spec.resume as a whole, only on the version of the Run it was judged on.

    Not a merge patch: that would merge an object value into the previous answer's value (keys of the
    old answer would survive in the new one).
    """
    answer = {"requestId": request_id, "checkpointId": checkpoint_id, "value": value, "idempotencyKey": key}
    resume = _named(answer, "answeredBy", by)
    return [
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "add", "path": "/spec/resume", "value": resume},
    ]


def retry_patch(
    key: str, from_checkpoint: str | None, reason: str | None, by: str | None = None
) -> dict[str, Any]:
    # Explicit nulls: a merge patch would otherwise keep fields of an earlier retryRequest.
    request = {"idempotencyKey": key, "fromCheckpoint": from_checkpoint, "reason": reason, "requestedBy": by}
    return {"spec": {"retryRequest": request}}


def pause_patch(request_id: str, reason: str | None) -> dict[str, Any]:
    return {"spec": {"pause": {"requestId": request_id, "reason": reason}}}


def compensate_key(run: Run, effects: list[str], by: str | None = None) -> str:
    """The default key of a compensate request: one per Attempt count and set of effects, so a repeat
    asks for one compensation, and a request after that compensation ran is a new one."""
    parts = (run.metadata.uid, run.status.attempts or 0, *sorted(effects))
    return f"cli-compensate-{_short_hash(*parts, by=by)}"


def compensate_patch(key: str, effects: list[str], by: str | None = None) -> dict[str, Any]:
    # Explicit nulls: a merge patch would otherwise keep the effects (or the name) of an earlier request.
    request = {"idempotencyKey": key, "effects": sorted(effects) or None, "requestedBy": by}
    return {"spec": {"compensateRequest": request}}


def cancel_key(run: Run, epoch: int, reason: str | None, by: str | None = None) -> str:
    """The default key of a cancel: one per target epoch and reason, so a repeat sends the same request."""
    return f"cli-cancel-{_short_hash(run.metadata.uid, epoch, reason or '', by=by)}"


def cancel_request(key: str, reason: str | None, by: str | None = None) -> dict[str, Any]:
    """spec.cancelRequest, for cancel_operations: the whole object (a JSON patch replaces it)."""
    request = {"idempotencyKey": key, **({"reason": reason} if reason else {})}
    return _named(request, "requestedBy", by)


def cancel_operations(
    observed: int | None, resource_version: str | None, request: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The compare-and-swap on spec.cancelEpoch: it only applies while the epoch is still `observed`;
    `request` (spec.cancelRequest: idempotencyKey, reason) goes in the same write.

    A Run stored without the field (it has a default, so only an old object) is guarded by its
    resourceVersion instead.
    """
    explained = [{"op": "add", "path": "/spec/cancelRequest", "value": request}] if request else []
    if observed is None:
        return [
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "add", "path": "/spec/cancelEpoch", "value": 1},
            *explained,
        ]
    return [
        {"op": "test", "path": "/spec/cancelEpoch", "value": observed},
        {"op": "replace", "path": "/spec/cancelEpoch", "value": observed + 1},
        *explained,
    ]
