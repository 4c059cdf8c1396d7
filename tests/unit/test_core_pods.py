"""core.pods: the attempt Pod built from a Run and its Attempt, and what the state machine reads back."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentrun.api import (
    ATTEMPT_ANNOTATION,
    ATTEMPT_INPUT_ANNOTATION,
    ATTEMPT_REASON_ANNOTATION,
    CANCEL_EPOCH_ANNOTATION,
    LEASE_EPOCH_ANNOTATION,
    LEASE_VERSION_ANNOTATION,
    RESUME_FROM_ANNOTATION,
    RUN_LABEL,
    FailureClass,
    Run,
)
from agentrun.core.failures import ContainerExit, ContainerWaiting, classify_exit
from agentrun.core.pods import (
    ATTEMPT_LABEL,
    DOWNWARD_FIELDS,
    RESTRICTED_CONTAINER_SECURITY,
    RESTRICTED_POD_SECURITY,
    TERMINATION_MESSAGE_PATH,
    PodView,
    StateStorePodEnv,
    attempt_pod,
    pod_essentials,
    pod_view,
)
from unit.factories import IMAGE, NAMESPACE, RUN, RUN_UID, make_attempt, make_run, run_status

AGENT = {"image": IMAGE, "command": ["python", "-m", "agent"]}


def run_with(agent: dict[str, Any]) -> Run:
    return make_run(run_status("Running", current=2, lease_epoch=2), spec={"agent": agent})


def build(agent: dict[str, Any] | None = None, **attempt: Any) -> dict[str, Any]:
    """The Pod of Attempt 2 (lease epoch 5, cancel epoch 1 unless said otherwise)."""
    attempt = {"lease_epoch": 5, "cancel_epoch": 1, "reason": "retry:transient", **attempt}
    return attempt_pod(run_with(agent or AGENT), make_attempt(2, **attempt))


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"]["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def agent_container(pod: dict[str, Any], name: str = "agent") -> dict[str, Any]:
    return containers(pod)[name]


# ---- identity: name, labels, annotations, owners -----------------------------------------------------------


def test_pod_is_named_after_the_attempt() -> None:
    pod = build()

    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    assert pod["metadata"]["name"] == "triage-a2"
    assert pod["metadata"]["namespace"] == NAMESPACE


def test_labels_tie_the_pod_to_its_run_and_attempt() -> None:
    assert build()["metadata"]["labels"] == {RUN_LABEL: RUN, ATTEMPT_LABEL: "triage-a2"}


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [
        (
            {},
            {
                ATTEMPT_ANNOTATION: "triage-a2",
                LEASE_EPOCH_ANNOTATION: "5",
                CANCEL_EPOCH_ANNOTATION: "1",
                RESUME_FROM_ANNOTATION: "",
                ATTEMPT_REASON_ANNOTATION: "retry:transient",
                ATTEMPT_INPUT_ANNOTATION: "",
                LEASE_VERSION_ANNOTATION: "",
            },
        ),
        (
            {"lease_epoch": 12, "cancel_epoch": 0, "resume_from": "ckpt-7"},
            {
                ATTEMPT_ANNOTATION: "triage-a2",
                LEASE_EPOCH_ANNOTATION: "12",
                CANCEL_EPOCH_ANNOTATION: "0",
                RESUME_FROM_ANNOTATION: "ckpt-7",
                ATTEMPT_REASON_ANNOTATION: "retry:transient",
                ATTEMPT_INPUT_ANNOTATION: "",
                LEASE_VERSION_ANNOTATION: "",
            },
        ),
        (
            {"resume_from": "ckpt-7", "reason": "resume:triage-r7", "input_value": {"approved": True}},
            {
                ATTEMPT_ANNOTATION: "triage-a2",
                LEASE_EPOCH_ANNOTATION: "5",
                CANCEL_EPOCH_ANNOTATION: "1",
                RESUME_FROM_ANNOTATION: "ckpt-7",
                ATTEMPT_REASON_ANNOTATION: "resume:triage-r7",
                ATTEMPT_INPUT_ANNOTATION: "true",  # the SDK reads the Attempt for the value
                LEASE_VERSION_ANNOTATION: "",
            },
        ),
    ],
    ids=["fresh-start", "resumed-from-checkpoint", "resumed-with-an-answer"],
)
def test_annotations_carry_the_grant(attempt: dict[str, Any], expected: dict[str, str]) -> None:
    assert build(**attempt)["metadata"]["annotations"] == expected


def test_annotations_come_from_the_attempt_not_the_run() -> None:
    """The Run's epochs may have moved on since the grant; the Pod keeps what its Attempt was given."""
    run = make_run(run_status("Running", current=2, lease_epoch=9), spec={"agent": AGENT, "cancelEpoch": 4})
    pod = attempt_pod(run, make_attempt(2, lease_epoch=5, cancel_epoch=1))

    assert pod["metadata"]["annotations"][LEASE_EPOCH_ANNOTATION] == "5"
    assert pod["metadata"]["annotations"][CANCEL_EPOCH_ANNOTATION] == "1"


