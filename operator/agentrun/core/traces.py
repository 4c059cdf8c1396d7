"""One W3C trace per Run, with no write to make it so.

The trace comes from the Run's `agentrun.dev/traceparent` annotation when the user set one (the Run then
joins the caller's trace), else it is derived from the Run's UID; the Run's span and each Attempt's span
have ids derived the same way. Anyone who can read the Run (the operator, the attempt Pod via
TRACEPARENT, a person with kubectl) computes the same ids, so spans exported by different processes,
at different times, even after a crash, join one tree: Run -> Attempt -> step, side effect, commit.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

TRACEPARENT_ANNOTATION: Final = "agentrun.dev/traceparent"
TRACEPARENT_ENV: Final = "TRACEPARENT"
# version 00: 2 hex version, 32 hex trace id, 16 hex parent span id, 2 hex flags; all-zero ids are invalid
_TRACEPARENT: Final = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(frozen=True)
class SpanRef:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    sampled: bool = True

    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def parse_traceparent(value: str | None) -> SpanRef | None:
    """A valid W3C traceparent as a SpanRef; None for anything else (an invalid header is ignored, as
    the W3C spec asks, and the Run gets its own trace)."""
    match = _TRACEPARENT.match((value or "").strip().lower())
    if not match:
        return None
    version, trace_id, span_id, flags = match.groups()
    if version == "ff" or trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return SpanRef(trace_id, span_id, sampled=bool(int(flags, 16) & 1))


def _hex(*parts: str, digits: int) -> str:
    value = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:digits]
    return value if value.strip("0") else "1".rjust(digits, "0")


@dataclass(frozen=True)
class RunTrace:
    """Where a Run's spans go: its trace, the span above the Run's (the user's, if any), the Run's span."""

    parent: SpanRef | None  # the caller's span from the annotation; None: the Run's span is the root
    run: SpanRef

    def attempt(self, attempt_name: str) -> SpanRef:
        """The span of one Attempt: a child of the Run's; the attempt Pod's spans are its children."""
        return SpanRef(self.run.trace_id, _hex("attempt", self.run.span_id, attempt_name, digits=16))


def run_trace(uid: str, annotations: dict[str, str] | None) -> RunTrace:
    caller = parse_traceparent((annotations or {}).get(TRACEPARENT_ANNOTATION))
    trace_id = caller.trace_id if caller else _hex("trace", uid, digits=32)
    sampled = caller.sampled if caller else True
    return RunTrace(parent=caller, run=SpanRef(trace_id, _hex("run", uid, digits=16), sampled))
