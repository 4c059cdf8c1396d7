"""The start-up check that the admission policies the fences rely on are installed.

The epoch fences and the ledger's ownership are only as strong as the ValidatingAdmissionPolicies of
agentrun.admission (docs/security.md): without them any attempt Pod could commit for another Run. They
are cluster-scoped, so in namespace-scoped mode a cluster administrator installs them once; an operator
that started without them would run agents unfenced and nobody would notice. So it reads each policy and
its binding by name and refuses to start, saying what is missing and how to install it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from agentrun.admission import POLICY_GROUP, policy_names, service_account_user
from agentrun.clock import Clock
from agentrun.core.identity import Account
from agentrun.kubeapi import ApiError, KubeApi

log = logging.getLogger("agentrun.operator")

POLICY_API: Final = f"/apis/{POLICY_GROUP}/v1"


def how_to_install(account: Account | None) -> str:
    """The command a cluster administrator runs, for this operator's ServiceAccount when it is known."""
    namespace, name = (account.namespace, account.name) if account else ("NAMESPACE", "SERVICE_ACCOUNT")
    return (
        f"a cluster administrator installs them once, exempting this operator ({namespace}/{name}): "
        f"`helm template RELEASE charts/agentrun -n {namespace} --set admission.install=true "
        f"--set serviceAccount.name={name} --show-only templates/admission.yaml | kubectl apply -f -` "
        "(for the operator agentrun-system/agentrun of manifests/: `kubectl apply -f "
        "manifests/admission.yaml`); see docs/security.md"
    )


class PoliciesMissing(RuntimeError):
    """The operator must not start: the message says what is missing and how to install it."""


@dataclass(frozen=True)
class Found:
    """What the API server returned for one name: the policy and its binding (None: not found)."""

    policy: Mapping[str, Any] | None
    binding: Mapping[str, Any] | None


def problems(found: Mapping[str, Found], operator_user: str | None) -> list[str]:
    """What is wrong with the installed policies (empty: nothing). `operator_user` is the operator's own
    identity (system:serviceaccount:NS:NAME), which the policies must exempt; None when it runs as
    another user (a developer's kubeconfig): then that is not checked."""
    out: list[str] = []
    for name, item in found.items():
        if item.policy is None:
            out.append(f"ValidatingAdmissionPolicy {name} is missing")
            continue
        if item.binding is None:
            out.append(f"ValidatingAdmissionPolicyBinding {name} is missing (the policy is not enforced)")
        elif "Deny" not in (item.binding.get("spec", {}).get("validationActions") or []):
            out.append(f"ValidatingAdmissionPolicyBinding {name} does not deny (validationActions)")
        conditions = item.policy.get("spec", {}).get("matchConditions") or []
        expressions = " ".join(str(c.get("expression", "")) for c in conditions)
        if operator_user is not None and f"'{operator_user}'" not in expressions:
            out.append(
                f"ValidatingAdmissionPolicy {name} does not name this operator ({operator_user}): it was "
                "installed for another operator ServiceAccount, and would refuse this one's writes"
            )
    return out


async def _get(api: KubeApi, plural: str, name: str) -> Mapping[str, Any] | None:
    body: Mapping[str, Any] | None = await api.get(f"{POLICY_API}/{plural}/{name}")
    return body


async def read(api: KubeApi) -> dict[str, Found]:
    """Each policy and binding by name (the operator may read these names only)."""
    found = {}
    for name in policy_names():
        policy = await _get(api, "validatingadmissionpolicies", name)
        binding = await _get(api, "validatingadmissionpolicybindings", name)
        found[name] = Found(policy, binding)
    return found


async def verdict(api: KubeApi, account: Account | None) -> str | None:
    """Why the operator must not start (None: it may)."""
    install = how_to_install(account)
    try:
        found = await read(api)
    except ApiError as exc:
        if exc.status != 403:
            raise
        return (
            "refusing to start: cannot read the admission policies the fences rely on "
            f"({exc.message.strip() or exc.reason}); the operator reads them by name with a ClusterRole "
            f"that is installed with them; {install}"
        )
    user = service_account_user(account.namespace, account.name) if account else None
    if wrong := problems(found, user):
        return (
            "refusing to start: the admission policies that keep attempt Pods inside their fences are not "
            f"as they must be: {'; '.join(wrong)}; {install}"
        )
    return None


async def require(
    api: KubeApi, account: Account | None, clock: Clock, within: float = 30.0, interval: float = 1.0
) -> None:
    """Raises PoliciesMissing unless every policy of agentrun.admission is installed, bound and names
    this operator, within `within` seconds: a Helm install creates the Deployment before the policies
    (Helm applies kinds it does not know last), so they may appear just after the operator starts."""
    deadline = clock.monotonic() + within
    while (problem := await verdict(api, account)) is not None:
        if clock.monotonic() >= deadline:
            raise PoliciesMissing(problem)
        await clock.sleep(interval)
    log.info("the %d admission policies are installed and bound", len(policy_names()))


REQUIRE_ENV: Final = "AGENTRUN_REQUIRE_ADMISSION_POLICIES"


def required(env: Mapping[str, str]) -> bool:
    """Whether to check (default yes). Only a development set-up without the policies turns it off
    (AGENTRUN_REQUIRE_ADMISSION_POLICIES=false): its attempt Pods then run unfenced."""
    return env.get(REQUIRE_ENV, "true").strip().lower() not in ("false", "0", "no")


WAIT_ENV: Final = "AGENTRUN_ADMISSION_POLICY_WAIT_SECONDS"


def wait_seconds(env: Mapping[str, str]) -> float:
    """How long to wait for the policies to appear before refusing to start (default 30 s)."""
    return float(env.get(WAIT_ENV, "30"))
