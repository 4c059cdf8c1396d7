"""Version skew between the operator and agent images (docs/state-store.md, "Version skew"): an SDK that
predates the state store is never given a Run whose state may be there. Such a Run's Attempts are
started with spec.stateInStore, their Pods get their namespace as AGENTRUN_NAMESPACE_WITH_REFS only (an
old SDK stops at once without AGENTRUN_NAMESPACE), and an Attempt whose SDK did not state that it reads
references (status.sdkReads) ends the Run in NeedsReconciliation, AgentSDKTooOld, never retried."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun.api import AGENT_SDK_TOO_OLD, Attempt, Checkpoint, FailureClass, SideEffect
from agentrun.core.fork import ForkSourceView
from agentrun.core.plan import CreateAttempt, CreatePod, PatchAttemptStatus
from agentrun.core.pods import NAMESPACE_ENV, NAMESPACE_WITH_REFS_ENV, attempt_pod
from agentrun.core.runs import World, decide
from agentrun.core.runs.grants import state_in_store
from agentrun.worker.identity import Identity, NotInAttemptPod
from unit.factories import (
    POD_ENV,
    failed_attempt,
    make_attempt,
    make_checkpoint,
    make_run,
    make_side_effect,
    of_type,
    run_patch,
)
from unit.run_worlds import backing_off, ended, sdk, supervising

REF = {"key": "runs/team/uid/sha256/" + "a" * 64, "sha256": "a" * 64, "size": 20000}
NOT_AN_SDK = "Traceback (most recent call last): ... NotInAttemptPod: AGENTRUN_NAMESPACE not set"


def stated(attempt: Attempt) -> Attempt:
    """The Attempt after its SDK stated that it reads references."""
    status = attempt.status.model_copy(update={"sdk_reads": ["BlobRefs"]})
    return attempt.model_copy(update={"status": status})


def in_store(attempt: Attempt) -> Attempt:
    return attempt.model_copy(update={"spec": attempt.spec.model_copy(update={"state_in_store": True})})


def stored_checkpoint(checkpoint_id: str, sequence: int) -> Checkpoint:
    body = make_checkpoint(checkpoint_id, sequence).to_api()
    body["spec"].pop("state")
    body["spec"]["stateRef"] = REF
    return Checkpoint.model_validate(body)


def stored_result(record: SideEffect) -> SideEffect:
    body = record.to_api()
    body["status"].pop("result", None)
    body["status"]["resultRef"] = REF
    return SideEffect.model_validate(body)


def env_names(pod: dict[str, Any]) -> set[str]:
    return {e["name"] for e in pod["spec"]["containers"][0]["env"]}


def granted(world: World) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Attempt and Pod a backing-off Run's next grant creates."""
    plan = decide(world)
    (attempt,) = of_type(plan, CreateAttempt)
    (pod,) = of_type(plan, CreatePod)
    return attempt.body, pod.body


# ---- when the Run's state may be in the store --------------------------------------------------------------


def test_an_inline_run_is_started_as_before() -> None:
    attempt, pod = granted(backing_off())
    assert "stateInStore" not in attempt["spec"]
    assert NAMESPACE_ENV in env_names(pod) and NAMESPACE_WITH_REFS_ENV not in env_names(pod)


@pytest.mark.parametrize(
    "evidence",
    ["checkpoint stateRef", "side-effect resultRef", "an earlier Attempt stated it", "an earlier Attempt so"],
)
def test_a_run_holding_references_is_started_for_an_sdk_that_reads_them(evidence: str) -> None:
    world = backing_off()
    if evidence == "checkpoint stateRef":
        world = replace(world, checkpoints=(stored_checkpoint("ckpt-3", 3),))
    elif evidence == "side-effect resultRef":
        world = replace(world, side_effects=(stored_result(make_side_effect("k1", "Confirmed")),))
    elif evidence == "an earlier Attempt stated it":
        world = replace(world, attempts={1: stated(failed_attempt(1, FailureClass.TRANSIENT))})
    else:
        world = replace(world, attempts={1: in_store(failed_attempt(1, FailureClass.TRANSIENT))})
    assert state_in_store(world)
    attempt, pod = granted(world)
    assert attempt["spec"]["stateInStore"] is True
    names = env_names(pod)
    assert NAMESPACE_WITH_REFS_ENV in names and NAMESPACE_ENV not in names


