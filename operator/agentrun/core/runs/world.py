"""What the state machine reads: the Run and what it owns, as observed now."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from agentrun.api import Attempt, AttemptFailure, Checkpoint, Run, SideEffect, StateStoreMode
from agentrun.core.blobrestore import Restoration
from agentrun.core.fork import ForkSourceView
from agentrun.core.lease import LeaseView
from agentrun.core.pods import PodView, StateStorePodEnv

# Without a sighting of the Lease yet (operator just started), look again this soon.
RECHECK_SECONDS = 5.0


@dataclass(frozen=True)
class World:
    """Everything the decision needs, as observed now."""

    run: Run
    attempts: Mapping[int, Attempt]
    pods: Mapping[str, PodView]
    lease: LeaseView | None
    now: datetime
    # Seconds before the current holder's lease expires on the operator's clock (<= 0: expired),
    # None while the operator has not seen the Lease yet.
    lease_expires_in: float | None = None
    side_effects: Sequence[SideEffect] = ()
    checkpoints: Sequence[Checkpoint] = ()
    # Why attempt Pods may not run as the Run's ServiceAccount (core.identity.account_refusal); None: they
    # may. The I/O layer looks it up whenever core.identity.may_start_pods says a Pod may be started.
    account_refusal: str | None = None
    # What the Run's (opted-in) ServiceAccount may not do of what the attempt role grants (e.g. "patch
    # runs/status"), asked of the API server by the I/O layer at the same times; empty: nothing denied.
    attempt_role_denied: tuple[str, ...] = ()
    # Attempts whose Pod the API server refused to create as invalid (400, 422: e.g. a bad podTemplate),
    # with the refusal: observed by the I/O layer when it carried out a CreatePod; such a Pod cannot
    # exist, and the Running and Compensating tables decide what becomes of its Attempt.
    refused_pods: Mapping[str, str] = field(default_factory=dict)
    # What became of the blobs the Run's StateUnverifiable failure names, when the I/O layer restored them
    # for that failure (core.plan.RestoreBlobs; empty: it names none the operator can look at); None: not
    # restored yet. The StateRestore rule records it (core.runs.restoring).
    restorations: tuple[Restoration, ...] | None = None
    # Names the Run needs (its Lease, an Attempt, an Attempt's Pod) that an object it does not own holds,
    # with that object's kind (name -> "Lease", "Attempt", "Pod"): observed by the I/O layer when a create
    # of the Run's found it; the NameSquatted rule decides. Forgotten once the Run has ended.
    squatted: Mapping[str, str] = field(default_factory=dict)
    # The agent-state store attempt Pods are told of (its URL and the Secret of the Run's namespace that
    # holds the namespace's credentials for it): the operator's settings; None without a store.
    state_store: StateStorePodEnv | None = None
    # The Run's namespace has no Secret named state_store.secret, as the I/O layer found when it looked
    # (whenever core.identity.may_start_pods says a Pod may be started and the store needs one): a read,
    # nothing is made while the World is observed.
    store_credentials_missing: bool = False
    # The operator makes a namespace's principals and their Secrets itself (the bundled object store, whose
    # root credentials it holds): a missing Secret is made (core.plan.ProvisionStoreCredentials, asked by
    # core.runs.store_credentials.provision) before the Run is failed for it.
    provisions_store_credentials: bool = False
    # The bundled store refused to make them when the I/O layer last carried that out for this Run (its
    # log says why): the Run fails as it would without the bundled store. Forgotten once the Secret is
    # found or no Pod may start.
    store_provisioning_refused: bool = False
    # Whether the operator has a state store of its own: a finished Run's checkpoint index and archive,
    # and Attempts' log tails, go there.
    has_store: bool = False
    # Where the operator keeps agent state (its settings: OperatorSettings.state_store_mode), written on
    # the Run with each phase change (status.stateStore); None: not said (tests of other matters).
    store_mode: StateStoreMode | None = None
    # A finished Run's time to live when its spec.ttlSecondsAfterFinished is unset (core.runs.expiry; None:
    # kept).
    default_ttl_seconds: int | None = None
    # A fork's source (spec.forkFrom), observed by the I/O layer while the fork has not started (phase
    # None or Queued); None otherwise, or when not looked at yet.
    fork_source: ForkSourceView | None = None
    # The Run's objects that carry metadata.managedFields, as (plural, name): ("runs", the Run's name),
    # ("attempts", ...), ("sideeffects", ...), ("checkpoints", ...). A compacted Run's are cleared
    # (core.runs.compaction); the I/O layer observes which still have them.
    managed_fields: frozenset[tuple[str, str]] = frozenset()

    def failure_of(self, number: int) -> AttemptFailure | None:
        attempt = self.attempts.get(number)
        return attempt.status.failure if attempt else None

    @property
    def current(self) -> Attempt | None:
        """The Run's current Attempt, when it is observed."""
        number = self.run.status.current_attempt
        return self.attempts.get(number) if number else None

    @property
    def current_pod(self) -> PodView | None:
        attempt = self.current
        return self.pods.get(str(attempt.metadata.name)) if attempt else None


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