def test_owned_by_the_run_as_controller_and_by_the_attempt() -> None:
    run, attempt = run_with(AGENT), make_attempt(2)
    owners = attempt_pod(run, attempt)["metadata"]["ownerReferences"]

    assert owners == [
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "Run",
            "name": RUN,
            "uid": RUN_UID,
            "controller": True,
            "blockOwnerDeletion": True,
        },
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "Attempt",
            "name": "triage-a2",
            "uid": "attempt-uid-2",
            "controller": False,
            "blockOwnerDeletion": True,
        },
    ]


# ---- the pod spec ------------------------------------------------------------------------------------------


def test_agent_container_from_the_agent_spec() -> None:
    pod = build(
        {
            **AGENT,
            "args": ["--fast"],
            "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}},
            "serviceAccountName": "agent-sa",
        }
    )
    agent = agent_container(pod)

    assert list(containers(pod)) == ["agent"]
    assert agent["image"] == IMAGE
    assert agent["command"] == ["python", "-m", "agent"]
    assert agent["args"] == ["--fast"]
    assert agent["resources"] == {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}
    assert pod["spec"]["serviceAccountName"] == "agent-sa"


def test_no_restarts_and_a_termination_message() -> None:
    pod = build()
    agent = agent_container(pod)

    assert pod["spec"]["restartPolicy"] == "Never"
    assert agent["terminationMessagePath"] == TERMINATION_MESSAGE_PATH == "/dev/termination-log"
    assert agent["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert pod["spec"]["enableServiceLinks"] is False
    assert pod["spec"]["terminationGracePeriodSeconds"] > 0


@pytest.mark.parametrize(
    ("name", "field_path"),
    [
        ("AGENTRUN_RUN", f"metadata.labels['{RUN_LABEL}']"),
        ("AGENTRUN_NAMESPACE", "metadata.namespace"),
        ("AGENTRUN_POD", "metadata.name"),
        ("AGENTRUN_ATTEMPT", f"metadata.annotations['{ATTEMPT_ANNOTATION}']"),
        ("AGENTRUN_LEASE_EPOCH", f"metadata.annotations['{LEASE_EPOCH_ANNOTATION}']"),
        ("AGENTRUN_CANCEL_EPOCH", f"metadata.annotations['{CANCEL_EPOCH_ANNOTATION}']"),
        ("AGENTRUN_RESUME_FROM", f"metadata.annotations['{RESUME_FROM_ANNOTATION}']"),
    ],
)
def test_downward_api_env(name: str, field_path: str) -> None:
    pod = build()
    env = env_of(agent_container(pod))[name]

    assert env == {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def test_downward_env_points_at_labels_and_annotations_the_pod_has() -> None:
    pod = build()
    meta = pod["metadata"]
    for _, path in DOWNWARD_FIELDS:
        if path.startswith("metadata.labels['"):
            assert path.removeprefix("metadata.labels['").removesuffix("']") in meta["labels"]
        elif path.startswith("metadata.annotations['"):
            assert path.removeprefix("metadata.annotations['").removesuffix("']") in meta["annotations"]


def test_user_env_is_kept_after_agentrun_env() -> None:
    agent = {
        **AGENT,
        "env": [
            {"name": "MODE", "value": "fast"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "llm", "key": "token"}}},
        ],
    }
    names = [e["name"] for e in agent_container(build(agent))["env"]]
    env = env_of(agent_container(build(agent)))

    assert names == [name for name, _ in DOWNWARD_FIELDS] + ["TRACEPARENT", "MODE", "TOKEN"]
    assert env["MODE"] == {"name": "MODE", "value": "fast"}
    assert env["TOKEN"] == {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "llm", "key": "token"}}}


