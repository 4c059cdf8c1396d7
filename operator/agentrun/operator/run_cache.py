"""The Runs as the operator last saw them, for reconciles that need no read of the Run."""

from __future__ import annotations

import zlib
from typing import Any

from agentrun.api import Run
from agentrun.api.phases import STOPPED_PHASES, WAITING_PHASES
from agentrun.kubeapi import api_json
from agentrun.operator.cache import Key, version_of

JsonDict = dict[str, Any]
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Where a Run rests, until a person or its deadline moves it: the Runs kept for long are in these.
AT_REST = STOPPED_PHASES | WAITING_PHASES


class RunCache:
    """The Runs as last seen in a watch event or in the response of one of our own writes: the object
    without managedFields and kubectl's last-applied copy (what decide reads), kept as compact JSON
    (the parsed object is ten times its JSON) and parsed again at each reconcile (tens of microseconds,
    beside a reconcile's milliseconds). A Run at rest is kept compressed (about 1 KiB a finished Run);
    a moving one is not: it is put again at each of its writes, and compressing was the largest part
    of a put's CPU."""

    def __init__(self) -> None:
        # resourceVersion, uid, the JSON, whether it is zlib'd, whether it carries managedFields
        self._runs: dict[Key, tuple[int | None, str, bytes, bool, bool]] = {}

    @staticmethod
    def key_of(body: JsonDict) -> Key:
        metadata = body.get("metadata") or {}
        return str(metadata.get("namespace")), str(metadata.get("name"))

    def put(self, body: JsonDict) -> bool:
        """Takes a version of a Run in; False (and nothing changes) if it is no newer than the cached one:
        the echo of our own write, or an event older than a write's response."""
        key, version = self.key_of(body), version_of(body)
        cached = self._runs.get(key)
        metadata = body.get("metadata") or {}
        if cached is not None and metadata.get("uid") == cached[1]:
            known = cached[0]
            if version is not None and known is not None and version <= known:
                return False
        kept = {k: v for k, v in metadata.items() if k != "managedFields"}
        if LAST_APPLIED in (kept.get("annotations") or {}):
            kept["annotations"] = {k: v for k, v in kept["annotations"].items() if k != LAST_APPLIED}
        text = api_json({**body, "metadata": kept})  # kopf parses with json: an int may pass 64 bits
        at_rest = (body.get("status") or {}).get("phase") in AT_REST
        uid = str(metadata.get("uid"))
        managed = bool(metadata.get("managedFields"))
        self._runs[key] = (version, uid, zlib.compress(text, 1) if at_rest else text, at_rest, managed)
        return True

    def get(self, key: Key) -> Run | None:
        cached = self._runs.get(key)
        if cached is None:
            return None
        _, _, text, compressed, _ = cached
        return Run.model_validate_json(zlib.decompress(text) if compressed else text)

    def has_managed_fields(self, key: Key) -> bool:
        """Whether the Run, as last seen, carries metadata.managedFields."""
        cached = self._runs.get(key)
        return cached is not None and cached[4]

    def resource_version(self, key: Key) -> str | None:
        cached = self._runs.get(key)
        return None if cached is None or cached[0] is None else str(cached[0])

    def known(self) -> list[Key]:
        """The keys of every Run cached."""
        return list(self._runs)

    def remove(self, key: Key) -> None:
        self._runs.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._runs

    def __len__(self) -> int:
        return len(self._runs)
