"""The attempt Pod: built from the Run's agent spec and the Attempt, and read back into a PodView."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from agentrun.api import (
    ATTEMPT_ANNOTATION,
    ATTEMPT_INPUT_ANNOTATION,
    ATTEMPT_REASON_ANNOTATION,
    CANCEL_EPOCH_ANNOTATION,
    LEASE_EPOCH_ANNOTATION,
    LEASE_VERSION_ANNOTATION,
    RESUME_FROM_ANNOTATION,
    RUN_LABEL,
    Attempt,
    Run,
)
from agentrun.core.failures import START_BLOCKERS, ContainerExit, ContainerWaiting
from agentrun.core.store_buckets import namespace_url
from agentrun.core.traces import TRACEPARENT_ENV, run_trace

AGENT_CONTAINER = "agent"
ATTEMPT_LABEL = "agentrun.dev/attempt"
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
DEFAULT_GRACE_SECONDS = 15

# What an attempt Pod gets where the Run's pod template sets no securityContext: the restricted Pod Security
# Standard (agent namespaces may enforce it), on the Pod and on each container. runAsNonRoot needs an image
# whose USER is numeric and not 0 (the agent image's is 65532).
RESTRICTED_POD_SECURITY: Final[dict[str, Any]] = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER_SECURITY: Final[dict[str, Any]] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


# The SDK reads who it is from the Pod itself (downward API), never from values baked into the image:
# each variable and the Pod field it comes from.
DOWNWARD_FIELDS: Final[tuple[tuple[str, str], ...]] = (
    ("AGENTRUN_RUN", f"metadata.labels['{RUN_LABEL}']"),
    ("AGENTRUN_NAMESPACE", "metadata.namespace"),
    ("AGENTRUN_POD", "metadata.name"),
    *(
        (name, f"metadata.annotations['{annotation}']")
        for name, annotation in (
            ("AGENTRUN_ATTEMPT", ATTEMPT_ANNOTATION),
            ("AGENTRUN_LEASE_EPOCH", LEASE_EPOCH_ANNOTATION),
            ("AGENTRUN_CANCEL_EPOCH", CANCEL_EPOCH_ANNOTATION),
            ("AGENTRUN_RESUME_FROM", RESUME_FROM_ANNOTATION),
            ("AGENTRUN_ATTEMPT_REASON", ATTEMPT_REASON_ANNOTATION),
            ("AGENTRUN_ATTEMPT_INPUT", ATTEMPT_INPUT_ANNOTATION),
            ("AGENTRUN_LEASE_RESOURCE_VERSION", LEASE_VERSION_ANNOTATION),
        )
    ),
)


# An Attempt whose Run's state may be in the state store (spec.stateInStore) gets its namespace under
# this name instead of AGENTRUN_NAMESPACE: an SDK that reads references takes either; every SDK that
# predates the store requires AGENTRUN_NAMESPACE and stops at once without it (NotInAttemptPod), before
# it sends a request, so it never reads an object whose value is only a reference.
NAMESPACE_ENV: Final = "AGENTRUN_NAMESPACE"
NAMESPACE_WITH_REFS_ENV: Final = "AGENTRUN_NAMESPACE_WITH_REFS"

STATE_STORE_URL_ENV: Final = "AGENTRUN_STATE_STORE_URL"
# The credentials an attempt Pod takes from its namespace's Secret, by the store's URL scheme: each is a
# key of the Secret and the variable the store's client reads (optional ones may be absent: temporary
# tokens, workload identity). file:// and memory:// need none.
STATE_STORE_CREDENTIALS: Final[dict[str, tuple[tuple[str, bool], ...]]] = {
    "s3": (("AWS_ACCESS_KEY_ID", False), ("AWS_SECRET_ACCESS_KEY", False), ("AWS_SESSION_TOKEN", True)),
    "gs": (("GOOGLE_SERVICE_ACCOUNT_KEY", True),),
    "az": (("AZURE_STORAGE_ACCOUNT_KEY", True), ("AZURE_STORAGE_SAS_KEY", True)),
}


@dataclass(frozen=True)
class StateStorePodEnv:
    """What an attempt Pod is told about the agent-state store (the operator's settings): its URL, and
    the Secret of the Pod's namespace that holds the namespace's own credentials for it."""

    url: str
    secret: str

    @property
    def required_credentials(self) -> tuple[str, ...]:
        """The Secret's keys a Pod cannot start without (none: no Secret is needed, e.g. file://, or
        workload identity where every key is optional)."""
        scheme = self.url.split("://", 1)[0]
        return tuple(key for key, optional in STATE_STORE_CREDENTIALS.get(scheme, ()) if not optional)

    def url_of(self, namespace: str) -> str:
        """The URL the namespace's own clients are given: with `buckets=namespace`, its own bucket's
        (a plain URL, which any SDK reads); else the store's."""
        return namespace_url(self.url, namespace)

    def env(self, namespace: str) -> list[dict[str, Any]]:
        """The container's env: the namespace's URL, and each credential from the namespace's Secret (the
        kubelet resolves secretKeyRef; the values never appear in the Pod)."""
        scheme = self.url.split("://", 1)[0]
        env: list[dict[str, Any]] = [{"name": STATE_STORE_URL_ENV, "value": self.url_of(namespace)}]
        for key, optional in STATE_STORE_CREDENTIALS.get(scheme, ()):
            ref: dict[str, Any] = {"name": self.secret, "key": key}
            if optional:
                ref["optional"] = True
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
        return env


