"""Who attempt Pods run as, and which objects are a Run's own: no borrowed identity, no adoption.

A Run's user may create Runs, not Pods: the operator creates the Pods, so whatever ServiceAccount a Pod
names is lent by the operator. It lends only accounts an administrator opted in (label
agentrun.dev/agent=true), and never its own; and only once the account may do what an attempt Pod does
(the attempt role bound), so a missing binding fails the Run with its fix, not the agent with a 403.
And an object that merely carries an agentrun name or label is not the Run's: only one that names the
Run (by UID) as its owner is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun.api import AGENT_LABEL, TERMINAL_PHASES, Run, RunPhase
from agentrun.core import controls
from agentrun.rbac import ATTEMPT_ROLE

DEFAULT_SERVICE_ACCOUNT = "default"
NOT_ALLOWED = "ServiceAccountNotAllowed"
ROLE_NOT_BOUND = "AttemptRoleNotBound"
READ_VERBS = frozenset({"get", "list", "watch"})
# The setup of the examples' agents' namespace: the labelled ServiceAccount, the Role and its binding.
EXAMPLES_SETUP = "kubectl apply -f examples/agents.yaml"
NAME_SQUATTED = "NameSquatted"


@dataclass(frozen=True)
class Account:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def agent_account(run: Run) -> Account:
    """The ServiceAccount the Run's attempt Pods run as: spec.agent.serviceAccountName, else the
    namespace's default (a Pod without serviceAccountName gets it)."""
    name = run.spec.agent.service_account_name or DEFAULT_SERVICE_ACCOUNT
    return Account(str(run.metadata.namespace), name)


def account_refusal(
    account: Account, labels: Mapping[str, str] | None, operator: Account | None
) -> str | None:
    """Why attempt Pods may not run as `account` (None: they may). labels: the ServiceAccount's labels,
    None when it does not exist; operator: the operator's own ServiceAccount, None when it has none."""
    opt_in = f"kubectl label serviceaccount {account.name} -n {account.namespace} {AGENT_LABEL}=true"
    if operator is not None and account == operator:
        return (
            f"ServiceAccount {account} is the agentrun operator's own: attempt Pods never run as it "
            "(even when labelled); set spec.agent.serviceAccountName to an agents' ServiceAccount"
        )
    if labels is None:
        return f"ServiceAccount {account} does not exist: create it and opt it in with `{opt_in}`"
    if labels.get(AGENT_LABEL) != "true":
        return (
            f"ServiceAccount {account} is not labelled {AGENT_LABEL}=true: an administrator opts it in "
            f"for attempt Pods with `{opt_in}`"
        )
    return None


def role_refusal(account: Account, denied: Sequence[str]) -> str | None:
    """Why attempt Pods may not run as `account` although it is opted in: it may not do `denied` (what
    the attempt role grants, e.g. "patch runs/status"); None when nothing was denied."""
    if not denied:
        return None
    # The writes first: they are what an agent reports with (reading alone would not be the role).
    writes_first = sorted(denied, key=lambda d: d.split(" ")[0] in READ_VERBS)
    shown = ", ".join(writes_first[:3]) + (f" and {len(denied) - 3} more" if len(denied) > 3 else "")
    # A binding of its own per account: the namespace may already bind the role to another account.
    bind = (
        f"kubectl create rolebinding {ATTEMPT_ROLE}-{account.name} -n {account.namespace} "
        f"--role={ATTEMPT_ROLE} --serviceaccount={account.namespace}:{account.name}"
    )
    return (
        f"ServiceAccount {account} is not bound to the attempt role (it may not {shown}): its agent "
        f"could not report; bind it with `{bind}` (the Role as examples/agents.yaml makes it; a Helm "
        f"install names it RELEASE-attempt, a ClusterRole unless namespaced: --clusterrole=RELEASE-attempt); "
        f"for the examples' namespace `{EXAMPLES_SETUP}` sets up all of it"
    )


def may_start_pods(run: Run) -> bool:
    """Whether deciding this Run may start an attempt Pod, so the operator must know its account. A
    stopped Run starts none, unless a retry request it has not judged yet asks for one."""
    phase = run.status.phase
    if phase not in TERMINAL_PHASES and phase != RunPhase.NEEDS_RECONCILIATION:
        return True
    request = run.spec.retry_request
    return request is not None and controls.processed(run, request.idempotency_key) is None


def owned_by(obj: Mapping[str, Any], run_uid: str | None, *, controller: bool) -> bool:
    """Whether `obj` names the Run as its owner (as its controller, when `controller`): what the
    operator creates for a Run is controlled by it, what the SDK creates is owned by it."""
    if not run_uid:
        return False
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if (
            ref.get("uid") == run_uid
            and ref.get("kind") == "Run"
            and (ref.get("controller") or not controller)
        ):
            return True
    return False


def squatted(kind: str, name: str) -> str:
    return (
        f"{kind} {name} exists and is not owned by this Run: agentrun never adopts what it did not create; "
        f"delete the {kind}, then ask for a retry (spec.retryRequest)"
    )
