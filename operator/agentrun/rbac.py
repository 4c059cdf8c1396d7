"""RBAC rules: the single source for the Helm chart, the plain manifests and the tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrun.api import AGENT_LABEL, GROUP

Rule = dict[str, Any]
# The Role (and, by convention, its RoleBinding) that gives an agents' ServiceAccount ATTEMPT_POD_RULES.
ATTEMPT_ROLE = "agentrun-attempt"
# The Secret in each agent namespace holding its credentials for the state store (the operator's
# AGENTRUN_STATE_STORE_SECRET, by default): the operator reads it by this name, and no other Secret.
STATE_STORE_SECRET = "agentrun-state-store"
# ... and its read-only principal's, for people (RBAC lets them get it).
STATE_STORE_READ_SECRET = STATE_STORE_SECRET + "-read"

# What an attempt Pod's service account needs, and nothing more: read its Run and write its status
# (the fenced commits), renew the Run's Lease, save Checkpoints, record SideEffects, and mark its own
# Attempt (a rejected commit, usage).
ATTEMPT_POD_RULES: list[Rule] = [
    {"apiGroups": [GROUP], "resources": ["runs"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [GROUP], "resources": ["runs/status"], "verbs": ["get", "patch"]},
    {"apiGroups": [GROUP], "resources": ["attempts"], "verbs": ["get", "list"]},
    {"apiGroups": [GROUP], "resources": ["attempts/status"], "verbs": ["get", "patch"]},
    {"apiGroups": [GROUP], "resources": ["checkpoints"], "verbs": ["get", "list", "create"]},
    {"apiGroups": [GROUP], "resources": ["sideeffects"], "verbs": ["get", "list", "create"]},
    {"apiGroups": [GROUP], "resources": ["sideeffects/status"], "verbs": ["get", "patch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "patch"]},
]

# The operator: drive Runs, own Attempts, Pods and Leases, read which ServiceAccounts agents may use,
# post Events; kopf needs to list/watch
# namespaces and CRDs, and (with peering) its peering objects, which the operator creates when missing
# (agentrun.operator.bootstrap).
OPERATOR_RULES: list[Rule] = [
    # delete: a finished Run past its time to live, once its archive is verified in the state store;
    # patch (here and on attempts, checkpoints and sideeffects): a compacted Run's managedFields cleared
    # (a metadata-only merge patch, core.runs.compaction; the operator writes no spec)
    {"apiGroups": [GROUP], "resources": ["runs"], "verbs": ["get", "list", "watch", "patch", "delete"]},
    {"apiGroups": [GROUP], "resources": ["runs/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [GROUP], "resources": ["attempts"], "verbs": ["get", "list", "watch", "create", "patch"]},
    {"apiGroups": [GROUP], "resources": ["attempts/status"], "verbs": ["get", "patch"]},
    {
        "apiGroups": [GROUP],
        "resources": ["checkpoints", "sideeffects"],
        # create: a fork's copy of its source's checkpoint and its inherited records (core.fork)
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": [GROUP], "resources": ["sideeffects/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete"]},
    # The tail of an ended Attempt's log is kept before its Pod is deleted (Run spec.podGC).
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    # Attempt Pods run only as ServiceAccounts labelled agentrun.dev/agent=true (agentrun.core.identity).
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "list", "watch"]},
    # ... and only when they may do what an attempt Pod does (agentrun.operator.attempt_role asks).
    {"apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"], "verbs": ["create"]},
    # ... and only where the namespace holds the state store's credentials (operator.store_credentials).
    {
        "apiGroups": [""],
        "resources": ["secrets"],
        "verbs": ["get"],
        "resourceNames": [STATE_STORE_SECRET, STATE_STORE_READ_SECRET],
    },
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        # delete: a finished Run's Lease goes (compaction; the next grant takes status.leaseEpoch + 1)
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["get", "list", "watch"],
    },
    {
        "apiGroups": ["kopf.dev"],
        "resources": ["clusterkopfpeerings", "kopfpeerings"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
]


@dataclass(frozen=True)
class Permission:
    """One thing a rule grants: a verb on a resource (with its subresource, as in "runs/status")."""

    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.resource}"


def permissions(rules: list[Rule]) -> list[Permission]:
    """Every (group, resource, verb) the rules grant, in their order."""
    return [
        Permission(group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]


def attempt_role(namespace: str, name: str = ATTEMPT_ROLE) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": ATTEMPT_POD_RULES,
    }


# With the bundled object store, the operator makes each opted-in namespace's Secrets of the store's
# credentials (operator.store_credentials): `create` cannot be limited to a name, so this is granted only
# to an operator told AGENTRUN_STATE_STORE_PROVISION (the local control plane's, the chart's with its
# own server), never by default.
STATE_STORE_PROVISION_RULES: list[Rule] = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
# ... and, watching some namespaces only, reads each of them by name (cluster-scoped: granted by a
# ClusterRole limited to their names), so that its sweep of the server's principals sees one deleted
# (operator.store_principals); cluster-wide, OPERATOR_RULES already lists namespaces.
STATE_STORE_NAMESPACE_RULES: list[Rule] = [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]

# Opts a ServiceAccount in for attempt Pods (a merge patch): an administrator's decision, never a Run's.
AGENT_ACCOUNT_PATCH: dict[str, Any] = {"metadata": {"labels": {AGENT_LABEL: "true"}}}