def test_a_fork_of_a_source_in_the_store_is_started_for_an_sdk_that_reads_references() -> None:
    source_run = make_run({"phase": "Succeeded"})
    source = ForkSourceView(run=source_run, checkpoint=stored_checkpoint("ckpt-2", 2))
    fork = make_run({}, spec={"forkFrom": {"run": "source", "checkpointId": "ckpt-2"}})
    world = World(run=fork, attempts={}, pods={}, lease=None, now=backing_off().now, fork_source=source)
    assert state_in_store(world)
    inline_source = ForkSourceView(run=source_run, checkpoint=make_checkpoint("ckpt-2", 2))
    inline = replace(world, fork_source=inline_source)
    assert not state_in_store(inline)


def test_the_agents_own_env_cannot_bring_agentrun_namespace_back() -> None:
    world = replace(backing_off(), checkpoints=(stored_checkpoint("ckpt-3", 3),))
    agent = {"image": "agent:old", "env": [{"name": NAMESPACE_ENV, "value": "team"}]}
    run = make_run({}, spec={"agent": agent})
    attempt = Attempt.model_validate(granted(world)[0])
    pod = attempt_pod(run, attempt)
    assert NAMESPACE_ENV not in env_names(pod)


# ---- the SDK's side of it ----------------------------------------------------------------------------------


def test_the_sdk_takes_its_namespace_from_either_name() -> None:
    plain = Identity.from_env(POD_ENV)
    assert (plain.namespace, plain.state_in_store) == ("team", False)
    env = {k: v for k, v in POD_ENV.items() if k != NAMESPACE_ENV} | {NAMESPACE_WITH_REFS_ENV: "team"}
    with_refs = Identity.from_env(env)
    assert (with_refs.namespace, with_refs.state_in_store) == ("team", True)
    with pytest.raises(NotInAttemptPod, match="AGENTRUN_NAMESPACE not set"):
        Identity.from_env({k: v for k, v in POD_ENV.items() if k != NAMESPACE_ENV})


# ---- the verdict on an Attempt whose SDK did not state it --------------------------------------------------


def test_an_sdk_that_never_stated_it_reads_references_stops_the_run_for_a_person() -> None:
    world = supervising(attempt=in_store(make_attempt(1)), pod=ended(1, 1, NOT_AN_SDK))
    plan = decide(world)
    patch = run_patch(plan)
    assert patch["phase"] == "NeedsReconciliation"
    assert patch["failure"]["reason"] == AGENT_SDK_TOO_OLD
    assert "spec.agent" in patch["message"] and "NotInAttemptPod" in patch["message"]
    (attempt_end,) = [a.patch for a in of_type(plan, PatchAttemptStatus)]
    assert attempt_end["failure"]["reason"] == AGENT_SDK_TOO_OLD
    assert attempt_end["phase"] == "Failed"
    assert patch.get("nextAttemptTime") is None


@pytest.mark.parametrize(
    ("why", "attempt", "pod"),
    [
        ("its SDK stated it", stated(in_store(make_attempt(1))), ended(1, 1, NOT_AN_SDK)),
        ("an SDK reported the failure", in_store(make_attempt(1)), ended(1, 1, sdk("deterministic", "bug"))),
        ("it was killed", in_store(make_attempt(1)), ended(1, 137)),
        ("the Run is not in the store", make_attempt(1), ended(1, 1, NOT_AN_SDK)),
    ],
)
def test_other_failures_take_their_usual_course(why: str, attempt: Attempt, pod: Any) -> None:
    spec = {"retry": {"maxAttempts": 3, "retryOn": ["deterministic", "infrastructure", "transient"]}}
    patch = run_patch(decide(supervising(attempt=attempt, pod=pod, spec=spec)))
    assert patch["phase"] == "RetryBackoff", why
