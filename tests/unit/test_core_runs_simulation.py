"""core.runs: restart safety, by simulation. Whole Runs run against an in-memory model of the API server
and the operator is killed between any two writes of any decision, to show that a restart continues
without skipping or reusing an epoch, creating an Attempt twice or rewriting history. The crash points
that matter most (between the writes of a grant, a takeover, a cancel and a resume) are also played on
the real API server with the real Executor: tests/integration/namespaced/test_restart_safety.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

from agentrun.api import (
    Attempt,
    Checkpoint,
    SideEffect,
)
from agentrun.core.lease import LeaseView, Sighting, seconds_until_expiry, sight
from agentrun.core.plan import (
    Action,
    ClearManagedFields,
    CreateAttempt,
    CreatePod,
    DeleteCheckpoint,
    DeleteLease,
    DeletePod,
    PatchAttemptStatus,
    PatchRunStatus,
    Plan,
    RecordEvent,
    SaveLogTail,
    WriteCheckpointIndex,
    WriteLease,
)
from agentrun.core.pods import pod_view
from agentrun.core.runs import World, compaction, decide
from unit.factories import (
    CREATED,
    NO_SIDE_EFFECTS,
    RUN,
    make_run,
    make_side_effect,
    name_of,
    ts,
)
from unit.run_worlds import (
    FINISHED,
    merge,
    sdk,
)

# ---- restart safety, by simulation -------------------------------------------------------------------------


class Violation(AssertionError):
    """A write the API server would refuse, or one that breaks a promise of docs/design.md."""


# What a person (or another system) does to a resting Run: in the phase given, a spec merge patch (or a
# function of the Run's status returning one), or "resolve" (settle every Unknown SideEffect as Confirmed).
UserAction = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | str
UserStep = tuple[str, UserAction]
REPORTED_PHASES = ("Succeeded", "Failed", "Cancelled", "NeedsReconciliation")


def answer(value: Any, key: str, request_id: str | None = None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """spec.resume answering the pending request (or `request_id`) with `value`."""

    def build(status: dict[str, Any]) -> dict[str, Any]:
        pending = status["pendingRequest"]
        return {
            "resume": {
                "requestId": request_id or pending["requestId"],
                "checkpointId": pending["checkpointId"],
                "value": value,
                "idempotencyKey": key,
            }
        }

    return build


def retry_request(key: str) -> dict[str, Any]:
    return {"retryRequest": {"idempotencyKey": key, "reason": "fixed"}}


@dataclass
class Cluster:
    """An API server, a kubelet, the workers and a user, in memory: enough to carry out Plans like the
    executor.

    Writes are checked as the API server would (resourceVersion preconditions, idempotent creates by
    name, an ended Attempt keeps its phase, a Succeeded or Cancelled Run keeps everything but its
    report) plus the promises of restart safety (a lease epoch only ever moves by one, an Attempt is never
    created with another spec than the first time, a Checkpoint still pointed at is never pruned).

    Each attempt's fate is scripted: "exit:<code>[:<message>]" ends it after it ran one tick, "commit"
    commits a result and exits 0, "ticket" records a Confirmed irreversible SideEffect then commits,
    "unknown" records an Unknown SideEffect and exits with class unknown_side_effect, "interrupt" saves a
    Checkpoint and an input request and exits 0, "hang" keeps it running without renewing its lease,
    "forever" keeps it running and renewing, "pausable" does so until spec.pause asks it to pause,
    "cancel" makes the user raise spec.cancelEpoch while it runs, "commit-then-cancel" commits and exits
    just before the user raises spec.cancelEpoch. A worker that runs first saves `saves` Checkpoints.
    """

    spec: dict[str, Any]
    fates: dict[int, str]
    user: list[UserStep] = field(default_factory=list)
    # Steps a person takes while the operator restarts (between the crash and its successor's first
    # decision), in the phase given: a write that races the new operator.
    racing: list[UserStep] = field(default_factory=list)
    saves: int = 0
    clock: float = 1.0  # seconds since the Run was created, also the operator's monotonic clock
    status: dict[str, Any] | None = None
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    side_effects: dict[str, dict[str, Any]] = field(default_factory=dict)
    lease: dict[str, Any] | None = None
    sighting: Sighting | None = None
    resource_version: int = 100
    lease_epochs: list[int] = field(default_factory=list)  # every epoch written, in order
    pods_created: list[str] = field(default_factory=list)
    checkpoints_pruned: list[str] = field(default_factory=list)
    saved: set[str] = field(default_factory=set)  # attempts whose worker saved its Checkpoints
    store: bool = False  # whether the operator has a state store
    indexed: set[str] = field(default_factory=set)  # the Checkpoints the recorded index names
    saved_checkpoints: list[str] = field(default_factory=list)  # every Checkpoint saved, in order
    # The objects that carry managedFields, as (plural, name): every write adds its writer's entry (the
    # harder case: a real API server adds none on a plain update of an object without any, only on a
    # server-side apply), and only a ClearManagedFields removes them (the API server's reset).
    managed: set[tuple[str, str]] = field(default_factory=set)

    @property
    def now(self) -> datetime:
        return CREATED + timedelta(seconds=self.clock)

    def _next_rv(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def world(self) -> World:
        lease = expires_in = None
        run = make_run(self.status, spec={"podGC": "OnAttemptEnd", **self.spec})  # the API's default
        if self.lease is not None:
            lease = LeaseView(self.lease["holder"], self.lease["epoch"], self.lease["rv"])
            self.sighting = sight(self.sighting, lease.resource_version, self.clock)
            expires_in = seconds_until_expiry(self.sighting, run.spec.lease.duration_seconds, self.clock)
        parsed = (Attempt.model_validate(body) for body in self.attempts.values())
        views = (pod_view(body) for body in self.pods.values())
        return World(
            run=run,
            attempts={a.spec.number: a for a in parsed},
            pods={v.name: v for v in views},
            lease=lease,
            now=self.now,
            lease_expires_in=expires_in,
            side_effects=[SideEffect.model_validate(b) for b in self.side_effects.values()],
            checkpoints=[Checkpoint.model_validate(b) for b in self.checkpoints.values()],
            has_store=self.store,
            managed_fields=frozenset(self.managed),
        )

    def protected_checkpoints(self) -> set[str]:
        status = self.status or {}
        protected = {status.get("latestCheckpoint"), (status.get("pendingRequest") or {}).get("checkpointId")}
        protected |= {a["spec"].get("resumeFrom") for a in self.attempts.values()}
        return {c for c in protected if c}

    # ---- the API server

    def _written(self, kind: str, name: str, body: dict[str, Any] | None = None) -> None:
        """A write of an object: its writer's managedFields entry, and (but the Run's) a new version."""
        self.managed.add((kind, name))
        if body is not None:
            body["metadata"]["resourceVersion"] = self._next_rv()

    def apply(self, action: Action) -> None:
        match action:
            case ClearManagedFields(kind=kind, name=name, resource_version=rv):
                if (self.status or {}).get("phase") not in ("Succeeded", "Failed", "Cancelled"):
                    raise Violation(f"managedFields of {kind}/{name} cleared before the Run ended")
                objects = {"attempts": self.attempts, "sideeffects": self.side_effects}
                objects["checkpoints"] = self.checkpoints
                if kind != "runs" and objects[kind][name]["metadata"]["resourceVersion"] != rv:
                    raise Violation(f"{kind}/{name} cleared from a stale view ({rv})")
                self.managed.discard((kind, name))
            case PatchRunStatus(patch=patch):
                self.managed.add(("runs", RUN))
                old = self.status or {}
                kept = {"sideEffects", "report", "checkpointIndex"}
                if old.get("phase") in ("Succeeded", "Cancelled") and set(patch) - kept:
                    raise Violation(f"a {old['phase']} Run changed: {patch}")
                if patch.get("leaseEpoch", old.get("leaseEpoch", 0)) < old.get("leaseEpoch", 0):
                    raise Violation(
                        f"status.leaseEpoch went back: {old['leaseEpoch']} -> {patch['leaseEpoch']}"
                    )
                self.status = merge(old, patch)
            case WriteLease(
                holder=holder, epoch=epoch, duration_seconds=duration, expected_resource_version=rv
            ):
                if rv is None and self.lease is not None:
                    raise Violation("the Lease was created twice")
                if rv is not None and (self.lease is None or self.lease["rv"] != rv):
                    raise Violation(f"the Lease write expected resourceVersion {rv}: it changed")
                # With no Lease (a finished Run's was deleted) the next epoch follows the Run's recorded one.
                previous = self.lease["epoch"] if self.lease else (self.status or {}).get("leaseEpoch", 0)
                # A revoked Lease (no holder) carries a fresh epoch that the next grant gives out as is.
                adopts_revoked = (
                    self.lease is not None and self.lease["holder"] is None and holder is not None
                )
                if epoch != (previous if adopts_revoked else previous + 1):
                    raise Violation(f"lease epoch {previous} -> {epoch}: skipped or reused")
                self.lease = {"holder": holder, "epoch": epoch, "duration": duration, "rv": self._next_rv()}
                if not adopts_revoked:
                    self.lease_epochs.append(epoch)
            case CreateAttempt(body=body):
                name, epoch = body["metadata"]["name"], body["spec"]["leaseEpoch"]
                granted = self.lease is not None and (self.lease["holder"], self.lease["epoch"]) == (
                    name,
                    epoch,
                )
                if not granted or (self.status or {}).get("leaseEpoch") != epoch:
                    raise Violation(f"{name} created before lease epoch {epoch} was granted and recorded")
                if name in self.attempts:
                    if self.attempts[name]["spec"] != body["spec"]:
                        raise Violation(f"{name} created again with another spec")
                    return
                stored = copy.deepcopy(body)
                stored["metadata"]["uid"] = f"uid-{name}"
                stored.setdefault("status", {})
                self.attempts[name] = stored
                self._written("attempts", name, stored)
            case PatchAttemptStatus(name=name, patch=patch):
                attempt = self.attempts[name]
                phase = attempt["status"].get("phase")
                if phase in FINISHED and patch.get("phase", phase) != phase:
                    raise Violation(f"{name} ended {phase} and was rewritten to {patch['phase']}")
                attempt["status"] = merge(attempt["status"], patch)
                self._written("attempts", name, attempt)
            case CreatePod(body=body):
                name = body["metadata"]["name"]
                if name not in self.attempts:
                    raise Violation(f"Pod {name} before its Attempt")
                if name not in self.pods:
                    self.pods[name] = {"metadata": {"name": name}, "status": {"phase": "Pending"}}
                    self.pods_created.append(name)
            case DeletePod(name=name):
                if name in self.pods:
                    self.pods[name]["metadata"]["deletionTimestamp"] = ts(self.now)
            case DeleteCheckpoint(name=name):
                if name in self.protected_checkpoints():
                    raise Violation(f"Checkpoint {name} pruned while the Run or an Attempt points at it")
                finished = (self.status or {}).get("phase") in ("Succeeded", "Failed", "Cancelled")
                if self.store and finished and name in self.checkpoints and name not in self.indexed:
                    raise Violation(f"Checkpoint {name} deleted before the recorded index names it")
                if self.checkpoints.pop(name, None) is not None:
                    self.checkpoints_pruned.append(name)
                self.managed.discard(("checkpoints", name))
            case WriteCheckpointIndex(checkpoints=checkpoints, previous=previous):
                if not self.store:
                    raise Violation("a checkpoint index written without a state store")
                recorded = (self.status or {}).get("checkpointIndex")
                if previous != recorded:
                    raise Violation(f"the index merged {previous}, the Run records {recorded}")
                names = (self.indexed if recorded else set()) | {c["metadata"]["name"] for c in checkpoints}
                # content-addressed: the same Checkpoints, the same blob
                digest = f"{abs(hash(tuple(sorted(names)))):064d}"[-64:]
                ref = {
                    "key": f"p/ns/uid/sha256/{digest}",
                    "sha256": digest,
                    "size": len(names),
                    "links": True,
                }
                self.indexed = names
                self.apply(PatchRunStatus({"checkpointIndex": ref}))
            case DeleteLease(resource_version=rv):
                if self.lease is None or self.lease["rv"] != rv:
                    raise Violation(f"the Lease delete expected resourceVersion {rv}: it changed")
                if (self.status or {}).get("phase") not in ("Succeeded", "Failed", "Cancelled"):
                    raise Violation("the Lease of a Run that has not ended was deleted")
                self.lease = None
            case SaveLogTail(attempt=name, pod=pod):
                if pod not in self.pods or self.pods[pod]["status"]["phase"] not in ("Succeeded", "Failed"):
                    raise Violation(f"the log tail of {pod} read before it stopped")
                self.attempts[name]["status"] = merge(
                    self.attempts[name]["status"], {"logTail": {"text": "..."}}
                )
                self._written("attempts", name, self.attempts[name])
            case RecordEvent():
                pass

    def check_after_decision(self) -> None:
        """After a complete decision: a Running Run's current Attempt holds the lease the Run records, the
        Run records the Lease's epoch, and an Attempt that lost its lease holds it no more."""
        status = self.status or {}
        if status.get("phase") == "Running":
            holder = name_of(status["currentAttempt"])
            assert self.lease is not None
            assert (self.lease["holder"], self.lease["epoch"]) == (holder, status["leaseEpoch"])
        if self.lease is not None and status.get("phase") not in ("Queued", "Cancelled"):
            assert status.get("leaseEpoch") == self.lease["epoch"], (status.get("leaseEpoch"), self.lease)
        for name, attempt in self.attempts.items():
            if attempt["status"].get("phase") == "LeaseLost":
                # no Lease at all (a finished Run's was deleted) is held by nobody
                assert self.lease is None or self.lease["holder"] != name, f"{name} still holds it"

    # ---- the kubelet, the workers and the user

    def kubelet(self) -> bool:
        """Moves every Pod one step on; True if anything the operator watches changed (renewals aside)."""
        changed = False
        for name, pod in list(self.pods.items()):
            status = pod["status"]
            if pod["metadata"].get("deletionTimestamp"):
                del self.pods[name]
                changed = True
                continue
            if status["phase"] == "Pending":
                pod["status"] = {
                    "phase": "Running",
                    "containerStatuses": [
                        {"name": "agent", "state": {"running": {"startedAt": ts(self.now)}}}
                    ],
                }
                changed = True
                continue
            if status["phase"] != "Running":
                continue
            fate = self.fates[self.attempts[name]["spec"]["number"]]
            if fate == "hang":
                continue
            if name not in self.saved:
                self.saved.add(name)
                for _ in range(self.saves):
                    self._save_checkpoint(name)
                changed = changed or self.saves > 0
            if fate in ("forever", "cancel", "pausable"):
                if fate == "cancel" and not self.spec.get("cancelEpoch"):
                    self.spec["cancelEpoch"] = 1  # the user cancels; this agent ignores it
                    changed = True
                if fate == "pausable" and self._pause_asked():
                    self._interrupt(name, "paused", self.spec["pause"]["requestId"])
                    changed = True
                    continue
                if self.lease and self.lease["holder"] == name:
                    self.lease["rv"] = self._next_rv()
                continue
            if fate in ("commit", "ticket", "commit-then-cancel"):
                if fate == "ticket":
                    self._record_effect(name, "Confirmed")
                self._commit(name)
                self._end(name, 0, "")
                if fate == "commit-then-cancel":
                    self.spec["cancelEpoch"] = 1  # too late: the result is in
            elif fate == "unknown":
                self._record_effect(name, "Unknown")
                self._end(name, 1, sdk("unknown_side_effect", "the ticket may have been created"))
            elif fate == "interrupt":
                self._interrupt(name, "input_required", None)
            else:
                _, code, *message = fate.split(":", 2)
                self._end(name, int(code), message[0] if message else None)
            changed = True
        return changed

    def _fenced(self, name: str) -> None:
        spec, status = self.attempts[name]["spec"], self.status or {}
        if (spec["leaseEpoch"], spec["cancelEpoch"]) != (
            status.get("leaseEpoch"),
            self.spec.get("cancelEpoch", 0),
        ):
            raise Violation(f"{name} was fenced off while it was still the Run's current Attempt")

    def _commit(self, name: str) -> None:
        self._fenced(name)
        spec = self.attempts[name]["spec"]
        record = {"attempt": name, "leaseEpoch": spec["leaseEpoch"], "cancelEpoch": spec["cancelEpoch"]}
        self.status = merge(self.status or {}, {"result": {"done": True}, "committedBy": record})
        self._written("runs", RUN)

    def _save_checkpoint(self, name: str) -> str:
        """As the SDK does: a new Checkpoint after the latest, then status.latestCheckpoint (fenced)."""
        self._fenced(name)
        latest = self.checkpoints.get((self.status or {}).get("latestCheckpoint") or "")
        sequence = latest["spec"]["sequence"] + 1 if latest else 1
        checkpoint_id = f"{name}-s{sequence}"
        self.checkpoints[checkpoint_id] = {
            "metadata": {"name": checkpoint_id},
            "spec": {
                "runName": RUN,
                "id": checkpoint_id,
                "sequence": sequence,
                "attempt": name,
                "leaseEpoch": self.attempts[name]["spec"]["leaseEpoch"],
                "state": {"sequence": sequence},
            },
        }
        self.saved_checkpoints.append(checkpoint_id)
        self._written("checkpoints", checkpoint_id, self.checkpoints[checkpoint_id])
        self.status = merge(self.status or {}, {"latestCheckpoint": checkpoint_id})
        self._written("runs", RUN)
        return checkpoint_id

    def _interrupt(self, name: str, reason: str, request_id: str | None) -> None:
        checkpoint_id = self._save_checkpoint(name)
        request_id = request_id or f"{RUN}-r{self.checkpoints[checkpoint_id]['spec']['sequence']}"
        pending = {"requestId": request_id, "reason": reason, "checkpointId": checkpoint_id}
        self.status = merge(self.status or {}, {"pendingRequest": pending})
        self._end(name, 0, "")

    def _pause_asked(self) -> bool:
        pause = self.spec.get("pause")
        answered = {i["requestId"] for i in (self.status or {}).get("inputs") or []}
        return pause is not None and pause["requestId"] not in answered

    def _record_effect(self, name: str, state: str) -> None:
        effect = make_side_effect(f"ticket-{name}", state, created=self.now).to_api()
        self.side_effects[effect["metadata"]["name"]] = effect
        self._written("sideeffects", effect["metadata"]["name"], effect)

    def _end(self, name: str, code: int, message: str | None) -> None:
        terminated: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        if message is not None:
            terminated["message"] = message
        self.pods[name]["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": "agent", "state": {"terminated": terminated}}],
        }

    def act(self, script: list[UserStep] | None = None) -> bool:
        """The user takes the next step of the script if the Run is in its phase; True if they did."""
        script = self.user if script is None else script
        if not script or (self.status or {}).get("phase") != script[0][0]:
            return False
        _, action = script.pop(0)
        if action == "resolve":
            for effect in self.side_effects.values():
                if effect["status"]["state"] == "Unknown":
                    effect["status"] = {**effect["status"], "state": "Confirmed", "resolvedBy": "alice"}
                    self._written("sideeffects", effect["metadata"]["name"], effect)
        else:
            patch = action(self.status or {}) if callable(action) else action
            assert isinstance(patch, dict)
            self.spec = merge(self.spec, patch)
            self._written("runs", RUN)
        return True

    # ---- the operator

    def drive(self, crash: tuple[int, int] | None = None, max_steps: int = 80) -> list[Plan]:
        """Decide and write until the Run rests; with crash=(step, n) the operator dies after the first
        n writes of decision `step`, and a new one (whose lease clock starts afresh) takes over.

        The user acts only on a Run the operator left alone (a decision without writes). Time moves 1 s
        after any change the operator would be told about (its own writes, a Pod moving on, a user's
        request, a restart), otherwise as far as the decision asked to be woken."""
        plans = []
        for step in range(max_steps):
            plan = decide(self.world())
            plans.append(plan)
            actions = plan.actions
            restarted = False
            if crash is not None and crash[0] == step:
                actions, restarted = actions[: crash[1]], True
                self.sighting = None
            for action in actions:
                self.apply(action)
            if not restarted:
                self.check_after_decision()
            phase = (self.status or {}).get("phase")
            acted = (restarted and self.act(self.racing)) or (not plan.actions and self.act())
            # The lease check wakes the operator at the expiry too (it skips that when the worker renewed:
            # a reconcile more here changes nothing, decide being level-based).
            wakes = [t for t in (plan.requeue_after, plan.lease_expires_in) if t is not None]
            wake = min(wakes) if wakes else None
            if not acted and not plan.actions and wake is None and phase in REPORTED_PHASES:
                return plans
            changed = self.kubelet() or restarted or acted
            changed = changed or any(not isinstance(a, RecordEvent) for a in actions)
            self.clock += 1.0 if changed or wake is None else wake
        raise AssertionError(f"the Run did not come to rest: {self.status}")