@pytest.mark.parametrize("reserved", [name for name, _ in DOWNWARD_FIELDS])
def test_reserved_env_cannot_be_overridden(reserved: str) -> None:
    agent = {
        **AGENT,
        "env": [{"name": reserved, "value": "forged"}, {"name": "KEEP", "value": "1"}],
        "podTemplate": {
            "spec": {"containers": [{"name": "agent", "env": [{"name": reserved, "value": "forged-too"}]}]}
        },
    }
    env = agent_container(build(agent))["env"]

    path = dict(DOWNWARD_FIELDS)[reserved]
    assert [e for e in env if e["name"] == reserved] == [
        {"name": reserved, "valueFrom": {"fieldRef": {"fieldPath": path}}}
    ]
    assert {"name": "KEEP", "value": "1"} in env


# ---- the agent-state store ---------------------------------------------------------------------------------

S3_STORE = StateStorePodEnv("s3://agentrun/runs?endpoint=http://127.0.0.1:7070", "agentrun-state-store")


def test_the_state_store_url_and_the_namespaces_credentials_are_injected_from_its_secret() -> None:
    run = run_with(AGENT)
    env = env_of(agent_container(attempt_pod(run, make_attempt(2), S3_STORE)))
    assert env["AGENTRUN_STATE_STORE_URL"] == {"name": "AGENTRUN_STATE_STORE_URL", "value": S3_STORE.url}
    secret = "agentrun-state-store"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"] == {
        "secretKeyRef": {"name": secret, "key": "AWS_ACCESS_KEY_ID"}
    }
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": secret, "key": "AWS_SECRET_ACCESS_KEY"}
    }
    # a temporary token may be absent from the Secret
    assert env["AWS_SESSION_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": secret, "key": "AWS_SESSION_TOKEN", "optional": True}
    }
    assert not any("value" in e and "SECRET" in e["name"] for e in env.values())  # never a literal


