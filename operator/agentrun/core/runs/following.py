"""Following a Run's current Attempt: the rows the Running and the Compensating sub-tables share
(core.runs.attempts, core.runs.compensation), each one function used in both.

A row says when it applies and what follows; where the two phases differ (what comes before every row's
writes, which Attempt a grant promised, how an Attempt's end moves the Run on, what an Attempt's agent
achieved, how a lease that ran out is taken over, when to look again), a `Following` of the phase says it.
"""

from __future__ import annotations

from agentrun.api import FINISHED_ATTEMPT_PHASES, Attempt, AttemptFailure, AttemptPhase, FailureClass
from agentrun.core import failures
from agentrun.core.plan import PatchAttemptStatus
from agentrun.core.pods import PodView
from agentrun.core.runs.grants import pod_created
from agentrun.core.runs.transition import NOTHING, Transition, trace_of, wake_in, writes
from agentrun.core.runs.world import RECHECK_SECONDS, World


class Following:
    """How one phase's sub-table follows its current Attempt (its methods that a row's name does not
    name), and the rows both sub-tables share (the others, each a row: `Rule(name, following.row)`)."""

    # ---- what the phases say for themselves ------------------------------------------------------------

    def first(self, w: World) -> Transition:
        """Written before each shared row's own writes."""
        return NOTHING

    def promised(self, w: World) -> tuple[Attempt, Transition]:
        """The current Attempt, which a grant promised (the Run's status names it) but which is not seen,
        and its creation."""
        raise NotImplementedError

    def end(
        self, w: World, attempt: Attempt, phase: AttemptPhase, failure: AttemptFailure | None
    ) -> Transition:
        """The Attempt ends now in `phase` (with `failure`): its end recorded, and the Run moved on."""
        raise NotImplementedError

    def concluded(self, w: World, attempt: Attempt, pod: PodView) -> Transition:
        """Its agent container ended: what the Attempt achieved, recorded, and the Run moved on."""
        raise NotImplementedError

    def taken_over(self, w: World, attempt: Attempt, pod: PodView) -> Transition:
        """Its Lease ran out while its agent runs: revoked, its Pod stopped, the Attempt LeaseLost."""
        raise NotImplementedError

    def ended(self, w: World, attempt: Attempt) -> Transition:
        """Its end was recorded before: the Run moved on from it."""
        raise NotImplementedError

    def wakes(self, w: World, attempt: Attempt, pod: PodView) -> Transition:
        """When else to look again at a live Attempt (beside its Lease)."""
        return NOTHING

    # ---- the shared rows -------------------------------------------------------------------------------

    def attempt_promised(self, w: World) -> Transition | None:
        """The current Attempt not seen -> a grant interrupted after the Run's write: the Attempt it
        promised created now, then its Pod."""
        if w.current is not None:
            return None
        attempt, created = self.promised(w)
        return self.first(w).then(created, pod_created(w, attempt))

    def pod_refused(self, w: World) -> Transition | None:
        """Not started, and the API server refused its Pod as invalid (e.g. a bad podTemplate) -> the
        Attempt Failed (deterministic: such a Pod cannot exist, retrying cannot help); the Run moves on
        from it."""
        attempt = live_attempt(w)
        if attempt is None or w.current_pod is not None or attempt.status.start_time is not None:
            return None
        if (refusal := w.refused_pods.get(str(attempt.metadata.name))) is None:
            return None
        return self.first(w).then(self.end(w, attempt, AttemptPhase.FAILED, pod_refusal(refusal)))

    def pod_not_created(self, w: World) -> Transition | None:
        """Not started and no Pod seen -> its Pod created (not created yet, or not in the cache yet:
        creating is idempotent)."""
        attempt = live_attempt(w)
        if attempt is None or w.current_pod is not None or attempt.status.start_time is not None:
            return None
        return self.first(w).then(pod_created(w, attempt))

    def pod_lost(self, w: World) -> Transition | None:
        """Started, and its Pod is gone -> the Attempt Failed (pod lost); the Run moves on from it."""
        attempt = live_attempt(w)
        if attempt is None or w.current_pod is not None:
            return None
        return self.first(w).then(self.end(w, attempt, AttemptPhase.FAILED, failures.pod_lost()))

    def pod_ended(self, w: World) -> Transition | None:
        """Its agent container ended -> what the Attempt achieved (Running: Succeeded, waiting or Failed;
        Compensating: Succeeded on exit 0, else Failed); the Run moves on from it."""
        attempt, pod = live_attempt(w), w.current_pod
        if attempt is None or pod is None or not pod.finished:
            return None
        return self.first(w).then(self.concluded(w, attempt, pod))

    def lease_expired(self, w: World) -> Transition | None:
        """Its agent runs and its Lease ran out -> taken over: the Lease revoked (a late write of the
        frozen worker is refused), its Pod stopped, the Attempt LeaseLost; the Run moves on from it."""
        live = live_pod(w)
        if live is None or not lease_judged(w, *live) or w.lease_expires_in is None or w.lease_expires_in > 0:
            return None
        return self.first(w).then(seen_running(w, *live), self.taken_over(w, *live))

    def live(self, w: World) -> Transition | None:
        """Its Pod goes on -> its start recorded once its agent runs; look again when its Lease runs out
        (the lease is judged once the agent runs: image pulls and scheduling do not count against it),
        or sooner when the phase says (Running: when its attemptTimeoutSeconds falls due)."""
        live = live_pod(w)
        if live is None:
            return None
        seen = self.first(w).then(seen_running(w, *live), self.wakes(w, *live))
        if not lease_judged(w, *live) or w.lease_expires_in is None:
            return seen.then(wake_in(RECHECK_SECONDS))
        return seen.wake_at_lease_expiry(w.lease_expires_in + 0.05)

    def attempt_ended(self, w: World) -> Transition | None:
        """Its end recorded (a commit, a refusal, an interrupt, ...) -> the Run moves on from it."""
        attempt = w.current
        if attempt is None or attempt.status.phase not in FINISHED_ATTEMPT_PHASES:
            return None
        return self.first(w).then(self.ended(w, attempt))


