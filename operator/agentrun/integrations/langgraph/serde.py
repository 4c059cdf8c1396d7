"""Checkpoint serialization with a strict allow-list: a Checkpoint must never be a way to run code.

LangGraph's msgpack format names classes (module, name) and its reader imports and calls them. Anyone
who can create a Checkpoint in the namespace could plant a payload naming `os.system`. So before
anything is decoded, the payload is walked without constructing anything, and one class (or method)
outside the allow-list refuses the whole Checkpoint: it is not loaded, not even partly.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import ormsgpack
from langgraph.checkpoint.serde._msgpack import SAFE_MSGPACK_METHODS, SAFE_MSGPACK_TYPES
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from agentrun.worker import PermanentError

# LangGraph's msgpack extension codes (langgraph.checkpoint.serde.jsonplus): the wire format.
_CONSTRUCTORS: Final = frozenset({0, 1, 2, 4, 5})  # single arg, args, kwargs, pydantic v1, v2
_METHOD: Final = 3
_NUMPY: Final = 6
_DELTA_SNAPSHOT: Final = 7
# Only these encodings are read: "pickle" (and anything unknown) is refused outright.
LOADABLE: Final = frozenset({"null", "bytes", "bytearray", "msgpack"})

TypeKey = tuple[str, ...]


class UnsafeCheckpoint(PermanentError):
    """A stored checkpoint names a class or encoding outside the allow-list: refused, not loaded."""


def type_key(entry: TypeKey | type) -> TypeKey:
    if isinstance(entry, type):
        return (entry.__module__, entry.__qualname__)
    return tuple(entry)


class AllowListSerializer:
    """LangGraph's serializer (msgpack) for writing; for reading, only the allow-listed classes:
    LangGraph's own safe types (messages, Send, Interrupt, Command, datetime, ...) plus `allowed`."""

    def __init__(self, allowed: Iterable[TypeKey | type] = ()) -> None:
        self.allowed: frozenset[TypeKey] = SAFE_MSGPACK_TYPES | {type_key(e) for e in allowed}
        # strict mode: an explicit list, so LangGraph's own reader refuses the rest too
        self._inner = JsonPlusSerializer(allowed_msgpack_modules=tuple(self.allowed))

    def with_types(self, extra: Iterable[TypeKey | type]) -> AllowListSerializer:
        """A serializer that also reads `extra` (the types of a graph's own state schema)."""
        return AllowListSerializer(self.allowed | {type_key(e) for e in extra})

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self._inner.dumps_typed(obj)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        encoding, payload = data
        if encoding not in LOADABLE:
            raise UnsafeCheckpoint(
                f"refused a checkpoint value encoded as {encoding!r}: only msgpack is read"
            )
        if encoding == "msgpack":
            self.audit(payload)
        return self._inner.loads_typed(data)

    def audit(self, payload: bytes) -> None:
        """Raises UnsafeCheckpoint if `payload` names a class or method outside the allow-list; walks
        the payload without importing or calling anything."""
        refused: list[str] = []

        def walk(code: int, data: bytes) -> None:
            inner = ormsgpack.unpackb(data, ext_hook=walk, option=ormsgpack.OPT_NON_STR_KEYS)
            if code == _DELTA_SNAPSHOT:
                return None
            if code in _CONSTRUCTORS and _named(inner) and tuple(inner[:2]) in self.allowed:
                return None
            if (
                code == _METHOD
                and _named(inner, 4)
                and (inner[0], inner[1], inner[3]) in SAFE_MSGPACK_METHODS
            ):
                return None
            if code == _NUMPY and ("numpy", "ndarray") in self.allowed:
                return None
            refused.append(_describe(code, inner))
            return None

        try:
            ormsgpack.unpackb(payload, ext_hook=walk, option=ormsgpack.OPT_NON_STR_KEYS)
        except ormsgpack.MsgpackDecodeError as exc:
            raise UnsafeCheckpoint(f"refused a checkpoint value that is not valid msgpack: {exc}") from None
        if refused:
            raise UnsafeCheckpoint(
                f"refused a checkpoint naming {', '.join(sorted(set(refused)))}: not in the allow-list "
                "(add your own state types with AgentrunSaver(allowed_types=...)); it was not loaded"
            )


def _named(value: Any, size: int = 3) -> bool:
    return (
        isinstance(value, list | tuple) and len(value) >= size and all(isinstance(v, str) for v in value[:2])
    )


def _describe(code: int, value: Any) -> str:
    if _named(value, 2):
        name = f"{value[0]}.{value[1]}"
        return f"{name}.{value[3]}" if code == _METHOD and len(value) > 3 else name
    return f"extension type {code}"
