"""Objects of the agentrun.dev API for tests: valid ones, and bad input that must be refused.

Shared by tests/unit (which checks the bad input against the generated OpenAPI schemas and the pydantic
models) and tests/integration (which sends it to a real API server).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Final

import yaml

REPO: Final = Path(__file__).resolve().parents[2]
CRD_DIR: Final = REPO / "crds"
EXAMPLES: Final = REPO / "examples"

RUN_EXAMPLES: Final = sorted(EXAMPLES.glob("run-*.yaml"))
PATCH_EXAMPLES: Final = sorted(EXAMPLES.glob("*.patch.yaml"))


def load_yaml(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


DELETE: Final = _Delete()
"""A value for set_path that removes the field instead of setting it."""


def set_path(document: dict[str, Any], path: str, value: Any) -> None:
    """Sets (or, with DELETE, removes) the field at a path like .spec.lease.durationSeconds."""
    *parents, last = path.strip(".").split(".")
    node = document
    for name in parents:
        node = node.setdefault(name, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = copy.deepcopy(value)


def with_changes(document: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of document with set_path applied for every path: value in changes."""
    changed = copy.deepcopy(document)
    for path, value in changes.items():
        set_path(changed, path, value)
    return changed


# --- valid objects ------------------------------------------------------------------------------------

VALID_OBJECTS: dict[str, dict[str, Any]] = {
    "Run": load_yaml(EXAMPLES / "run-minimal.yaml"),
    "Attempt": {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Attempt",
        "metadata": {"name": "echo-a1"},
        "spec": {"runName": "echo", "number": 1, "leaseEpoch": 1, "cancelEpoch": 0, "reason": "initial"},
    },
    "Checkpoint": {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Checkpoint",
        "metadata": {"name": "echo-ckpt-1"},
        "spec": {"runName": "echo", "id": "ckpt-1", "sequence": 1, "attempt": "echo-a1", "leaseEpoch": 1},
    },
    "SideEffect": {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "SideEffect",
        "metadata": {"name": "echo-sfx-1"},
        "spec": {"runName": "echo", "tool": "create_ticket", "idempotencyKey": "echo/ticket/1"},
        "status": {"state": "Pending"},
    },
}