def test_without_a_state_store_the_pod_is_told_none() -> None:
    env = env_of(agent_container(build()))
    assert not {"AGENTRUN_STATE_STORE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(env)


def test_a_store_on_one_machine_needs_no_credentials() -> None:
    store = StateStorePodEnv("file:///var/lib/agentrun", "agentrun-state-store")
    env = env_of(agent_container(attempt_pod(run_with(AGENT), make_attempt(2), store)))
    assert env["AGENTRUN_STATE_STORE_URL"]["value"] == "file:///var/lib/agentrun"
    assert not any(name.startswith("AWS_") for name in env)


@pytest.mark.parametrize("name", ["AGENTRUN_STATE_STORE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
def test_an_agent_cannot_replace_the_stores_url_or_credentials(name: str) -> None:
    agent = {**AGENT, "env": [{"name": name, "value": "forged"}]}
    env = agent_container(attempt_pod(run_with(agent), make_attempt(2), S3_STORE))["env"]
    assert [e for e in env if e["name"] == name] != [{"name": name, "value": "forged"}]
    assert len([e for e in env if e["name"] == name]) == 1


# ---- podTemplate -------------------------------------------------------------------------------------------


def templated(spec: dict[str, Any], metadata: dict[str, Any] | None = None, **agent: Any) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": spec}
    if metadata is not None:
        template["metadata"] = metadata
    return {**AGENT, **agent, "podTemplate": template}


def test_template_agent_container_found_by_name() -> None:
    spec = {
        "containers": [
            {"name": "proxy", "image": "envoy:1", "env": [{"name": "P", "value": "1"}]},
            {"name": "agent", "image": "old:1", "workingDir": "/work"},
        ]
    }
    pod = build(templated(spec))
    proxy, agent = agent_container(pod, "proxy"), agent_container(pod, "agent")

    assert [c["name"] for c in pod["spec"]["containers"]] == ["proxy", "agent"]
    assert proxy == {
        "name": "proxy",
        "image": "envoy:1",
        "env": [{"name": "P", "value": "1"}],
        "securityContext": RESTRICTED_CONTAINER_SECURITY,
    }
    assert agent["image"] == IMAGE
    assert agent["workingDir"] == "/work"
    assert "AGENTRUN_ATTEMPT" in env_of(agent)


def test_template_first_container_when_none_is_named_agent() -> None:
    spec = {"containers": [{"name": "main", "image": "old:1"}, {"name": "sidecar", "image": "side:1"}]}
    pod = build(templated(spec))

    assert agent_container(pod, "main")["image"] == IMAGE
    assert "AGENTRUN_ATTEMPT" in env_of(agent_container(pod, "main"))
    assert agent_container(pod, "sidecar") == {
        "name": "sidecar",
        "image": "side:1",
        "securityContext": RESTRICTED_CONTAINER_SECURITY,
    }


def test_template_without_containers_gets_an_agent_container() -> None:
    pod = build(templated({"nodeSelector": {"pool": "agents"}}))

    assert [c["name"] for c in pod["spec"]["containers"]] == ["agent"]
    assert pod["spec"]["nodeSelector"] == {"pool": "agents"}


def test_template_only_agent_keeps_its_own_image() -> None:
    agent = {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "mine:2", "args": ["x"]}]}}}
    container = agent_container(build(agent))

    assert container["image"] == "mine:2"
    assert container["args"] == ["x"]


def test_template_env_is_kept_next_to_user_env() -> None:
    spec = {"containers": [{"name": "agent", "env": [{"name": "FROM_TEMPLATE", "value": "t"}]}]}
    env = env_of(agent_container(build(templated(spec, env=[{"name": "FROM_SPEC", "value": "s"}]))))

    assert env["FROM_TEMPLATE"] == {"name": "FROM_TEMPLATE", "value": "t"}
    assert env["FROM_SPEC"] == {"name": "FROM_SPEC", "value": "s"}


