"""The operator's log output: human text (the default) or one JSON object per line.

JSON lines carry time, level, logger and message, and the fields `run`, `namespace` and `attempt` when the
record has them: given with `extra={...}` at the call, or bound for a stretch of code with `bound(...)`
(the reconciler binds the Run it works on, so every line logged while it reconciles names that Run).
"""

from __future__ import annotations

import contextvars
import datetime
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

FORMATS: Final = ("text", "json")
FIELDS: Final = ("run", "namespace", "attempt")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_bound: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "agentrun_log_fields", default=None
)


@contextmanager
def bound(**fields: str) -> Iterator[None]:
    """Log records made in this context (this asyncio task, or this thread) carry these fields."""
    token = _bound.set({**(_bound.get() or {}), **fields})
    try:
        yield
    finally:
        _bound.reset(token)


class ContextFilter(logging.Filter):
    """Copies the bound fields onto a record, unless the call gave them itself (with extra=)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in (_bound.get() or {}).items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def _time(created: float) -> str:
    moment = datetime.datetime.fromtimestamp(created, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (RFC 3339, UTC), level, logger, message, and the agentrun fields
    the record has; kopf's object references (k8s_ref) add `object` (and `namespace` if missing)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = str(value)
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict) and ref.get("name"):
            entry["object"] = f"{ref.get('kind', '')}/{ref['name']}".lstrip("/")
            if ref.get("namespace"):
                entry.setdefault("namespace", str(ref["namespace"]))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def handler(log_format: str) -> logging.Handler:
    if log_format not in FORMATS:
        raise ValueError(f"unknown log format {log_format!r}: one of {', '.join(FORMATS)}")
    out = logging.StreamHandler()
    out.addFilter(ContextFilter())
    out.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    return out


def configure(log_format: str, level: int) -> None:
    """Sends every log record (the operator's, kopf's, the Kubernetes client's) to stderr, formatted."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler(log_format))
    root.setLevel(level)