# ---- shared by the rows, and by the rows of one phase --------------------------------------------------


def live_attempt(w: World) -> Attempt | None:
    """The current Attempt, while it has not ended (no phase yet: pending)."""
    attempt = w.current
    if attempt is None or attempt.status.phase in FINISHED_ATTEMPT_PHASES:
        return None
    return attempt


def live_pod(w: World) -> tuple[Attempt, PodView] | None:
    """The current Attempt and its Pod, while both go on."""
    attempt, pod = live_attempt(w), w.current_pod
    if attempt is None or pod is None or pod.finished:
        return None
    return attempt, pod


def pod_refusal(refusal: str) -> AttemptFailure:
    return failures.failure(FailureClass.DETERMINISTIC, f"the attempt Pod was refused: {refusal}")


def seen_running(w: World, attempt: Attempt, pod: PodView) -> Transition:
    """The agent's start recorded, if its Pod shows it and the Attempt does not yet."""
    if not pod.running_since or attempt.status.phase == AttemptPhase.RUNNING:
        return NOTHING
    started = {"phase": "Running", "startTime": pod.running_since, "podName": pod.name}
    started["traceId"] = trace_of(w)
    return writes(PatchAttemptStatus(str(attempt.metadata.name), started, attempt.metadata.resource_version))


def lease_judged(w: World, attempt: Attempt, pod: PodView) -> bool:
    """Whether the Attempt's lease is judged now: it holds the Lease at its epoch, and its agent runs."""
    lease, name = w.lease, attempt.metadata.name
    holds = lease is not None and lease.holder == name and lease.epoch == attempt.spec.lease_epoch
    return holds and bool(pod.running_since)
