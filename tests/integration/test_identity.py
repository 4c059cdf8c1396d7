"""No borrowed identity, no adoption, on a real API server with the operator running.

A user who may only create Runs cannot get a Pod running as a ServiceAccount nobody opted in, nor as the
operator's own, nor a Pod on the node's namespaces; and what someone else put under an agentrun name (a
Lease, a Pod, a Checkpoint) is never adopted: the Run fails and says what to delete.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from agentrun.api import AGENT_LABEL, lease_name
from agentrun.examples.manifests import agent_run
from agentrun.rbac import AGENT_ACCOUNT_PATCH
from devcluster import security
from devcluster.operator import OperatorProcess
from devcluster.tickets import TicketServiceProcess
from support.agentrun import Api, error_message
from support.corpus import BAD_POD_TEMPLATES, valid_object
from support.kube import Kube, wait_for
from support.runs import FAST_RETRY, GROUP, VERSION, attempts, create_run, get_run, scenario_run, wait_phase

pytestmark = pytest.mark.cluster
AUTHOR = "run-author"


def as_user(kube: Kube, user: str) -> client.ApiClient:
    api_client = config.new_client_from_config(config_file=str(kube.kubeconfig))
    api_client.set_default_header("Impersonate-User", user)
    return api_client


def run_author(kube: Kube, namespace: str) -> client.CustomObjectsApi:
    """A user who may create and read Runs in the namespace, and nothing else."""
    rules = [{"apiGroups": [GROUP], "resources": ["runs"], "verbs": ["create", "get", "list", "watch"]}]
    kube.rbac.create_namespaced_role(namespace, {"metadata": {"name": AUTHOR}, "rules": rules})
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": AUTHOR},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AUTHOR},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": AUTHOR}],
        },
    )
    return client.CustomObjectsApi(as_user(kube, AUTHOR))


def author_creates(author: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> None:
    author.create_namespaced_custom_object(GROUP, VERSION, namespace, "runs", body)


def failed_with(kube: Kube, namespace: str, name: str, reason: str) -> dict[str, Any]:
    run = wait_phase(kube, namespace, name, {"Failed", "Succeeded"})
    failure = run["status"].get("failure") or {}
    assert (run["status"]["phase"], failure.get("reason")) == ("Failed", reason), run["status"]
    return run


def labelled(kube: Kube, namespace: str, run: str, plural: str) -> list[dict[str, Any]]:
    selector = f"agentrun.dev/run={run}"
    if plural == "pods":
        return [p.to_dict() for p in kube.core.list_namespaced_pod(namespace, label_selector=selector).items]
    if plural == "leases":
        found = kube.coordination.list_namespaced_lease(namespace, label_selector=selector).items
        return [lease.to_dict() for lease in found]
    return attempts(kube, namespace, run)


def nothing_started(kube: Kube, namespace: str, run: str) -> None:
    """No Pod, no Attempt, no Lease was ever made for the Run: the operator creates a Pod only after the
    Lease and the Attempt (and never deletes the last Attempt), so none of them means no Pod ever was."""
    for plural in ("pods", "attempts", "leases"):
        assert labelled(kube, namespace, run, plural) == [], plural
    assert get_run(kube, namespace, run)["status"]["attempts"] == 0


def test_a_run_author_cannot_borrow_an_unlabelled_service_account(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    kube.core.create_namespaced_service_account(ns, {"metadata": {"name": "powerful"}})
    author = run_author(kube, ns)
    with pytest.raises(ApiException) as refused:  # the author cannot make Pods: only the operator does
        client.CoreV1Api(as_user(kube, AUTHOR)).create_namespaced_pod(
            ns, {"metadata": {"name": "direct"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        )
    assert refused.value.status == 403

    body = scenario_run("borrow", {"steps": 1})
    body["spec"]["agent"]["serviceAccountName"] = "powerful"
    author_creates(author, ns, body)
    run = failed_with(kube, ns, "borrow", "ServiceAccountNotAllowed")
    assert run["status"]["failure"]["class"] == "deterministic"
    assert (
        f"kubectl label serviceaccount powerful -n {ns} agentrun.dev/agent=true" in run["status"]["message"]
    )
    nothing_started(kube, ns, "borrow")


def test_an_unlabelled_default_service_account_is_refused_too(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    author_creates(run_author(kube, namespace), namespace, scenario_run("plain", {"steps": 1}))
    run = failed_with(kube, namespace, "plain", "ServiceAccountNotAllowed")
    assert f"ServiceAccount {namespace}/default is not labelled" in run["status"]["message"]
    nothing_started(kube, namespace, "plain")


@pytest.fixture
def operator_home(kube: Kube) -> Iterator[str]:
    """The namespace of the operator's own ServiceAccount, that account labelled as if opted in."""
    ns, name = security.OPERATOR_NAMESPACE, security.OPERATOR_SERVICE_ACCOUNT
    kube.core.patch_namespaced_service_account(name, ns, AGENT_ACCOUNT_PATCH)
    try:
        yield ns
    finally:
        kube.core.patch_namespaced_service_account(name, ns, {"metadata": {"labels": {AGENT_LABEL: None}}})