@dataclass(frozen=True)
class Story:
    fates: dict[int, str]
    phase: str
    attempts: list[tuple[str, str]]  # (phase, reason) of each Attempt, in order
    lease_epochs: list[int]
    stop_reason: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    user: tuple[UserStep, ...] = ()
    controls: list[tuple[str, str, str]] = field(default_factory=list)  # (op, outcome, reason) in order
    inputs: dict[int, Any] = field(default_factory=dict)  # spec.input of the Attempts that resumed
    saves: int = 0  # Checkpoints each worker saves when it starts
    side_effects: dict[str, int] = field(default_factory=lambda: dict(NO_SIDE_EFFECTS))
    # The epoch of each Attempt, when not 1, 2, 3...: a grant after a finished Run's Lease was deleted
    # takes the epoch after the recorded one, which may skip one nobody held (never reuse one).
    attempt_epochs: list[int] | None = None
    store: bool = False  # the operator has a state store: a finished Run is compacted


STORIES = {
    "first-try": Story({1: "commit"}, "Succeeded", [("Succeeded", "initial")], [1]),
    "transient-then-success": Story(
        {1: "exit:75:upstream timeout", 2: "commit"},
        "Succeeded",
        [("Failed", "initial"), ("Succeeded", "retry:transient")],
        [1, 2],
    ),
    # The Lease is revoked at epoch 2 when Attempt 1 loses it; Attempt 2 is granted that same epoch.
    "lease-lost-then-success": Story(
        {1: "hang", 2: "commit"},
        "Succeeded",
        [("LeaseLost", "initial"), ("Succeeded", "lease_expired")],
        [1, 2],
    ),
    "lease-lost-twice": Story(
        {1: "hang", 2: "hang"},
        "Failed",
        [("LeaseLost", "initial"), ("LeaseLost", "lease_expired")],
        [1, 2, 3],
        "RepeatedFailure",
    ),
    "same-error-twice": Story(
        {1: "exit:75:timeout after 3012ms", 2: "exit:75:timeout after 2990ms"},
        "Failed",
        [("Failed", "initial"), ("Failed", "retry:transient")],
        [1, 2],
        "RepeatedFailure",
    ),
    "budget-exhausted": Story(
        {1: "exit:137", 2: "exit:75", 3: "exit:143"},
        "Failed",
        [("Failed", "initial"), ("Failed", "retry:infrastructure"), ("Failed", "retry:transient")],
        [1, 2, 3],
        "RetryBudgetExhausted",
    ),
    "deterministic": Story({1: "exit:1:KeyError"}, "Failed", [("Failed", "initial")], [1], "NotRetryable"),
    "deadline": Story(
        {1: "forever"},
        "Failed",
        [("Aborted", "initial")],
        [1, 2],
        "DeadlineExceeded",
        {"deadlineSeconds": 100},
    ),
    "cancel": Story({1: "cancel"}, "Cancelled", [("Aborted", "initial")], [1]),
    "commit-wins-over-a-late-cancel": Story(
        {1: "commit-then-cancel"}, "Succeeded", [("Succeeded", "initial")], [1]
    ),
    "ticket-then-success": Story(
        {1: "ticket"},
        "Succeeded",
        [("Succeeded", "initial")],
        [1],
        side_effects={**NO_SIDE_EFFECTS, "confirmed": 1, "irreversible": 1},
    ),
    "resume-then-success": Story(
        {1: "interrupt", 2: "commit"},
        "Succeeded",
        [("Interrupted", "initial"), ("Succeeded", f"resume:{RUN}-r1")],
        [1, 2],
        user=(("InputRequired", answer({"choice": "b"}, "answer-1")),),
        controls=[("Resume", "Accepted", "Accepted")],
        inputs={2: {"choice": "b"}},
    ),
    "resume-refused-then-accepted": Story(
        {1: "interrupt", 2: "commit"},
        "Succeeded",
        [("Interrupted", "initial"), ("Succeeded", f"resume:{RUN}-r1")],
        [1, 2],
        user=(
            ("InputRequired", answer("a", "answer-1", request_id="someone-else")),
            ("InputRequired", answer("b", "answer-2")),
        ),
        controls=[("Resume", "Rejected", "UnknownRequest"), ("Resume", "Accepted", "Accepted")],
        inputs={2: "b"},
    ),
    "pause-then-resume": Story(
        {1: "pausable", 2: "commit"},
        "Succeeded",
        [("Interrupted", "initial"), ("Succeeded", "resume:pause-1")],
        [1, 2],
        user=(
            ("Running", {"pause": {"requestId": "pause-1", "reason": "maintenance"}}),
            ("Paused", answer({"go": True}, "go-1")),
        ),
        controls=[("Pause", "Accepted", "Accepted"), ("Resume", "Accepted", "Accepted")],
        inputs={2: {"go": True}},
    ),
    "manual-retry-then-success": Story(
        {1: "exit:1:KeyError", 2: "commit"},
        "Succeeded",
        [("Failed", "initial"), ("Succeeded", "manual_retry")],
        [1, 2],
        user=(("Failed", retry_request("retry-1")),),
        controls=[("Retry", "Accepted", "Accepted")],
    ),
    "unknown-side-effect-resolved-then-retried": Story(
        {1: "unknown", 2: "commit"},
        "Succeeded",
        [("Failed", "initial"), ("Succeeded", "manual_retry")],
        [1, 2],
        user=(
            ("NeedsReconciliation", retry_request("retry-1")),
            ("NeedsReconciliation", "resolve"),
            ("NeedsReconciliation", retry_request("retry-2")),
        ),
        controls=[("Retry", "Rejected", "UnresolvedSideEffects"), ("Retry", "Accepted", "Accepted")],
        side_effects={**NO_SIDE_EFFECTS, "confirmed": 1, "irreversible": 1},
    ),
    # maxAttempts 2 counts the Attempts since the resume: Attempt 3 is the first of a new series.
    "a-resume-renews-the-retry-budget": Story(
        {1: "exit:75:upstream reset", 2: "interrupt", 3: "exit:75:disk full", 4: "exit:75:dns failure"},
        "Failed",
        [
            ("Failed", "initial"),
            ("Interrupted", "retry:transient"),
            ("Failed", f"resume:{RUN}-r1"),
            ("Failed", "retry:transient"),
        ],
        [1, 2, 3, 4],
        "RetryBudgetExhausted",
        {"retry": {"maxAttempts": 2}},
        user=(("InputRequired", answer("yes", "answer-1")),),
        controls=[("Resume", "Accepted", "Accepted")],
        # Attempt 3 failed before saving a Checkpoint after the answer: its retry carries the answer on.
        inputs={3: "yes", 4: "yes"},
    ),
    # Lease loss is not retried here: the Run fails with the Lease revoked at epoch 2; the failed Run's
    # Lease is deleted, and the manual retry's Attempt 2 is granted the epoch after the recorded one.
    "lease-lost-then-manual-retry": Story(
        {1: "hang", 2: "commit"},
        "Succeeded",
        [("LeaseLost", "initial"), ("Succeeded", "manual_retry")],
        [1, 2, 3],
        spec={"retry": {"retryOn": ["transient"]}},
        user=(("Failed", retry_request("retry-1")),),
        controls=[("Retry", "Accepted", "Accepted")],
        attempt_epochs=[1, 3],
    ),
    # With a state store a finished Run is compacted: its index written, its Lease and its superseded
    # Checkpoints deleted (the latest kept).
    "compacted-after-success": Story(
        {1: "commit"}, "Succeeded", [("Succeeded", "initial")], [1], saves=3, store=True
    ),
    # Compacted when it failed, retried by hand: the grant with no Lease takes leaseEpoch + 1, continues
    # from the kept latest Checkpoint, and the second compaction's index still names the first's.
    "compacted-then-manual-retry": Story(
        {1: "exit:1:KeyError", 2: "commit"},
        "Succeeded",
        [("Failed", "initial"), ("Succeeded", "manual_retry")],
        [1, 2],
        user=(("Failed", retry_request("retry-1")),),
        controls=[("Retry", "Accepted", "Accepted")],
        saves=2,
        store=True,
    ),
    "compacted-cancelled": Story(
        {1: "cancel"}, "Cancelled", [("Aborted", "initial")], [1], saves=2, store=True
    ),
    "checkpoints-pruned-beyond-retention": Story(
        {1: "interrupt", 2: "interrupt", 3: "commit"},
        "Succeeded",
        [("Interrupted", "initial"), ("Interrupted", f"resume:{RUN}-r4"), ("Succeeded", f"resume:{RUN}-r8")],
        [1, 2, 3],
        spec={"checkpointRetention": 1},
        user=(("InputRequired", answer(1, "answer-1")), ("InputRequired", answer(2, "answer-2"))),
        controls=[("Resume", "Accepted", "Accepted"), ("Resume", "Accepted", "Accepted")],
        inputs={2: 1, 3: 2},
        saves=3,
    ),
}


