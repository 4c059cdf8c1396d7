"""Who may reach the agent-state store from an attempt Pod: the Run's namespace, with the credentials of
its own Secret (a principal limited to that namespace's data, get and put, no delete).

The Pod takes them by secretKeyRef: where the Secret is missing, the kubelet would leave the Pod waiting
with CreateContainerConfigError, which reads like a stuck agent. So the operator looks for the Secret
before any Attempt and, missing, fails the Run with what to create.
"""

from __future__ import annotations

from typing import Final

from agentrun.core.pods import StateStorePodEnv

CREDENTIALS_MISSING: Final = "StateStoreCredentialsMissing"


def needs_secret(store: StateStorePodEnv | None) -> bool:
    """Whether attempt Pods cannot start without the namespace's Secret of the store's credentials."""
    return store is not None and bool(store.required_credentials)


def credentials_refusal(store: StateStorePodEnv, namespace: str) -> str:
    """Why a Run of `namespace` cannot start: its store's Secret is missing; the message says what to
    create (the values themselves are the administrator's: a principal for this namespace only)."""
    literals = " ".join(f"--from-literal={key}=..." for key in store.required_credentials)
    create = f"kubectl create secret generic {store.secret} -n {namespace} {literals}"
    return (
        f"the agent-state store needs credentials in namespace {namespace}: Secret {store.secret} does not "
        f"exist there. An administrator creates it with `{create}`, holding a principal limited to this "
        "namespace's prefix of the store (get and put, no delete); then ask for a retry (spec.retryRequest)"
    )