def test_a_run_never_runs_as_the_operator_even_if_its_account_is_labelled(
    kube: Kube, operator_home: str, operator: OperatorProcess
) -> None:
    ns = operator_home
    body = scenario_run("usurp", {"steps": 1})
    body["spec"]["agent"]["serviceAccountName"] = security.OPERATOR_SERVICE_ACCOUNT
    author_creates(run_author(kube, ns), ns, body)
    run = failed_with(kube, ns, "usurp", "ServiceAccountNotAllowed")
    assert "is the agentrun operator's own" in run["status"]["message"]
    nothing_started(kube, ns, "usurp")


def test_an_account_labelled_just_before_the_run_is_used(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    kube.core.create_namespaced_service_account(
        ns, {"metadata": {"name": "agents", **AGENT_ACCOUNT_PATCH["metadata"]}}
    )
    binding = {
        "metadata": {"name": "agents"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agentrun-attempt"},
        "subjects": [{"kind": "ServiceAccount", "name": "agents", "namespace": ns}],
    }
    kube.rbac.create_namespaced_role_binding(ns, binding)
    body = scenario_run("opted", {"steps": 1})
    body["spec"]["agent"]["serviceAccountName"] = "agents"
    body["spec"]["podGC"] = "Never"  # its Pod is read below, after the Run ended
    author_creates(run_author(kube, ns), ns, body)
    run = wait_phase(kube, ns, "opted", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert kube.core.read_namespaced_pod("opted-a1", ns).spec.service_account_name == "agents"


def may_patch_run_status(kube: Kube, namespace: str, account: str) -> bool:
    review = client.AuthorizationV1Api(kube.api_client).create_subject_access_review(
        {
            "spec": {
                "user": f"system:serviceaccount:{namespace}:{account}",
                "resourceAttributes": {
                    "namespace": namespace,
                    "group": GROUP,
                    "resource": "runs",
                    "subresource": "status",
                    "verb": "patch",
                },
            }
        }
    )
    return bool(review.status.allowed)


def test_an_account_without_the_attempt_role_fails_the_run_before_any_pod_until_it_is_bound(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    """Labelled but not bound: the Run fails with the fix before any Pod (not the agent on a 403); the
    fix as the message words it lets the next Run run."""
    ns = run_namespace
    kube.core.create_namespaced_service_account(
        ns, {"metadata": {"name": "unbound", **AGENT_ACCOUNT_PATCH["metadata"]}}
    )
    author = run_author(kube, ns)
    body = scenario_run("unbound", {"steps": 1})
    body["spec"]["agent"]["serviceAccountName"] = "unbound"
    author_creates(author, ns, body)
    run = failed_with(kube, ns, "unbound", "AttemptRoleNotBound")
    assert run["status"]["failure"]["class"] == "deterministic"
    message = run["status"]["message"]
    fix = (
        f"kubectl create rolebinding agentrun-attempt-unbound -n {ns} --role=agentrun-attempt "
        f"--serviceaccount={ns}:unbound"
    )
    assert f"`{fix}`" in message and "patch runs/status" in message, message
    nothing_started(kube, ns, "unbound")

    done = subprocess.run(
        [str(kube.kubectl_path), "--kubeconfig", str(kube.kubeconfig), *shlex.split(fix)[1:]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # The API server's authorizer learns of a binding from its own watch: the next Run once it has.
    wait_for(lambda: may_patch_run_status(kube, ns, "unbound"), what="the binding in force")
    body = scenario_run("bound", {"steps": 1})
    body["spec"]["agent"]["serviceAccountName"] = "unbound"
    body["spec"]["podGC"] = "Never"  # its Pod is read below, after the Run ended
    author_creates(author, ns, body)
    run = wait_phase(kube, ns, "bound", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert kube.core.read_namespaced_pod("bound-a1", ns).spec.service_account_name == "unbound"


@pytest.mark.parametrize("field", ["nodeName", "hostNetwork", "containers"])
def test_a_pod_template_that_would_take_the_node_is_refused_at_admission(
    kube: Kube, namespace: str, field: str
) -> None:
    author = run_author(kube, namespace)
    body = valid_object("Run", "node", {".spec.agent": {"podTemplate": {"spec": BAD_POD_TEMPLATES[field]}}})
    with pytest.raises(ApiException) as refused:
        author_creates(author, namespace, body)
    assert refused.value.status == 422
    assert f"spec.agent.podTemplate.spec.{field}" in str(refused.value.body)
    assert "not allowed" in str(refused.value.body) or "cannot be privileged" in str(refused.value.body)


# --- squatters -------------------------------------------------------------------------------------------


def test_a_squatted_lease_is_not_adopted(kube: Kube, run_namespace: str, operator: OperatorProcess) -> None:
    ns, name = run_namespace, lease_name("leased")
    squatter = kube.coordination.create_namespaced_lease(
        ns,
        {
            "metadata": {"name": name, "labels": {"agentrun.dev/run": "leased"}},
            "spec": {"holderIdentity": "leased-a1", "leaseTransitions": 1, "leaseDurationSeconds": 3600},
        },
    )
    create_run(kube, ns, scenario_run("leased", {"steps": 1}))
    run = failed_with(kube, ns, "leased", "NameSquatted")
    assert f"Lease {name} exists and is not owned by this Run" in run["status"]["message"]
    after = kube.coordination.read_namespaced_lease(name, ns)
    assert after.metadata.resource_version == squatter.metadata.resource_version, "never written"
    assert labelled(kube, ns, "leased", "pods") == []


def test_a_squatted_pod_is_not_adopted(kube: Kube, run_namespace: str, operator: OperatorProcess) -> None:
    ns = run_namespace
    pod: dict[str, Any] = {
        "metadata": {"name": "podded-a1", "labels": {"agentrun.dev/run": "podded"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "agent", "image": "agentrun/none", "command": ["python", "-c", "pass"]}],
        },
    }
    # With the Run's label only the operator may create it (the attempt-pods admission policy) ...
    with pytest.raises(ApiException) as refused:
        kube.core.create_namespaced_pod(ns, pod)
    assert refused.value.status == 403
    # ... without it, anyone with Pod rights can take the name first: the operator must not adopt it.
    del pod["metadata"]["labels"]
    squatter = kube.core.create_namespaced_pod(ns, pod)
    create_run(kube, ns, scenario_run("podded", {"steps": 1}))
    run = failed_with(kube, ns, "podded", "NameSquatted")
    assert "Pod podded-a1 exists and is not owned by this Run" in run["status"]["message"]
    kept = kube.core.read_namespaced_pod("podded-a1", ns)
    assert (kept.metadata.uid, kept.metadata.owner_references) == (squatter.metadata.uid, None)
    [attempt] = wait_for(
        lambda: [
            a for a in attempts(kube, ns, "podded") if (a.get("status") or {}).get("phase") == "Aborted"
        ],
        timeout=120,
        what="the Attempt whose Pod name was taken, aborted",
    )
    assert attempt["metadata"]["name"] == "podded-a1"


def test_a_squatted_checkpoint_is_refused_by_the_sdk(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    squatter = valid_object(
        "Checkpoint",
        "ckpt-a1-s1",
        {
            ".spec": {
                "runName": "ckpt",
                "id": "ckpt-a1-s1",
                "sequence": 1,
                "attempt": "ckpt-a1",
                "leaseEpoch": 1,
            }
        },
    )
    squatter["metadata"]["labels"] = {"agentrun.dev/run": "ckpt"}
    squatter["spec"]["state"] = {"planted": True}
    kube.custom.create_namespaced_custom_object(GROUP, VERSION, ns, "checkpoints", squatter)
    create_run(kube, ns, scenario_run("ckpt", {"steps": 1}, retry=FAST_RETRY))
    run = wait_phase(kube, ns, "ckpt", {"Failed", "Succeeded"})
    assert run["status"]["phase"] == "Failed", run["status"]
    assert (
        "Checkpoint ckpt-a1-s1 names Run ckpt but is not owned by it" in run["status"]["failure"]["message"]
    )
    assert run["status"]["failure"]["class"] == "deterministic"
    assert "latestCheckpoint" not in run["status"] or run["status"]["latestCheckpoint"] is None


# --- one ledger per Run ----------------------------------------------------------------------------------


def test_two_runs_with_the_same_key_keep_two_records_and_take_two_actions(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tickets: TicketServiceProcess
) -> None:
    ns = run_namespace
    for name in ("first", "second"):
        scenario = {
            "title": f"ticket of {name}",
            "body": "b",
            "askPriority": False,
            "ticketKey": "create-ticket",
        }
        create_run(kube, ns, agent_run(name, "ticket_agent", scenario, env=tickets.env(), retry=FAST_RETRY))
    runs = {name: wait_phase(kube, ns, name, {"Succeeded", "Failed"}) for name in ("first", "second")}
    assert {n: r["status"]["phase"] for n, r in runs.items()} == {"first": "Succeeded", "second": "Succeeded"}
    effects = kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns, "sideeffects")["items"]
    assert sorted((e["spec"]["runName"], e["spec"]["idempotencyKey"]) for e in effects) == [
        ("first", "create-ticket"),
        ("second", "create-ticket"),
    ]
    assert len({e["metadata"]["name"] for e in effects}) == 2
    created = tickets.creations()
    assert sorted(c["title"] for c in created) == ["[normal] ticket of first", "[normal] ticket of second"]
    assert {r["status"]["result"]["ticket"] for r in runs.values()} == {c["ticketId"] for c in created}


# ---- who decided: a field that names a person names the user who writes it -------------------------


def _refused_for(write: Callable[[], object]) -> str:
    """The message of a write the admission policies refuse (403), as kubectl would print it."""
    with pytest.raises(ApiException) as refused:
        write()
    assert refused.value.status == 403, refused.value.body
    return error_message(refused.value)


def _written_or_forbidden(write: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
    try:
        return write()
    except ApiException as error:
        if error.status != 403:
            raise
        return None


def _patch_run(kube: Kube, namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    patched: dict[str, Any] = kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "runs", name, {"spec": spec}
    )
    return patched


def test_an_answer_names_its_sender_and_a_later_colleague_is_not_refused_for_it(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    ns = namespace
    create_run(kube.impersonating("alice"), ns, scenario_run("decide", {"steps": 1}))
    approve = {
        "requestId": "approve-sfx-0123456789abcdef0123456789abcdef",
        "checkpointId": "decide-a1-s1",
        "value": {"approved": True},
        "idempotencyKey": "bob-approves",
    }
    bob, carol, dave = (kube.impersonating(who) for who in ("bob", "carol", "dave"))

    message = _refused_for(
        lambda: _patch_run(bob, ns, "decide", {"resume": {**approve, "answeredBy": "alice"}})
    )
    assert message.endswith(
        "NotTheSender: spec.resume.answeredBy names alice but this request comes from bob: set "
        "spec.resume.answeredBy to bob, your user name as `kubectl auth whoami` shows it (a bot acts for a "
        "person by impersonating them)"
    ), message
    message = _refused_for(lambda: _patch_run(bob, ns, "decide", {"resume": approve}))
    assert (
        "NotNamed: an answer to an approval names who approves: set spec.resume.answeredBy to bob" in message
    )
    assert (
        _patch_run(bob, ns, "decide", {"resume": {**approve, "answeredBy": "bob"}})["spec"]["resume"][
            "answeredBy"
        ]
        == "bob"
    )

    # carol cancels and dave re-applies the manifest: neither is refused for bob's answer, stored as it is
    cancel = {"cancelEpoch": 1, "cancelRequest": {"idempotencyKey": "carol-stops", "requestedBy": "carol"}}
    assert _patch_run(carol, ns, "decide", cancel)["spec"]["cancelRequest"]["requestedBy"] == "carol"
    stored = get_run(kube, ns, "decide")["spec"]
    assert _patch_run(dave, ns, "decide", stored)["spec"] == stored
    message = _refused_for(
        lambda: _patch_run(
            dave, ns, "decide", {"cancelRequest": {"idempotencyKey": "x", "requestedBy": "carol"}}
        )
    )
    assert "set spec.cancelRequest.requestedBy to dave" in message
    message = _refused_for(
        lambda: _patch_run(
            dave, ns, "decide", {"retryRequest": {"idempotencyKey": "y", "requestedBy": "erin"}}
        )
    )
    assert (
        "NotTheSender: spec.retryRequest.requestedBy names erin but this request comes from dave" in message
    )


def test_a_resolution_and_an_approval_name_the_person_who_writes_them(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    ns, name = namespace, "sfx-0123456789abcdef0123456789abcdef"
    api = Api(kube, ns)
    api.create(valid_object("SideEffect", name))
    api.patch_status("SideEffect", name, {"state": "Pending"})
    api.patch_status("SideEffect", name, {"state": "Unknown"})
    carol, erin = Api(kube.impersonating("carol"), ns), Api(kube.impersonating("erin"), ns)

    confirmed = {
        "state": "Confirmed",
        "resolution": "Confirmed",
        "resolvedBy": "dave",
        "externalReference": "T-1",
    }
    message = _refused_for(lambda: carol.patch_status("SideEffect", name, confirmed))
    assert "NotTheSender: status.resolvedBy names dave but this request comes from carol" in message
    assert "set status.resolvedBy to carol, your user name as `kubectl auth whoami` shows it" in message
    absent = {"state": "Failed", "resolution": "Absent", "resolvedBy": "carol", "resolvedSends": 0}
    assert carol.patch_status("SideEffect", name, absent)["status"]["resolvedBy"] == "carol"

    # erin changes the verdict: she names herself, carol's name is not hers to keep
    message = _refused_for(lambda: erin.patch_status("SideEffect", name, {"resolution": "Failed"}))
    assert "NotNamed: a resolution names who made it: set status.resolvedBy to erin" in message
    approval = {"requestId": "approve-" + name, "time": "2026-01-01T00:00:00Z"}
    message = _refused_for(lambda: erin.patch_status("SideEffect", name, {"approval": approval}))
    assert "NotNamed: an approval names who gave it: set status.approval.approvedBy to erin" in message
    message = _refused_for(
        lambda: erin.patch_status("SideEffect", name, {"approval": {**approval, "approvedBy": "carol"}})
    )
    assert "NotTheSender: status.approval.approvedBy names carol but this request comes from erin" in message
    assert (
        erin.patch_status("SideEffect", name, {"resolution": "Failed", "resolvedBy": "erin"})["status"][
            "resolvedBy"
        ]
        == "erin"
    )


def test_a_bot_answers_by_impersonating_the_person_it_acts_for(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    ns = namespace
    create_run(kube, ns, scenario_run("asked", {"steps": 1}))
    kube.core.create_namespaced_service_account(ns, {"metadata": {"name": "bot"}})
    answerer = [{"apiGroups": [GROUP], "resources": ["runs"], "verbs": ["get", "patch"]}]
    kube.rbac.create_namespaced_role(ns, {"metadata": {"name": "answerer"}, "rules": answerer})
    kube.rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "answerer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "answerer"},
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"},
                {"kind": "ServiceAccount", "name": "bot", "namespace": ns},
            ],
        },
    )
    impersonate = f"impersonate-alice-{ns}"
    rules = [
        {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["alice"]}
    ]
    kube.rbac.create_cluster_role({"metadata": {"name": impersonate}, "rules": rules})
    kube.rbac.create_cluster_role_binding(
        {
            "metadata": {"name": impersonate},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": impersonate},
            "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": ns}],
        }
    )
    try:
        token = kube.core.create_namespaced_service_account_token(
            "bot", ns, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
        ).status.token
        answer = {
            "requestId": "approve-sfx-1",
            "checkpointId": "asked-a1-s1",
            "value": {"approved": True},
            "idempotencyKey": "bot-approves",
            "answeredBy": "alice",
        }
        itself = kube.with_token(token)

        def refused_by_the_policy() -> str | None:  # RBAC's own 403 first, until the binding is seen
            message = _refused_for(lambda: _patch_run(itself, ns, "asked", {"resume": answer}))
            return message if "NotTheSender" in message else None

        message = wait_for(refused_by_the_policy, what="the bot refused in alice's name, by the policy")
        assert f"names alice but this request comes from system:serviceaccount:{ns}:bot" in message

        for_alice = kube.with_token(token)
        for_alice.api_client.set_default_header("Impersonate-User", "alice")  # kubectl --as=alice
        written = wait_for(
            lambda: _written_or_forbidden(lambda: _patch_run(for_alice, ns, "asked", {"resume": answer})),
            what="the bot's answer for alice (RBAC just granted)",
        )
        assert written["spec"]["resume"]["answeredBy"] == "alice"
    finally:
        kube.rbac.delete_cluster_role_binding(impersonate)
        kube.rbac.delete_cluster_role(impersonate)
