"""The Run's first Attempt cannot start where its namespace has no credentials for the state store
(core.store_credentials): the Run fails first, saying what to create; unless the operator makes them
itself (the bundled store): then they are made first, by the one rule that asks for it."""

from __future__ import annotations

from typing import Any

from agentrun.api import FailureClass, RunPhase
from agentrun.core.failures import fingerprint
from agentrun.core.identity import may_start_pods
from agentrun.core.plan import ProvisionStoreCredentials
from agentrun.core.runs.transition import Transition, event, set_phase, writes
from agentrun.core.runs.world import World
from agentrun.core.store_credentials import CREDENTIALS_MISSING, credentials_refusal, needs_secret


def provision(w: World) -> Transition | None:
    """A Pod may start and the Run's namespace has no Secret of its store credentials, which the operator
    makes itself (the bundled store) and was not refused -> they are made (principals on the store, their
    Secrets), then the Run is decided again: no phase is written. Before any rule that could start a Pod,
    so that none of them fails the Run for what the operator can make."""
    if not w.store_credentials_missing or not w.provisions_store_credentials or w.store_provisioning_refused:
        return None
    if w.state_store is None or not needs_secret(w.state_store) or not may_start_pods(w.run):
        return None
    if w.account_refusal is not None or w.attempt_role_denied:
        return None  # the ServiceAccount's fix is said first (FirstAttempt, every grant)
    return writes(ProvisionStoreCredentials(str(w.run.metadata.namespace))).wake_in(0)


def credentials_missing(w: World) -> Transition | None:
    """First seen (no phase yet), or Queued, while a state store is configured and the Run's namespace
    has no Secret of its credentials (its ServiceAccount being allowed: else FirstAttempt says so first)
    -> Failed (StateStoreCredentialsMissing), before any Lease, Attempt or Pod; the message names the
    Secret and the command that creates it."""
    if w.account_refusal is not None or w.attempt_role_denied:
        return None  # who the Pods run as is said first (FirstAttempt): that fix comes before the Secret
    return refused(w)


def refused(w: World, **fields: Any) -> Transition | None:
    """The Run Failed for its namespace's missing store credentials; None when they are there (or none
    are needed). Also checked by every later grant (core.runs.grants): a Secret deleted since. Where the
    operator makes them (provision), it comes to this only once the bundled store refused."""
    if w.state_store is None or not needs_secret(w.state_store) or not w.store_credentials_missing:
        return None
    message = credentials_refusal(w.state_store, str(w.run.metadata.namespace))
    # status.failure as core.runs.grants.failure_fields writes it (grants asks this module, not back).
    failure = {
        "class": FailureClass.DETERMINISTIC.value,
        "reason": CREDENTIALS_MISSING,
        "message": message,
        "fingerprint": fingerprint(FailureClass.DETERMINISTIC, message),
    }
    failed = set_phase(
        RunPhase.FAILED, CREDENTIALS_MISSING, message, failure=failure, nextAttemptTime=None, **fields
    )
    return failed.then(event("Warning", CREDENTIALS_MISSING, message))
