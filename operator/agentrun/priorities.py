"""API Priority and Fairness for agentrun: the single source of its PriorityLevelConfigurations and
FlowSchemas, for the chart, the plain manifests, the tests and the demo (like agentrun.admission).

Without them every request of the operator and of attempt Pods falls into the API server's
`workload-low`, queued beside every other tenant's controllers. Two levels keep them apart:
- `agentrun-control`: the operator's own requests and every Lease renewal of a ServiceAccount (attempt
  Pods renew their Run's Lease there). A renewal that waits behind a flood loses a lease that was
  healthy, and the operator's decisions are what every Run waits on.
- `agentrun-steps`: what attempt Pods write to agentrun.dev (Checkpoints, SideEffects, the Run's fenced
  status), fair between namespaces, so that one busy namespace's agents cannot starve another's.

The FlowSchemas are matched after the API server's own system schemas (leader election, nodes,
kube-system: precedence below 1000) and before its `service-accounts` schema (9000), which would put
these requests into workload-low. Lease renewals are matched by resource, not by name (a FlowSchema
cannot select names or labels): another ServiceAccount's Lease renewals outside kube-system share the
control level too, which only serves them sooner.
"""

from __future__ import annotations

from typing import Any, Final

from agentrun.api import GROUP

Manifest = dict[str, Any]

FLOW_CONTROL_API: Final = "flowcontrol.apiserver.k8s.io/v1"
CONTROL_LEVEL: Final = "agentrun-control"
STEPS_LEVEL: Final = "agentrun-steps"
# Matched before the API server's service-accounts schema (9000) and after its system ones (< 1000).
PRECEDENCE: Final = {"agentrun-operator": 1000, "agentrun-lease-renewals": 1010, "agentrun-steps": 1020}
SERVICE_ACCOUNTS: Final = {"kind": "Group", "group": {"name": "system:serviceaccounts"}}


def _level(name: str, shares: int, description: str) -> Manifest:
    """A Limited priority level whose requests queue (never rejected at once) when its seats are taken.
    Shares compare with the API server's own: workload-low 100, workload-high 40, global-default 20."""
    return {
        "apiVersion": FLOW_CONTROL_API,
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": name, "annotations": {"agentrun.dev/description": description}},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": shares,
                "lendablePercent": 50,
                "limitResponse": {
                    "type": "Queue",
                    "queuing": {"queues": 64, "handSize": 6, "queueLengthLimit": 50},
                },
            },
        },
    }


def _schema(name: str, level: str, subject: Manifest, rules: list[Manifest], distinguisher: str) -> Manifest:
    return {
        "apiVersion": FLOW_CONTROL_API,
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": level},
            "matchingPrecedence": PRECEDENCE[name],
            "distinguisherMethod": {"type": distinguisher},
            "rules": [{"subjects": [subject], **rule} for rule in rules],
        },
    }


def api_priorities(operator_namespace: str, operator_account: str) -> list[Manifest]:
    """The priority levels and the FlowSchemas that send the operator (ServiceAccount `operator_account`
    in `operator_namespace`) and attempt Pods to them."""
    operator = {
        "kind": "ServiceAccount",
        "serviceAccount": {"name": operator_account, "namespace": operator_namespace},
    }
    everything = {
        "resourceRules": [
            {
                "verbs": ["*"],
                "apiGroups": ["*"],
                "resources": ["*"],
                "clusterScope": True,
                "namespaces": ["*"],
            }
        ],
        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
    }
    renewals = {
        "resourceRules": [
            {
                "verbs": ["get", "update", "patch"],
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "namespaces": ["*"],
            }
        ]
    }
    steps = {
        "resourceRules": [
            {
                "verbs": ["*"],
                "apiGroups": [GROUP],
                "resources": ["*"],
                "namespaces": ["*"],
            }
        ]
    }
    return [
        _level(CONTROL_LEVEL, 30, "the agentrun operator and Lease renewals: served before agents' steps"),
        _level(STEPS_LEVEL, 40, "what agentrun's attempt Pods write, fair between namespaces"),
        _schema("agentrun-operator", CONTROL_LEVEL, operator, [everything], "ByUser"),
        _schema("agentrun-lease-renewals", CONTROL_LEVEL, SERVICE_ACCOUNTS, [renewals], "ByNamespace"),
        _schema("agentrun-steps", STEPS_LEVEL, SERVICE_ACCOUNTS, [steps], "ByNamespace"),
    ]