def test_template_pod_fields_kept_agentrun_fields_enforced() -> None:
    spec = {
        "containers": [{"name": "agent"}],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 90,
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "serviceAccountName": "template-sa",
    }
    pod = build(templated(spec))

    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 90
    assert pod["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}]
    assert pod["spec"]["serviceAccountName"] == "template-sa"
    assert build(templated(spec, serviceAccountName="spec-sa"))["spec"]["serviceAccountName"] == "spec-sa"


def test_template_metadata_merged_agentrun_keys_win() -> None:
    metadata = {
        "labels": {"team": "a", RUN_LABEL: "forged", ATTEMPT_LABEL: "forged"},
        "annotations": {"note": "hi", LEASE_EPOCH_ANNOTATION: "999"},
    }
    meta = build(templated({"containers": [{"name": "agent"}]}, metadata))["metadata"]

    assert meta["labels"] == {"team": "a", RUN_LABEL: RUN, ATTEMPT_LABEL: "triage-a2"}
    assert meta["annotations"]["note"] == "hi"
    assert meta["annotations"][LEASE_EPOCH_ANNOTATION] == "5"


# ---- security context: the restricted Pod Security Standard unless the template says otherwise ---------


def test_without_a_template_the_pod_meets_the_restricted_standard() -> None:
    pod = build()

    restricted_pod = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["spec"]["securityContext"] == restricted_pod
    assert agent_container(pod)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_every_container_of_a_template_without_its_own_context_gets_the_restricted_one() -> None:
    spec = {
        "initContainers": [{"name": "fetch", "image": "fetch:1"}],
        "containers": [{"name": "agent"}, {"name": "proxy", "image": "envoy:1"}],
    }
    pod = build(templated(spec))

    assert pod["spec"]["securityContext"] == RESTRICTED_POD_SECURITY
    for container in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]:
        assert container["securityContext"] == RESTRICTED_CONTAINER_SECURITY, container["name"]


def test_a_templates_own_security_contexts_are_kept_as_written() -> None:
    pod_context = {"runAsUser": 0, "fsGroup": 2000}
    container_context = {"capabilities": {"add": ["NET_ADMIN"]}}
    spec = {
        "securityContext": pod_context,
        "containers": [{"name": "agent", "securityContext": container_context}, {"name": "side"}],
    }
    pod = build(templated(spec))

    assert pod["spec"]["securityContext"] == pod_context
    assert agent_container(pod)["securityContext"] == container_context
    assert agent_container(pod, "side")["securityContext"] == RESTRICTED_CONTAINER_SECURITY


def test_the_restricted_defaults_are_not_shared_between_pods() -> None:
    first = build()
    first["spec"]["securityContext"]["seccompProfile"]["type"] = "Unconfined"
    agent_container(first)["securityContext"]["capabilities"]["drop"].append("X")

    assert build()["spec"]["securityContext"] == RESTRICTED_POD_SECURITY
    assert agent_container(build())["securityContext"] == RESTRICTED_CONTAINER_SECURITY


def test_the_run_is_not_modified() -> None:
    spec = {"containers": [{"name": "agent", "env": [{"name": "A", "value": "1"}]}]}
    run = run_with(templated(spec))
    before = copy.deepcopy(run.model_dump())

    first = attempt_pod(run, make_attempt(2))
    second = attempt_pod(run, make_attempt(2))

    assert run.model_dump() == before
    assert first == second


def test_pods_share_no_mutable_part() -> None:
    """The executor fills in a Pod body before it is sent: a change to one must not reach the next."""
    run = run_with(templated({"containers": [{"name": "agent", "env": [{"name": "A", "value": "1"}]}]}))
    first = attempt_pod(run, make_attempt(2))
    for env in agent_container(first)["env"]:
        env["name"] = "CHANGED"
        if "valueFrom" in env:
            env["valueFrom"]["fieldRef"]["fieldPath"] = "metadata.uid"
        else:
            env["value"] = "changed"
    first["metadata"]["annotations"].clear()

    second = attempt_pod(run, make_attempt(2))

    env = env_of(agent_container(second))
    assert "CHANGED" not in env
    assert env["A"] == {"name": "A", "value": "1"}
    assert all(
        e["valueFrom"]["fieldRef"]["fieldPath"] == path
        for e, (_, path) in zip([env[name] for name, _ in DOWNWARD_FIELDS], DOWNWARD_FIELDS, strict=True)
    )
    assert second["metadata"]["annotations"]


# ---- reading Pods back -------------------------------------------------------------------------------------


