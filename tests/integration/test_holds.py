"""The promises of issue 15 on the real API server: the hold window (an answer continues the same
Attempt), keys that stay spent, cancel recorded, pause at every step boundary, re-observation."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from devcluster.operator import OperatorProcess
from support.kube import Kube, wait_for
from support.runs import (
    FAST_RETRY,
    PRIORITY,
    attempts,
    controls,
    create_run,
    get_run,
    patch_spec,
    resume,
    scenario_run,
    support_agent_run,
    wait_phase,
)

pytestmark = pytest.mark.cluster


def held(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    """The Run once it waits while its Attempt holds the request."""
    run = get_run(kube, ns, name)
    status = run.get("status", {})
    holding = status.get("phase") == "InputRequired" and (status.get("pendingRequest") or {}).get("heldBy")
    return run if holding else None


def released(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    """The Run once it waits and its request is no longer held (the hold ended before it was seen)."""
    run = get_run(kube, ns, name)
    status = run.get("status", {})
    free = status.get("phase") == "InputRequired" and "heldBy" not in (status.get("pendingRequest") or {})
    return run if free else None


def asking(name: str, hold: int, **ask: Any) -> dict[str, Any]:
    question = {"atStep": 2, "prompt": "Priority?", "schema": PRIORITY, "holdSeconds": hold, **ask}
    return scenario_run(name, {"steps": 2, "ask": question})


# ---- 1. the hold window ------------------------------------------------------------------------------


def test_an_answer_within_the_hold_continues_the_same_attempt(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, asking("hold", 600))
    waiting = wait_for(lambda: held(kube, ns, "hold"), timeout=120, what="the request held")
    assert waiting["status"]["pendingRequest"]["heldBy"] == "hold-a1"
    assert waiting["status"]["pendingRequest"]["holdSeconds"] == 600
    assert (attempts(kube, ns, "hold")[0].get("status") or {}).get("phase") == "Running", "its Pod lives on"

    resume(kube, ns, "hold", waiting["status"]["pendingRequest"], {"priority": "high"}, key="quick")
    done = wait_phase(kube, ns, "hold", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    result = done["status"]["result"]
    assert (result["attempt"], result["answer"], result["resumed"]) == ("hold-a1", {"priority": "high"}, True)
    assert result["resumeReason"] == f"resume:{waiting['status']['pendingRequest']['requestId']}"
    assert len(attempts(kube, ns, "hold")) == 1, "no new Pod for an answer within the hold"
    record = controls(kube, ns, "hold")["quick"]
    assert (record["outcome"], record["reason"]) == ("Accepted", "AcceptedInHold")


def test_after_the_hold_is_released_an_answer_starts_a_new_attempt(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, asking("late", 1))

    def released() -> dict[str, Any] | None:
        run = get_run(kube, ns, "late")
        history = attempts(kube, ns, "late")
        first = (history[0].get("status") or {}) if history else {}
        pending = run.get("status", {}).get("pendingRequest") or {}
        return run if first.get("phase") == "Interrupted" and pending and "heldBy" not in pending else None

    waiting = wait_for(released, timeout=120, what="the hold released and its Attempt ended")
    resume(kube, ns, "late", waiting["status"]["pendingRequest"], {"priority": "low"}, key="slow")
    done = wait_phase(kube, ns, "late", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    result = done["status"]["result"]
    assert (result["attempt"], result["answer"]) == ("late-a2", {"priority": "low"})
    assert [a["spec"]["reason"] for a in attempts(kube, ns, "late")][1].startswith("resume:")


def test_answers_racing_the_end_of_the_hold_continue_exactly_once(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    """Answers sent from before to after the end of a 1-second hold: whichever write lands first (the
    operator's acceptance or the worker's release), the answer is applied exactly once."""
    ns = run_namespace
    offsets = [0.1 * n for n in range(14)]  # seconds after the Run is seen waiting: around the hold's end
    names = [f"race-{n}" for n in range(len(offsets))]
    for name in names:
        create_run(kube, ns, asking(name, 1))
    errors: list[BaseException] = []

    def answer_at(name: str, offset: float) -> None:
        try:
            waiting = wait_for(
                lambda: held(kube, ns, name) or released(kube, ns, name),
                timeout=120,
                interval=0.05,
                what=f"{name} waiting",
            )
            # The stimulus, not a synchronisation: the answer is timed around the end of the hold, and
            # the assertions below hold whichever way the race goes.
            threading.Event().wait(offset)
            resume(
                kube,
                ns,
                name,
                waiting["status"]["pendingRequest"],
                {"priority": "high"},
                key=f"{name}-answer",
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=answer_at, args=pair) for pair in zip(names, offsets, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    ways: list[str] = []
    for name in names:
        done = wait_phase(kube, ns, name, {"Succeeded", "Failed"}, timeout=120)
        assert done["status"]["phase"] == "Succeeded", (name, done["status"], operator.log_tail())
        status, history = done["status"], attempts(kube, ns, name)
        assert status["result"]["answer"] == {"priority": "high"}, "never an answer lost"
        assert [i["idempotencyKey"] for i in status["inputs"]] == [f"{name}-answer"], "applied once"
        record = controls(kube, ns, name)[f"{name}-answer"]
        assert record["outcome"] == "Accepted", record
        if record["reason"] == "AcceptedInHold":
            assert [a["metadata"]["name"] for a in history] == [f"{name}-a1"], "continued in its hold"
            assert status["result"]["attempt"] == f"{name}-a1"
            ways.append("continued")
        else:
            request = status["inputs"][0]["requestId"]
            assert [a["spec"]["reason"] for a in history][1:] == [f"resume:{request}"]
            assert history[0]["status"]["phase"] == "Interrupted", "released before the new Attempt"
            assert status["result"]["attempt"] == f"{name}-a2"
            ways.append("new attempt")
    print("race outcomes:", ways)


# ---- 2. keys stay spent ------------------------------------------------------------------------------


def test_a_spent_key_is_never_processed_again_whatever_came_between(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("keys", {"steps": 2, "ask": {"atStep": 2, "schema": PRIORITY}}))
    waiting = wait_phase(kube, ns, "keys", {"InputRequired", "Failed"})
    resume(kube, ns, "keys", waiting["status"]["pendingRequest"], {"priority": "urgent"}, key="k1")
    wait_for(lambda: "k1" in controls(kube, ns, "keys"), what="k1 judged")
    assert controls(kube, ns, "keys")["k1"]["reason"] == "SchemaMismatch"
    resume(kube, ns, "keys", waiting["status"]["pendingRequest"], {"priority": "high"}, key="k2")
    done = wait_phase(kube, ns, "keys", {"Succeeded", "Failed"})
    assert done["status"]["result"]["answer"] == {"priority": "high"}
    operator.restart()  # the memory is in status: it survives the operator

    # the API server lets a reused key by; the operator refuses it
    resume(kube, ns, "keys", waiting["status"]["pendingRequest"], {"priority": "low"}, key="k1")
    wait_for(
        lambda: controls(kube, ns, "keys")["k1"]["reason"] == "IdempotencyKeyReused",
        what="k1's reuse recorded",
    )
    run = get_run(kube, ns, "keys")
    assert run["status"]["controls"][-1]["outcome"] == "Rejected"
    assert {k["key"]: k["op"] for k in run["status"]["spentKeys"]} == {"k1": "Resume", "k2": "Resume"}
    assert len(attempts(kube, ns, "keys")) == 2, "nothing processed again"
    assert run["status"]["result"]["answer"] == {"priority": "high"}


# ---- 3. cancel recorded ------------------------------------------------------------------------------


def test_a_cancel_request_is_recorded_once_and_its_key_cannot_change_meaning(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    create_run(kube, ns, scenario_run("stop", {"steps": 1, "fail": {"how": "hang"}}))
    wait_phase(kube, ns, "stop", {"Running"})
    request = {"idempotencyKey": "stop-1", "reason": "wrong customer"}
    patch_spec(kube, ns, "stop", {"cancelEpoch": 1, "cancelRequest": request})
    wait_phase(kube, ns, "stop", {"Cancelled"})
    wait_for(lambda: "stop-1" in controls(kube, ns, "stop"), what="the cancel recorded")
    record = controls(kube, ns, "stop")["stop-1"]
    assert (record["op"], record["outcome"]) == ("Cancel", "Accepted")
    assert "wrong customer" in record["message"]

    patch_spec(kube, ns, "stop", {"cancelRequest": request})  # the same request again: harmless
    with pytest.raises(ApiException) as refused:  # the same key with another reason: the API server
        patch_spec(kube, ns, "stop", {"cancelRequest": {**request, "reason": "changed my mind"}})
    assert refused.value.status == 422
    patch_spec(kube, ns, "stop", {"cancelRequest": None})  # around the rule: the operator refuses it
    patch_spec(kube, ns, "stop", {"cancelRequest": {**request, "reason": "changed my mind"}})
    wait_for(
        lambda: controls(kube, ns, "stop")["stop-1"]["reason"] == "IdempotencyKeyReused",
        what="the reuse recorded",
    )
    run = get_run(kube, ns, "stop")
    assert [k["key"] for k in run["status"]["spentKeys"]] == ["stop-1"]
    assert run["status"]["phase"] == "Cancelled"


# ---- 4. pause at every step boundary -----------------------------------------------------------------


def test_a_pause_answered_with_nothing_never_answers_the_next_question(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    gate = tmp_path / "go"
    create_run(kube, ns, support_agent_run("pa", "controls_agent", {"mode": "ask", "gate": str(gate)}))
    wait_for(lambda: get_run(kube, ns, "pa").get("status", {}).get("latestCheckpoint"), timeout=120)
    patch_spec(kube, ns, "pa", {"pause": {"requestId": "pause-1", "reason": "maintenance"}})
    wait_for(lambda: (get_run(kube, ns, "pa").get("spec") or {}).get("pause"), what="the pause stored")
    gate.touch()  # the agent goes on to its question: the pause comes first, at that boundary
    paused = wait_phase(kube, ns, "pa", {"Paused", "Failed", "InputRequired"})
    assert paused["status"]["phase"] == "Paused", paused["status"]
    resume(kube, ns, "pa", paused["status"]["pendingRequest"], {}, key="carry-on")
    asked = wait_phase(kube, ns, "pa", {"InputRequired", "Failed", "Succeeded"})
    assert asked["status"]["phase"] == "InputRequired", (asked["status"], operator.log_tail())
    assert asked["status"]["pendingRequest"]["acceptedSchema"] == PRIORITY
    resume(kube, ns, "pa", asked["status"]["pendingRequest"], {"priority": "low"}, key="the-answer")
    done = wait_phase(kube, ns, "pa", {"Succeeded", "Failed"})
    assert done["status"]["result"]["answer"] == {"priority": "low"}, operator.log_tail()


def test_a_pause_during_a_side_effect_loop_stops_before_a_send(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    sent, gate = tmp_path / "sent", tmp_path / "go"
    sent.mkdir()
    spec = {"mode": "loop", "count": 10, "dir": str(sent), "gate": str(gate), "gateAfter": 2}
    create_run(kube, ns, support_agent_run("loop", "controls_agent", spec))
    wait_for(lambda: len(list(sent.iterdir())) == 2, timeout=120, what="the loop at its gate, 2 sent")
    patch_spec(kube, ns, "loop", {"pause": {"requestId": "pause-loop", "reason": "stop sending"}})
    gate.write_text("go")  # the next side effect's boundary reads the Run: it finds the pause
    paused = wait_phase(kube, ns, "loop", {"Paused", "Succeeded", "Failed"})
    assert paused["status"]["phase"] == "Paused", paused["status"]
    states = [e.get("status", {}).get("state") for e in side_effects(kube, ns, "loop")]
    assert states == ["Confirmed", "Confirmed"], "paused before the third send, never inside one"
    resume(kube, ns, "loop", paused["status"]["pendingRequest"], {}, key="go-on")
    done = wait_phase(kube, ns, "loop", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    assert sorted(p.name for p in sent.iterdir()) == sorted(f"{n:03d}" for n in range(10)), "each sent once"


def test_a_pause_then_the_approval_gate_keep_their_requests_apart(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    gate = tmp_path / "go"
    sent = tmp_path / "sent"
    sent.mkdir()
    spec = {"mode": "approve", "gate": str(gate), "dir": str(sent)}
    create_run(kube, ns, support_agent_run("gate", "controls_agent", spec))
    wait_for(lambda: get_run(kube, ns, "gate").get("status", {}).get("latestCheckpoint"), timeout=120)
    patch_spec(kube, ns, "gate", {"pause": {"requestId": "pause-gate"}})
    wait_for(lambda: (get_run(kube, ns, "gate").get("spec") or {}).get("pause"), what="the pause stored")
    gate.touch()
    paused = wait_phase(kube, ns, "gate", {"Paused", "AuthRequired", "Failed"})
    assert paused["status"]["phase"] == "Paused", paused["status"]
    resume(kube, ns, "gate", paused["status"]["pendingRequest"], {}, key="resume-gate")
    approval = wait_phase(kube, ns, "gate", {"AuthRequired", "Failed", "Succeeded"})
    assert approval["status"]["phase"] == "AuthRequired", (approval["status"], operator.log_tail())
    assert approval["status"]["pendingRequest"]["requestId"].startswith("approve-")
    assert not list(sent.iterdir()), "nothing sent before the approval"
    resume(kube, ns, "gate", approval["status"]["pendingRequest"], {"approved": True}, key="yes")
    done = wait_phase(kube, ns, "gate", {"Succeeded", "Failed"})
    assert done["status"]["phase"] == "Succeeded", operator.log_tail()
    assert [p.name for p in sent.iterdir()] == ["000"]


# ---- 5. re-observe -----------------------------------------------------------------------------------


def test_after_a_pause_the_agent_acts_on_what_it_observes_now(
    kube: Kube, run_namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    ns = run_namespace
    world = tmp_path / "world"
    world.write_text("before")
    gate = tmp_path / "go"
    spec = {"mode": "observe", "world": str(world), "gate": str(gate)}
    create_run(kube, ns, support_agent_run("look", "controls_agent", spec))
    wait_for(lambda: get_run(kube, ns, "look").get("status", {}).get("latestCheckpoint"), timeout=120)
    patch_spec(kube, ns, "look", {"pause": {"requestId": "pause-look"}})
    gate.touch()
    paused = wait_phase(kube, ns, "look", {"Paused", "Succeeded", "Failed"})
    assert paused["status"]["phase"] == "Paused", paused["status"]
    world.write_text("after")  # the world changed while the Run was paused
    resume(kube, ns, "look", paused["status"]["pendingRequest"], {}, key="look-again")
    done = wait_phase(kube, ns, "look", {"Succeeded", "Failed"})
    result = done["status"]["result"]
    assert (result["actedOn"], result["resumed"]) == ("after", True), operator.log_tail()
    assert result["resumeReason"] == "resume:pause-look"


def test_a_crash_retry_continues_resumed_with_its_reason(
    kube: Kube, run_namespace: str, operator: OperatorProcess
) -> None:
    ns = run_namespace
    spec = {"steps": 3, "fail": {"attempts": [1], "atStep": 2, "how": "transient"}}
    create_run(kube, ns, scenario_run("again", spec, retry=FAST_RETRY))
    done = wait_phase(kube, ns, "again", {"Succeeded", "Failed"}, timeout=120)
    result = done["status"]["result"]
    assert (result["attempt"], result["resumed"]) == ("again-a2", True)
    assert result["resumeReason"] == "retry:transient"


def side_effects(kube: Kube, ns: str, run: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.custom.list_namespaced_custom_object(
        "agentrun.dev", "v1alpha1", ns, "sideeffects", label_selector=f"agentrun.dev/run={run}"
    )["items"]
    return items