def check_story(story: Story, crash: tuple[int, int] | None) -> None:
    cluster = Cluster(
        spec=copy.deepcopy(story.spec),
        fates=story.fates,
        user=list(story.user),
        saves=story.saves,
        store=story.store,
    )
    cluster.drive(crash)
    status = cluster.status or {}
    attempts = sorted(cluster.attempts.values(), key=lambda a: a["spec"]["number"])

    assert status["phase"] == story.phase
    assert (status.get("failure") or {}).get("reason") == story.stop_reason
    assert [(a["status"]["phase"], a["spec"]["reason"]) for a in attempts] == story.attempts
    assert {a["spec"]["number"]: a["spec"]["input"] for a in attempts if "input" in a["spec"]} == story.inputs
    epochs = [a["spec"]["leaseEpoch"] for a in attempts]
    assert epochs == (story.attempt_epochs or list(range(1, len(attempts) + 1)))
    assert cluster.lease_epochs == story.lease_epochs
    assert status["leaseEpoch"] == story.lease_epochs[-1]
    assert status["currentAttempt"] == status["attempts"] == len(attempts)
    assert sorted(cluster.pods_created) == [a["metadata"]["name"] for a in attempts]  # one Pod per Attempt
    assert all(p["status"]["phase"] in ("Succeeded", "Failed") for p in cluster.pods.values()), "a Pod left"
    assert [(c["op"], c["outcome"], c["reason"]) for c in status.get("controls") or []] == story.controls
    assert status["sideEffects"] == story.side_effects
    assert len(status["report"]["effects"]) == len(cluster.side_effects)
    if story.phase == "Succeeded":
        assert status["committedBy"]["attempt"] == attempts[-1]["metadata"]["name"]
    retention = story.spec.get("checkpointRetention", 20)
    assert cluster.protected_checkpoints() <= set(cluster.checkpoints)
    assert len(set(cluster.checkpoints) - cluster.protected_checkpoints()) <= retention
    if story.saves:
        assert cluster.checkpoints_pruned, "the story saves more Checkpoints than it keeps"
    # A finished Run holds no Lease; without a store it keeps every Checkpoint retention keeps, with one
    # its index names every Checkpoint ever saved and only those pointed at are left in the API server.
    assert cluster.lease is None
    # spec.podGC OnAttemptEnd (the default): every Pod of an ended Attempt was deleted, after its log tail
    # was kept (the superseded Pods a grant deletes at once excepted: they are not waited for).
    assert not cluster.pods, f"Pods left: {sorted(cluster.pods)}"
    if attempts[-1]["status"]["phase"] in ("Succeeded", "Failed"):  # it stopped by itself: its log is kept
        assert "logTail" in attempts[-1]["status"]
    if story.store:
        assert cluster.indexed >= set(cluster.saved_checkpoints)
        assert set(cluster.checkpoints) == cluster.protected_checkpoints()  # the latest, those resumed from
        assert "checkpointIndex" in status
    else:
        assert "checkpointIndex" not in status
    # A Run at rest, compacted, carries no managedFields, nor do its objects: clearing them came last.
    if compaction.settled(cluster.world()):
        assert not cluster.managed, f"managedFields left: {sorted(cluster.managed)}"