def valid_object(kind: str, name: str | None = None, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A fresh copy of the valid object of a kind, optionally renamed and changed (see with_changes)."""
    obj = with_changes(VALID_OBJECTS[kind], changes or {})
    if name is not None:
        obj["metadata"] = {"name": name}
    return obj


# --- bad input ----------------------------------------------------------------------------------------
# Each entry: a path of the valid object of the kind and a value that makes the object invalid for the
# OpenAPI part of the schema (CEL rules need an API server: see
# tests/integration/namespaced/test_api_corpus.py).

BAD_RUNS: list[tuple[str, Any]] = [
    (".spec.agent", DELETE),
    (".spec.retry.maxAttempts", 0),
    (".spec.retry.maxAttempts", 101),
    (".spec.retry.maxAttempts", "three"),
    (".spec.retry.retryOn", ["transient", "sometimes"]),
    (".spec.retry.backoff.factor", 0.5),
    (".spec.lease.durationSeconds", 4),
    (".spec.lease.durationSeconds", 3601),
    (".spec.lease.renewSeconds", 0),
    (".spec.deadlineSeconds", 0),
    (".spec.deadlineSeconds", 2592001),
    (".spec.cancelEpoch", -1),
    (".spec.cancelEpoch", 2**31),
    (".spec.agent.args", ["x"] * 65),
    (".spec.agent.args", ["x" * 1025]),
    (".spec.agent.env", [{"name": "BIG", "value": "x" * 2049}]),
    (".status.currentAttempt", 2**31),
    (
        ".status.pendingRequest",
        {"requestId": "r", "reason": "paused", "checkpointId": "c", "prompt": "x" * 4097},
    ),
    (
        ".status.conditions",
        [
            {
                "type": "Waiting",
                "status": "True",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "reason": "Waiting",
                "message": "x" * 1025,
            }
        ],
    ),
    (".spec.checkpointRetention", 0),
    (".spec.agent.image", "x" * 513),
    (".spec.agent.env", [{"name": "1BAD", "value": "x"}]),
    (".spec.agent.resources", {"limits": {"memory": "lots"}}),
    (".spec.resume", {"requestId": "r", "checkpointId": "c", "value": 1}),
    (".spec.resume", {"requestId": "r", "checkpointId": "c", "value": 1, "idempotencyKey": "k" * 129}),
    (".spec.resume", {"requestId": "r", "checkpointId": "c", "value": 1, "idempotencyKey": "has space"}),
    (".spec.retryRequest", {"reason": "no key"}),
    (".spec.pause", {"requestId": ""}),
    (".status.phase", "Sleeping"),
    (".status.failure", {"class": "bad_luck"}),
    (".status.leaseEpoch", -3),
    (
        ".status.controls",
        [
            {
                "idempotencyKey": "k",
                "op": "Undo",
                "digest": "sha256:" + "0" * 64,
                "outcome": "Accepted",
                "time": "2026-01-01T00:00:00Z",
            }
        ],
    ),
]

BAD_OBJECTS: list[tuple[str, str, Any]] = [
    ("Attempt", ".spec.number", 0),
    ("Attempt", ".spec.reason", "because"),
    ("Attempt", ".spec.reason", "retry:bad_luck"),
    ("Attempt", ".status.rejectedCommit", {"reason": "late"}),
    ("Checkpoint", ".spec.stateRef", {"key": "r/ns/u/sha256/xyz", "sha256": "xyz", "size": 3}),
    ("Checkpoint", ".spec.runName", "Not_A_Name"),
    ("Checkpoint", ".spec.sequence", 2**31),
    ("Attempt", ".spec.cancelEpoch", 2**31),
    ("SideEffect", ".status.leaseEpoch", 2**31),
    ("SideEffect", ".spec.target", "x" * 513),
    ("SideEffect", ".status.state", "Undone"),
    ("SideEffect", ".spec.idempotencyKey", DELETE),
]


def bad_input_id(kind: str, path: str, value: Any) -> str:
    return f"{kind}{path}={value!r:.20}"


# What a podTemplate may not ask for (CEL rules of the Run: no borrowed identity, no node access), each
# with the spec it sends; tests/integration/namespaced/test_api_corpus.py proves the API server refuses them.
AGENT_CONTAINER: Final = {"name": "agent", "image": "agentrun/agent:dev"}
PRIVILEGED: Final = {"securityContext": {"privileged": True}}
BAD_POD_TEMPLATES: dict[str, dict[str, Any]] = {
    "serviceAccountName": {"serviceAccountName": "agentrun", "containers": [AGENT_CONTAINER]},
    "serviceAccount": {"serviceAccount": "agentrun", "containers": [AGENT_CONTAINER]},
    "nodeName": {"nodeName": "node-1", "containers": [AGENT_CONTAINER]},
    "hostNetwork": {"hostNetwork": True, "containers": [AGENT_CONTAINER]},
    "hostPID": {"hostPID": True, "containers": [AGENT_CONTAINER]},
    "hostIPC": {"hostIPC": True, "containers": [AGENT_CONTAINER]},
    "containers": {"containers": [{**AGENT_CONTAINER, **PRIVILEGED}]},
    "initContainers": {"containers": [AGENT_CONTAINER], "initContainers": [{"name": "init", **PRIVILEGED}]},
    "ephemeralContainers": {
        "containers": [AGENT_CONTAINER],
        "ephemeralContainers": [{"name": "debug", **PRIVILEGED}],
    },
    "volumes": {
        "containers": [AGENT_CONTAINER],
        "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "root", "hostPath": {"path": "/"}}],
    },
}
# Allowed: what the rules must not refuse by accident.
GOOD_POD_TEMPLATES: dict[str, dict[str, Any]] = {
    "host namespaces off": {
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "containers": [AGENT_CONTAINER],
    },
    "unprivileged": {
        "containers": [{**AGENT_CONTAINER, "securityContext": {"privileged": False, "runAsUser": 1000}}]
    },
    "volumes without hostPath": {"containers": [AGENT_CONTAINER], "volumes": [{"name": "s", "emptyDir": {}}]},
    "scheduling by selector": {"nodeSelector": {"disk": "ssd"}, "containers": [AGENT_CONTAINER]},
}