def pod_object(
    phase: str | None = None,
    statuses: list[dict[str, Any]] | None = None,
    *,
    reason: str | None = None,
    message: str | None = None,
    deleting: bool = False,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "triage-a2", "namespace": NAMESPACE}
    if deleting:
        metadata["deletionTimestamp"] = "2026-03-01T12:09:00Z"
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    if statuses is not None:
        status["containerStatuses"] = statuses
    if init is not None:
        status["initContainerStatuses"] = init
    if reason is not None:
        status["reason"] = reason
    if message is not None:
        status["message"] = message
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "status": status}


def running(name: str = "agent", since: str = "2026-03-01T12:05:00Z") -> dict[str, Any]:
    return {"name": name, "state": {"running": {"startedAt": since}}}


def terminated(name: str = "agent", code: int = 0, **fields: Any) -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"exitCode": code, **fields}}}


def waiting(name: str = "agent") -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": "ContainerCreating"}}}


def blocked(reason: str, message: str, name: str = "agent") -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": message}}
    return {"name": name, "image": "agents/none:1", "state": state}


def view(
    phase: str,
    since: str | None = None,
    end: ContainerExit | None = None,
    deleting: bool = False,
    waiting: ContainerWaiting | None = None,
) -> PodView:
    return PodView(
        name="triage-a2", phase=phase, deleting=deleting, running_since=since, exit=end, waiting=waiting
    )


NEVER = 'Container image "agents/none:1" is not present with pull policy of Never'


T5 = "2026-03-01T12:05:00Z"
POD_VIEWS = {
    "just-created": (pod_object(), view("Pending"), False),
    "pending-container-creating": (pod_object("Pending", [waiting()]), view("Pending"), False),
    "running": (pod_object("Running", [running()]), view("Running", T5), False),
    "image-never-pulled": (
        pod_object("Pending", [blocked("ErrImageNeverPull", NEVER)]),
        view("Pending", waiting=ContainerWaiting("agent", "ErrImageNeverPull", NEVER, "agents/none:1")),
        False,
    ),
    "init-container-secret-missing": (
        pod_object(
            "Pending",
            [waiting()],
            init=[blocked("CreateContainerConfigError", 'secret "k" not found', "setup")],
        ),
        view(
            "Pending",
            waiting=ContainerWaiting(
                "setup", "CreateContainerConfigError", 'secret "k" not found', "agents/none:1"
            ),
        ),
        False,
    ),
    "running-being-deleted": (
        pod_object("Running", [running()], deleting=True),
        view("Running", T5, deleting=True),
        False,
    ),
    "succeeded": (
        pod_object("Succeeded", [terminated(code=0, reason="Completed")]),
        view("Succeeded", end=ContainerExit(0, "Completed")),
        True,
    ),
    "failed-with-message": (
        pod_object("Failed", [terminated(code=75, reason="Error", message='{"class": "transient"}')]),
        view("Failed", end=ContainerExit(75, "Error", '{"class": "transient"}')),
        True,
    ),
    "oom-killed": (
        pod_object("Failed", [terminated(code=137, reason="OOMKilled")]),
        view("Failed", end=ContainerExit(137, "OOMKilled")),
        True,
    ),
    "evicted-after-start": (
        pod_object(
            "Failed", [terminated(code=137, reason="Error")], reason="Evicted", message="low on memory"
        ),
        view("Failed", end=ContainerExit(137, "Error", None, "Evicted")),
        True,
    ),
    "evicted-before-start": (
        pod_object("Failed", [waiting()], reason="Evicted", message="The node was low on resource: memory."),
        view("Failed", end=ContainerExit(137, None, "The node was low on resource: memory.", "Evicted")),
        True,
    ),
    "failed-without-statuses": (
        pod_object("Failed", reason="NodeLost"),
        view("Failed", end=ContainerExit(137, None, None, "NodeLost")),
        True,
    ),
    "succeeded-without-statuses": (pod_object("Succeeded"), view("Succeeded"), True),
    "agent-ended-sidecar-running": (
        pod_object("Running", [running("proxy"), terminated(code=0, reason="Completed")]),
        view("Running", end=ContainerExit(0, "Completed")),
        True,
    ),
    "agent-found-by-name-not-position": (
        pod_object("Running", [terminated("proxy", code=1), running()]),
        view("Running", T5),
        False,
    ),
    "first-container-when-none-is-agent": (
        pod_object("Running", [running("main"), terminated("sidecar", code=1)]),
        view("Running", T5),
        False,
    ),
}