@pytest.mark.parametrize("story", STORIES.values(), ids=STORIES.keys())
def test_story(story: Story) -> None:
    check_story(story, crash=None)


def crash_points() -> dict[str, tuple[Story, tuple[int, int]]]:
    """Every place an operator can die in every story: after n writes of decision `step` (n < all)."""
    points = {}
    for name, story in STORIES.items():
        cluster = Cluster(
            spec=copy.deepcopy(story.spec),
            fates=story.fates,
            user=list(story.user),
            saves=story.saves,
            store=story.store,
        )
        for step, plan in enumerate(cluster.drive()):
            for n in range(len(plan.actions)):
                if n and isinstance(plan.actions[n - 1], RecordEvent):
                    continue  # an Event changes nothing: same as dying before it
                done = "+".join(type(a).__name__ for a in plan.actions[:n] if not isinstance(a, RecordEvent))
                points[f"{name}-decision{step}-after-{done or 'nothing'}"] = (story, (step, n))
    return points


CRASH_POINTS = crash_points()


@pytest.mark.parametrize(("story", "crash"), CRASH_POINTS.values(), ids=CRASH_POINTS.keys())
def test_operator_killed_between_writes(story: Story, crash: tuple[int, int]) -> None:
    check_story(story, crash)


def test_a_second_answer_written_while_the_operator_restarts_takes_nothing_away() -> None:
    """The operator accepts an answer and dies before creating the Attempt its grant promised; a second
    answer replaces spec.resume before its successor looks (the first one's key is spent, so the API
    server allows it). The promised Attempt still starts with the answer that was accepted, and the
    second one is refused: nothing it says reaches the agent."""
    story = STORIES["resume-then-success"]
    plans = Cluster(spec=copy.deepcopy(story.spec), fates=story.fates, user=list(story.user)).drive()
    step, n = next(
        (s, i)
        for s, plan in enumerate(plans)
        for i, action in enumerate(plan.actions)
        if isinstance(action, CreateAttempt) and action.body["spec"]["reason"].startswith("resume:")
    )
    second = {
        "resume": {
            "requestId": f"{RUN}-r1",
            "checkpointId": f"{name_of(1)}-s1",
            "value": {"choice": "z"},
            "idempotencyKey": "answer-2",
        }
    }
    cluster = Cluster(
        spec=copy.deepcopy(story.spec), fates=story.fates, user=list(story.user), racing=[("Running", second)]
    )
    cluster.drive(crash=(step, n))

    attempts = sorted(cluster.attempts.values(), key=lambda a: a["spec"]["number"])
    assert not cluster.racing, "the second answer was written while the promised Attempt was missing"
    assert cluster.spec["resume"]["idempotencyKey"] == "answer-2"
    assert [a["spec"].get("input") for a in attempts] == [None, {"choice": "b"}]
    assert cluster.status is not None and cluster.status["phase"] == "Succeeded"
    controls = [(c["idempotencyKey"], c["outcome"]) for c in cluster.status["controls"]]
    assert controls == [("answer-1", "Accepted"), ("answer-2", "Rejected")]