def _json_copy(value: Any) -> Any:
    """A deep copy of a JSON value: a few times cheaper than copy.deepcopy, whose memo of shared and
    cyclic references is of no use for what JSON can hold."""
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    return value


def owner_reference(obj: Run | Attempt, *, controller: bool) -> dict[str, Any]:
    return {
        "apiVersion": obj.api_version,
        "kind": obj.kind,
        "name": obj.metadata.name,
        "uid": obj.metadata.uid,
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def attempt_pod(run: Run, attempt: Attempt, state_store: StateStorePodEnv | None = None) -> dict[str, Any]:
    """The Pod that runs `attempt`: owned by the Run (the controller) and by its Attempt. With
    `state_store`, its container is told the store's URL and takes the namespace's credentials for it
    (the agent's own env cannot replace them)."""
    agent = run.spec.agent
    name = str(attempt.metadata.name)
    template = agent.pod_template
    spec: dict[str, Any] = _json_copy(dict(template.spec)) if template else {}
    containers: list[dict[str, Any]] = spec.setdefault("containers", [])
    container = next((c for c in containers if c.get("name") == AGENT_CONTAINER), None)
    if container is None:
        if containers:
            container = containers[0]
        else:
            container = {"name": AGENT_CONTAINER}
            containers.append(container)
    if agent.image:
        container["image"] = agent.image
    if agent.command:
        container["command"] = list(agent.command)
    if agent.args:
        container["args"] = list(agent.args)
    if agent.resources:
        container["resources"] = agent.resources.to_api()
    user_env = [e.to_api() for e in agent.env or []]
    # The Attempt's span in the Run's trace: the SDK's spans (steps, side effects, commit) are its children.
    trace = run_trace(str(run.metadata.uid or run.metadata.name), run.metadata.annotations)
    downward = DOWNWARD_FIELDS
    if attempt.spec.state_in_store:  # only an SDK that reads references finds its namespace
        downward = tuple((NAMESPACE_WITH_REFS_ENV if e == NAMESPACE_ENV else e, p) for e, p in downward)
    ours: list[dict[str, Any]] = [
        *({"name": env, "valueFrom": {"fieldRef": {"fieldPath": path}}} for env, path in downward),
        {"name": TRACEPARENT_ENV, "value": trace.attempt(name).traceparent()},
        *(state_store.env(str(run.metadata.namespace)) if state_store is not None else ()),
    ]
    # AGENTRUN_NAMESPACE is never the agent's to set: withheld, it must stay absent
    reserved = {e["name"] for e in ours} | {NAMESPACE_ENV}
    container["env"] = [
        *ours,
        *[e for e in container.get("env") or [] if e.get("name") not in reserved],
        *[e for e in user_env if e["name"] not in reserved],
    ]
    container.setdefault("terminationMessagePath", TERMINATION_MESSAGE_PATH)
    # The SDK's {class, message, fingerprint}; an agent that dies without writing it leaves its log tail.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    spec["restartPolicy"] = "Never"  # a new try is a new Attempt, never a silent container restart
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    spec.setdefault("enableServiceLinks", False)
    if "securityContext" not in spec:
        spec["securityContext"] = _json_copy(RESTRICTED_POD_SECURITY)
    for each in [*containers, *(spec.get("initContainers") or [])]:
        if "securityContext" not in each:
            each["securityContext"] = _json_copy(RESTRICTED_CONTAINER_SECURITY)
    if agent.service_account_name:
        spec["serviceAccountName"] = agent.service_account_name

    labels = {**((template.metadata.labels or {}) if template and template.metadata else {})}
    labels |= {RUN_LABEL: str(run.metadata.name), ATTEMPT_LABEL: name}
    annotations = {**((template.metadata.annotations or {}) if template and template.metadata else {})}
    annotations |= {
        ATTEMPT_ANNOTATION: name,
        LEASE_EPOCH_ANNOTATION: str(attempt.spec.lease_epoch),
        CANCEL_EPOCH_ANNOTATION: str(attempt.spec.cancel_epoch),
        RESUME_FROM_ANNOTATION: attempt.spec.resume_from or "",
        ATTEMPT_REASON_ANNOTATION: attempt.spec.reason,
        ATTEMPT_INPUT_ANNOTATION: "true" if attempt.spec.input is not None else "",
        LEASE_VERSION_ANNOTATION: "",  # the executor fills it in from the answer of its Lease write
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": run.metadata.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                owner_reference(run, controller=True),
                owner_reference(attempt, controller=False),
            ],
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class PodView:
    """What the state machine needs to know about an attempt Pod."""

    name: str
    phase: str
    deleting: bool
    running_since: str | None
    exit: ContainerExit | None  # set once the agent container has terminated
    waiting: ContainerWaiting | None = None  # a container kept from starting (image, Secret, ConfigMap)
    created: str | None = None  # metadata.creationTimestamp: start failures are timed from it

    @property
    def finished(self) -> bool:
        return self.exit is not None or self.phase in ("Succeeded", "Failed")


def pod_essentials(pod: dict[str, Any]) -> dict[str, Any]:
    """The part of a Pod that pod_view (and the operator's cache) reads: a Pod as served is mostly spec,
    managedFields and conditions, ten times the size, and the operator holds one per running Attempt."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    kept_metadata = {
        k: metadata[k]
        # ownerReferences: only a Pod the Run controls is its attempt Pod (core.identity.owned_by)
        for k in (
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "resourceVersion",
            "labels",
            "deletionTimestamp",
            "ownerReferences",
        )
        if k in metadata
    }
    kept_status = {k: status[k] for k in ("phase", "reason", "message") if k in status}
    for statuses in ("initContainerStatuses", "containerStatuses"):
        if statuses in status:
            kept_status[statuses] = [
                {k: c[k] for k in ("name", "state", "image") if k in c} for c in status[statuses]
            ]
    kept: dict[str, Any] = {"metadata": kept_metadata, "status": kept_status}
    if (limit := _memory_limit(pod)) is not None:  # to say which limit an OOMKilled agent hit
        kept["spec"] = {"containers": [{"name": AGENT_CONTAINER, "resources": {"limits": {"memory": limit}}}]}
    return kept


def _memory_limit(pod: dict[str, Any]) -> str | None:
    containers = (pod.get("spec") or {}).get("containers") or []
    agent = next((c for c in containers if c.get("name") == AGENT_CONTAINER), None)
    limit = (((agent or {}).get("resources") or {}).get("limits") or {}).get("memory")
    return str(limit) if limit is not None else None


def _blocked(status: dict[str, Any]) -> ContainerWaiting | None:
    """The first container (init containers first) that the kubelet keeps from starting for a reason of
    failures.START_BLOCKERS."""
    for each in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (each.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in START_BLOCKERS:
            return ContainerWaiting(
                container=str(each.get("name")),
                reason=str(waiting["reason"]),
                message=waiting.get("message"),
                image=each.get("image"),
            )
    return None


def pod_view(pod: dict[str, Any]) -> PodView:
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    agent = next((s for s in statuses if s.get("name") == AGENT_CONTAINER), statuses[0] if statuses else None)
    state = (agent or {}).get("state") or {}
    running_since = (state.get("running") or {}).get("startedAt")
    exit = None
    if terminated := state.get("terminated"):
        exit = ContainerExit(
            exit_code=int(terminated.get("exitCode", 0)),
            reason=terminated.get("reason"),
            message=terminated.get("message"),
            pod_reason=status.get("reason"),
            memory_limit=_memory_limit(pod),
        )
    elif status.get("phase") == "Failed":  # e.g. evicted before the container ran
        exit = ContainerExit(
            exit_code=137, reason=None, message=status.get("message"), pod_reason=status.get("reason")
        )
    return PodView(
        name=pod["metadata"]["name"],
        phase=status.get("phase", "Pending"),
        deleting=bool(pod["metadata"].get("deletionTimestamp")),
        running_since=running_since,
        exit=exit,
        waiting=_blocked(status) if exit is None and running_since is None else None,
        created=pod["metadata"].get("creationTimestamp"),
    )