@pytest.mark.parametrize(("pod", "expected", "finished"), POD_VIEWS.values(), ids=POD_VIEWS.keys())
def test_pod_view(pod: dict[str, Any], expected: PodView, finished: bool) -> None:
    got = pod_view(pod)

    assert got == expected
    assert got.finished is finished


@pytest.mark.parametrize(("pod", "expected", "finished"), POD_VIEWS.values(), ids=POD_VIEWS.keys())
def test_a_pods_essentials_read_as_the_pod(pod: dict[str, Any], expected: PodView, finished: bool) -> None:
    """The operator caches only a Pod's essentials: they must say all that the Pod says to pod_view."""
    served = copy.deepcopy(pod)
    served["metadata"] |= {"resourceVersion": "42", "labels": {"agentrun.dev/run": "triage"}}
    served["metadata"]["managedFields"] = [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}]
    served["spec"] = {"containers": [{"name": "agent", "image": IMAGE}], "nodeName": "node-1"}
    served["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    essentials = pod_essentials(served)

    assert pod_view(essentials) == expected
    assert essentials["metadata"]["resourceVersion"] == "42"
    assert essentials["metadata"]["labels"] == {"agentrun.dev/run": "triage"}
    assert "spec" not in essentials and "managedFields" not in essentials["metadata"]
    assert "conditions" not in essentials["status"]


@pytest.mark.parametrize(
    ("pod", "failure_class"),
    [
        (pod_object("Failed", [terminated(code=137, reason="OOMKilled")]), FailureClass.INFRASTRUCTURE),
        (pod_object("Failed", [waiting()], reason="Evicted"), FailureClass.INFRASTRUCTURE),
        (pod_object("Failed", [terminated(code=75, reason="Error")]), FailureClass.TRANSIENT),
        (pod_object("Failed", [terminated(code=1, reason="Error")]), FailureClass.DETERMINISTIC),
        (
            pod_object(
                "Failed", [terminated(code=1, message='{"class": "rate_limited", "retryAfterSeconds": 9}')]
            ),
            FailureClass.RATE_LIMITED,
        ),
    ],
    ids=["oom", "evicted", "exit-75", "exit-1", "sdk-report"],
)
def test_pod_view_feeds_classification(pod: dict[str, Any], failure_class: FailureClass) -> None:
    end = pod_view(pod).exit
    assert end is not None

    got = classify_exit(end)

    assert got is not None
    assert got.failure_class == failure_class


def test_an_oom_killed_agent_is_said_to_have_hit_its_memory_limit() -> None:
    """The limit is read from the Pod's spec, and kept in the essentials the operator caches."""
    pod = pod_object("Failed", [terminated(code=137, reason="OOMKilled")])
    pod["spec"] = {
        "containers": [{"name": "agent", "image": IMAGE, "resources": {"limits": {"memory": "64Mi"}}}]
    }

    end = pod_view(pod_essentials(pod)).exit
    assert end == ContainerExit(137, "OOMKilled", memory_limit="64Mi")
    failure = classify_exit(end)
    assert (
        failure is not None
        and failure.message == "the agent container was OOMKilled at its memory limit of 64Mi"
    )


def test_a_pod_created_is_timed_from_its_creation() -> None:
    pod = pod_object("Pending", [blocked("ImagePullBackOff", "Back-off pulling image")])
    pod["metadata"]["creationTimestamp"] = "2026-03-01T12:00:00Z"

    assert pod_view(pod_essentials(pod)).created == "2026-03-01T12:00:00Z"
