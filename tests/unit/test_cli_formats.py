"""kubectl agentrun without a cluster: argument parsing, default keys, local checks and the text it prints."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from agentrun.api import Attempt, Checkpoint, ControlRecord, Run, SideEffect, SideEffectState
from agentrun.api.common import IDENTIFIER_PATTERN
from agentrun.cli import controls, formats, timeline
from agentrun.cli.app import parse
from agentrun.cli.commands import cancel, effects, resume, watch
from agentrun.cli.errors import CliError, api_error_from, describe_api_error
from agentrun.cli.hints import Target
from agentrun.kubeapi import ApiError
from support.blocking_api import to_api_error

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
UID = "0b6c1f2e-8d3a-4c55-9e21-5f0a7b9c1d2e"
PRIORITY = {
    "type": "object",
    "properties": {"priority": {"enum": ["low", "high"]}},
    "required": ["priority"],
}


def ts(seconds: int) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_run(status: dict[str, Any] | None = None, **spec: Any) -> Run:
    return Run.model_validate(
        {
            "metadata": {"name": "ask", "namespace": "team-a", "uid": UID, "creationTimestamp": ts(0)},
            "spec": {"agent": {"image": "agentrun/agent:dev"}, **spec},
            "status": status or {},
        }
    )


WAITING: dict[str, Any] = {
    "phase": "InputRequired",
    "message": "waiting for request ask-r1 (input_required)",
    "attempts": 1,
    "currentAttempt": 1,
    "leaseEpoch": 1,
    "latestCheckpoint": "ask-a1-s1",
    "pendingRequest": {
        "requestId": "ask-r1",
        "reason": "input_required",
        "checkpointId": "ask-a1-s1",
        "prompt": "Which priority?",
        "acceptedSchema": PRIORITY,
    },
}


def control(key: str, outcome: str, reason: str, message: str, at: int) -> dict[str, Any]:
    return {
        "idempotencyKey": key,
        "op": "Resume",
        "digest": "sha256:" + "0" * 64,
        "outcome": outcome,
        "reason": reason,
        "message": message,
        "time": ts(at),
    }


FINISHED = {
    "phase": "Succeeded",
    "message": "ask-a2 committed the result",
    "attempts": 2,
    "currentAttempt": 2,
    "leaseEpoch": 2,
    "observedCancelEpoch": 0,
    "latestCheckpoint": "ask-a2-s2",
    "result": {"answer": {"priority": "high"}},
    "committedBy": {"attempt": "ask-a2", "leaseEpoch": 2, "cancelEpoch": 0},
    "controls": [
        control("k2", "Rejected", "SchemaMismatch", "value at priority: 'urgent' is not one of", 4),
        control("k3", "Accepted", "Accepted", "answer to ask-r1 accepted", 5),
    ],
    "inputs": [
        {
            "requestId": "ask-r1",
            "checkpointId": "ask-a1-s1",
            "digest": "sha256:" + "ab" * 32,
            "idempotencyKey": "k3",
            "time": ts(5),
        }
    ],
    "conditions": [
        {"type": "Succeeded", "status": "True", "reason": "Succeeded", "lastTransitionTime": ts(7)},
    ],
    "sideEffects": {"confirmed": 1, "compensated": 0, "unknown": 0, "irreversible": 1},
    "report": {
        "effects": [
            {
                "name": "sfx-1",
                "tool": "create_ticket",
                "state": "Confirmed",
                "externalReference": "T-1",
                "reversible": False,
            }
        ],
        "omitted": 0,
    },
}


def attempt(number: int, reason: str, phase: str, start: int, end: int, **status: Any) -> Attempt:
    return Attempt.model_validate(
        {
            "metadata": {"name": f"ask-a{number}", "creationTimestamp": ts(start)},
            "spec": {
                "runName": "ask",
                "number": number,
                "leaseEpoch": number,
                "cancelEpoch": 0,
                "reason": reason,
            },
            "status": {"phase": phase, "startTime": ts(start), "completionTime": ts(end), **status},
        }
    )


def checkpoint(sequence: int, attempt_number: int, at: int) -> Checkpoint:
    return Checkpoint.model_validate(
        {
            "metadata": {"name": f"ask-a{attempt_number}-s{sequence}", "creationTimestamp": ts(at)},
            "spec": {
                "runName": "ask",
                "id": f"ask-a{attempt_number}-s{sequence}",
                "sequence": sequence,
                "attempt": f"ask-a{attempt_number}",
                "leaseEpoch": attempt_number,
                "step": f"step-{sequence}",
            },
        }
    )


def test_a_journaled_step_reads_as_such_in_the_timeline() -> None:
    entry = checkpoint(0, 1, 2).model_dump(by_alias=True, exclude_none=True, mode="json")
    entry["metadata"]["name"] = entry["spec"]["id"] = "ask-j0123"
    entry["spec"] |= {"kind": "Journal", "step": "plan", "parent": "ask-a1-s1"}
    story = timeline.entries(make_run(FINISHED), [], [Checkpoint.model_validate(entry)], [])
    assert [(e.what, e.detail) for e in story if e.rank == 2] == [("journal plan", "ask-j0123 by ask-a1")]


STORED = {"key": f"team-a/{UID}/sha256/" + "ab" * 32, "sha256": "ab" * 32, "size": 41213}


def test_values_in_the_state_store_read_as_where_they_are() -> None:
    status = {k: v for k, v in FINISHED.items() if k != "result"} | {"resultRef": STORED}
    entry = checkpoint(0, 1, 2).model_dump(by_alias=True, exclude_none=True, mode="json")
    entry["spec"] |= {"stateRef": STORED}
    entry["spec"].pop("state", None)
    run = make_run(status)
    where = f"in the state store at {STORED['key']} (41213 bytes, sha256 abababababab...)"
    text = timeline.describe(run, [], [Checkpoint.model_validate(entry)], [], T0)
    assert f"Result:        {where} (committed by ask-a2)" in text
    assert f"state {where}" in text
    assert f"Result: {where}" in formats.report_text(run, [], 0)


def side_effect(name: str, state: str | None, reversible: bool = False, **status: Any) -> SideEffect:
    body: dict[str, Any] = {
        "metadata": {"name": name, "creationTimestamp": ts(6), "resourceVersion": "42"},
        "spec": {
            "runName": "ask",
            "tool": "create_ticket",
            "idempotencyKey": f"key-{name}",
            "reversible": reversible,
        },
    }
    if state:
        body["status"] = {"state": state, **status}
    return SideEffect.model_validate(body)


# ---- parsing ------------------------------------------------------------------------------------------


def test_global_flags_go_before_or_after_the_command() -> None:
    before = parse(["-n", "team-a", "-o", "json", "get", "ask"])
    after = parse(["get", "ask", "--namespace", "team-a", "--output", "json"])
    for args in (before, after):
        assert (args.namespace, args.output, args.run) == ("team-a", "json", "ask")
    plain = parse(["describe", "ask"])
    assert (plain.namespace, plain.output, plain.kubeconfig) == (None, "table", None)


def test_resolve_effect_needs_exactly_one_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["resolve-effect", "sfx-1"], ["resolve-effect", "sfx-1", "--confirmed", "--failed"]):
        with pytest.raises(SystemExit) as exit_:
            parse(argv)
        assert exit_.value.code == 2
    assert "--confirmed" in capsys.readouterr().err
    args = parse(["resolve-effect", "sfx-1", "--confirmed", "--reference", "T-1"])
    assert (args.name, args.confirmed, args.reference) == ("sfx-1", True, "T-1")
    with pytest.raises(SystemExit):  # who resolved is the user the API server knows, never a flag
        parse(["resolve-effect", "sfx-1", "--failed", "--by", "alice"])


def test_unknown_output_formats_are_usage_errors() -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(["get", "-o", "wide"])
    assert exit_.value.code == 2


# ---- control requests -------------------------------------------------------------------------------


def test_the_default_resume_key_is_stable_valid_and_tied_to_the_answer() -> None:
    key = controls.resume_key(UID, "ask-r1", "ask-a1-s1", {"priority": "high"})
    assert key == controls.resume_key(UID, "ask-r1", "ask-a1-s1", {"priority": "high"})
    assert re.fullmatch(IDENTIFIER_PATTERN, key) and len(key) <= 128
    others = {
        controls.resume_key(UID, "ask-r1", "ask-a1-s1", {"priority": "low"}),
        controls.resume_key(UID, "ask-r2", "ask-a1-s1", {"priority": "high"}),
        controls.resume_key(UID, "ask-r1", "ask-a1-s2", {"priority": "high"}),
        controls.resume_key("another-uid", "ask-r1", "ask-a1-s1", {"priority": "high"}),
    }
    assert key not in others and len(others) == 4


def test_retry_keys_and_pause_ids_change_with_the_runs_progress() -> None:
    failed = make_run({"phase": "Failed", "attempts": 1, "latestCheckpoint": "ask-a1-s1"})
    again = make_run({"phase": "Failed", "attempts": 2, "latestCheckpoint": "ask-a1-s1"})
    assert controls.retry_key(failed, None, "fixed") == controls.retry_key(failed, None, "fixed")
    assert controls.retry_key(failed, None, "fixed") != controls.retry_key(again, None, "fixed")
    assert controls.retry_key(failed, None, "fixed") != controls.retry_key(failed, "c", "fixed")
    running = make_run({"phase": "Running", "attempts": 1, "latestCheckpoint": "ask-a1-s1"})
    later = make_run({"phase": "Running", "attempts": 1, "latestCheckpoint": "ask-a1-s2"})
    assert controls.pause_request_id(running, None) != controls.pause_request_id(later, None)
    assert re.fullmatch(IDENTIFIER_PATTERN, controls.pause_request_id(running, "lunch"))


def test_compensate_keys_are_fresh_per_compensation_and_the_patch_replaces_the_effects() -> None:
    done = make_run({"phase": "Succeeded", "attempts": 1})
    compensated = make_run({"phase": "Succeeded", "attempts": 2})
    key = controls.compensate_key(done, ["b", "a"])
    assert key == controls.compensate_key(done, ["a", "b"]), "a double click asks once"
    assert key != controls.compensate_key(compensated, ["a", "b"]), "after it ran, a new request"
    assert key != controls.compensate_key(done, [])
    assert re.fullmatch(IDENTIFIER_PATTERN, key) and len(key) <= 128
    assert controls.compensate_patch(key, ["b", "a"], by="carol") == {
        "spec": {"compensateRequest": {"idempotencyKey": key, "effects": ["a", "b"], "requestedBy": "carol"}}
    }
    assert controls.compensate_patch(key, [])["spec"]["compensateRequest"]["effects"] is None


def test_the_compensate_command_takes_effects_by_key() -> None:
    args = parse(["compensate", "r", "--effect", "k1", "--effect", "k2", "--wait"])
    assert (args.run, args.effect, args.wait) == ("r", ["k1", "k2"], True)


def test_schema_problems_read_like_the_operators() -> None:
    assert controls.schema_problem({"priority": "high"}, PRIORITY) is None
    assert controls.schema_problem("anything", None) is None
    problem = controls.schema_problem({"priority": "urgent"}, PRIORITY)
    assert problem is not None and problem.startswith("value at priority: 'urgent' is not one of")
    assert controls.schema_problem({}, PRIORITY) == "value at (root): 'priority' is a required property"


def test_patches_say_exactly_what_is_asked() -> None:
    assert controls.cancel_operations(3, "99") == [
        {"op": "test", "path": "/spec/cancelEpoch", "value": 3},
        {"op": "replace", "path": "/spec/cancelEpoch", "value": 4},
    ]
    assert controls.cancel_operations(None, "99")[0] == {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": "99",
    }
    # explicit nulls, so that a merge patch removes what an earlier request had set
    assert controls.retry_patch("k", None, None) == {
        "spec": {
            "retryRequest": {
                "idempotencyKey": "k",
                "fromCheckpoint": None,
                "reason": None,
                "requestedBy": None,
            }
        }
    }
    # the answer replaces the previous one whole (a merge patch would mix the two values)
    assert controls.resume_operations("7", "r", "c", {"a": 1}, "k") == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        {
            "op": "add",
            "path": "/spec/resume",
            "value": {"requestId": "r", "checkpointId": "c", "value": {"a": 1}, "idempotencyKey": "k"},
        },
    ]


def test_every_request_names_its_sender_and_a_default_key_is_the_senders_own() -> None:
    [_, answer] = controls.resume_operations("7", "r", "c", {"a": 1}, "k", by="carol")
    assert answer["value"]["answeredBy"] == "carol"
    assert controls.retry_patch("k", None, None, by="carol")["spec"]["retryRequest"]["requestedBy"] == (
        "carol"
    )
    assert controls.cancel_request("k", "wrong input", by="carol") == {
        "idempotencyKey": "k",
        "reason": "wrong input",
        "requestedBy": "carol",
    }
    run = make_run({"phase": "Failed", "attempts": 1})
    value: dict[str, Any] = {"approved": True}
    keys = [
        (
            controls.resume_key(UID, "r", "c", value, by=who),
            controls.retry_key(run, None, None, by=who),
        )
        for who in ("carol", "dave")
    ]
    assert keys[0][0] != keys[1][0] and keys[0][1] != keys[1][1], "two people, two requests"
    assert controls.cancel_key(run, 1, None, by="carol") != controls.cancel_key(run, 1, None, by="dave")
    assert controls.compensate_key(run, [], by="carol") != controls.compensate_key(run, [], by="dave")


def resume_args(**given: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"request_id": None, "checkpoint": None, "key": None, **given})


def test_resume_defaults_come_from_the_pending_request_then_from_the_sent_resume() -> None:
    waiting = make_run(WAITING)
    answer = resume.plan_answer(waiting, resume_args(), {"priority": "high"})
    assert (answer.request_id, answer.checkpoint_id) == ("ask-r1", "ask-a1-s1")
    assert answer.key == controls.resume_key(UID, "ask-r1", "ask-a1-s1", {"priority": "high"})
    assert resume.local_refusal(waiting, answer, explicit_request=False) is None

    wrong = resume.plan_answer(waiting, resume_args(), {"priority": "urgent"})
    refusal = resume.local_refusal(waiting, wrong, explicit_request=False)
    assert refusal is not None and "does not match the schema of request ask-r1" in refusal

    # once answered, the same command finds the same key (and so the recorded outcome)
    sent = {
        "requestId": "ask-r1",
        "checkpointId": "ask-a1-s1",
        "value": {"priority": "high"},
        "idempotencyKey": answer.key,
    }
    moved_on = make_run({**FINISHED, "pendingRequest": None}, resume=sent)
    assert resume.plan_answer(moved_on, resume_args(), {"priority": "high"}).key == answer.key
    assert resume.local_refusal(moved_on, answer, explicit_request=False) is not None

    explicit = resume.plan_answer(waiting, resume_args(request_id="x", checkpoint="c", key="mine"), 1)
    assert (explicit.request_id, explicit.checkpoint_id, explicit.key) == ("x", "c", "mine")


def test_an_answer_never_replaces_another_that_awaits_its_verdict() -> None:
    theirs = {
        "requestId": "ask-r1",
        "checkpointId": "ask-a1-s1",
        "value": {"priority": "low"},
        "idempotencyKey": "theirs",
    }
    args = resume_args(value='{"priority": "high"}', value_file=None)
    in_flight = make_run(WAITING, resume=theirs)
    mine = resume.plan_answer(in_flight, args, {"priority": "high"})
    with pytest.raises(CliError, match="another answer \\(key theirs\\) awaits the operator's verdict") as e:
        resume.check_sendable(in_flight, mine, args, Target("team-a"))
    assert "See: kubectl agentrun describe ask -n team-a" in e.value.message
    judged = make_run(
        {**WAITING, "controls": [control("theirs", "Rejected", "StaleCheckpoint", "no", 1)]}, resume=theirs
    )
    resume.check_sendable(judged, mine, args, Target("team-a"))  # once judged, a new answer may replace it


def test_resume_of_a_run_that_waits_for_nothing_is_refused_locally() -> None:
    with pytest.raises(CliError, match="Running, not waiting for input"):
        resume.plan_answer(make_run({"phase": "Running"}), resume_args(), {})


def test_resume_values_must_be_json_and_not_null(tmp_path: Any) -> None:
    def value_of(**given: Any) -> Any:
        return resume.read_value(argparse.Namespace(**{"value": None, "value_file": None, **given}))

    assert value_of(value='{"priority": "high"}') == {"priority": "high"}
    assert value_of() == {}
    path = tmp_path / "answer.json"
    path.write_text("[1, 2]")
    assert value_of(value_file=str(path)) == [1, 2]
    for bad in ({"value": "{nope"}, {"value": "null"}, {"value": "1", "value_file": str(path)}):
        with pytest.raises(CliError) as refused:
            value_of(**bad)
        assert refused.value.code == 2


def test_a_cancel_under_way_is_not_counted_twice() -> None:
    assert cancel.already_cancelling(make_run({"phase": "CancelRequested"}, cancelEpoch=1))
    assert cancel.already_cancelling(
        make_run({"phase": "Cancelled", "observedCancelEpoch": 1}, cancelEpoch=1)
    )
    assert cancel.already_cancelling(make_run({"phase": "Running", "observedCancelEpoch": 0}, cancelEpoch=1))
    assert not cancel.already_cancelling(
        make_run({"phase": "Running", "observedCancelEpoch": 1}, cancelEpoch=1)
    )
    # a result committed before the cancel arrived: the server refuses another cancel, we do not pretend
    assert not cancel.already_cancelling(
        make_run({"phase": "Succeeded", "observedCancelEpoch": 0}, cancelEpoch=1)
    )


def test_a_resolution_records_who_and_keeps_the_history() -> None:
    unknown = side_effect(
        "sfx-1", "Unknown", history=[{"state": "Unknown", "time": ts(6), "message": "outcome unknown"}]
    )
    patch = effects.resolution(
        unknown,
        SideEffectState.CONFIRMED,
        who="alice",
        reference="T-1",
        result={"id": "T-1"},
        now=ts(9),
    )
    assert patch["metadata"] == {"resourceVersion": "42"}, "guarded against a concurrent writer"
    status = patch["status"]
    assert (status["state"], status["resolvedBy"], status["externalReference"]) == (
        "Confirmed",
        "alice",
        "T-1",
    )
    assert [h["state"] for h in status["history"]] == ["Unknown", "Confirmed"]


# ---- rendering ------------------------------------------------------------------------------------------


def test_tables_align_columns_and_mark_missing_cells() -> None:
    text = formats.table(["NAME", "PHASE"], [["a-long-name", None], ["b", "Running"]])
    assert text.splitlines() == ["NAME          PHASE", "a-long-name   -", "b             Running"]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (5, "5s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (4 * 3600 + 60, "4h1m"),
        (30 * 3600, "30h"),
        (3 * 86400, "3d"),
    ],
)
def test_ages_read_like_kubectls(seconds: int, shown: str) -> None:
    assert formats.age(T0, T0 + timedelta(seconds=seconds)) == shown


def test_get_shows_the_printer_columns() -> None:
    text = formats.runs_table([make_run(WAITING)], T0 + timedelta(seconds=90))
    header, row = text.splitlines()
    headers = ["NAME", "PHASE", "ATTEMPT", "LEASE-EPOCH", "CANCEL-EPOCH", "WAITING-FOR", "HELD-BY", "AGE"]
    assert header.split() == headers
    assert row.split() == ["ask", "InputRequired", "1", "1", "0", "ask-r1", "-", "90s"]


def test_get_shows_the_attempt_that_holds_the_request() -> None:
    held = {**WAITING, "pendingRequest": {**WAITING["pendingRequest"], "heldBy": "ask-a1", "holdSeconds": 30}}
    _, row = formats.runs_table([make_run(held)], T0 + timedelta(seconds=90)).splitlines()
    assert row.split() == ["ask", "InputRequired", "1", "1", "0", "ask-r1", "ask-a1", "90s"]


def test_describe_tells_the_story_in_order() -> None:
    run = make_run(FINISHED)
    attempts = [
        attempt(1, "initial", "Interrupted", 1, 3),
        attempt(
            2,
            "resume:ask-r1",
            "Succeeded",
            5,
            7,
            usage={"inputTokens": 1200, "outputTokens": 310, "costMicroUSD": 4210, "modelCalls": 3},
        ),
    ]
    checkpoints = [checkpoint(1, 1, 2), checkpoint(2, 2, 6)]
    effects_ = [
        side_effect(
            "sfx-1",
            "Confirmed",
            externalReference="T-1",
            attempt="ask-a2",
            history=[
                {"state": "Pending", "time": ts(6), "attempt": "ask-a2"},
                {"state": "Confirmed", "time": ts(6), "attempt": "ask-a2", "message": "executed"},
            ],
        )
    ]
    text = timeline.describe(run, attempts, checkpoints, effects_, T0 + timedelta(minutes=5))
    assert "Phase:         Succeeded: ask-a2 committed the result" in text
    assert 'Result:        {"answer": {"priority": "high"}} (committed by ask-a2)' in text
    story = text.split("Timeline (UTC):\n")[1].split("\n\n")[0].splitlines()
    whats = [line.strip()[10:].split("  ")[0] for line in story]
    assert whats == [
        "run created",
        "attempt 1 started",
        "checkpoint 1",
        "attempt 1 Interrupted",
        "resume Rejected",
        "resume Accepted",
        "input recorded",
        "attempt 2 started",
        "checkpoint 2",
        "side effect Pending",
        "side effect Confirmed",
        "attempt 2 Succeeded",
        "run Succeeded",
    ]
    assert story[0].strip().startswith("12:00:00")
    assert "SchemaMismatch: value at priority" in story[4]
    assert "1200 input + 310 output tokens, 3 model calls, $0.004210, 0 step retries" in story[-2]
    usage = text.split("Usage:\n")[1].split("\n\n")[0].splitlines()
    assert usage[0].split() == ["ATTEMPT", "PHASE", "INPUT", "OUTPUT", "MODEL-CALLS", "COST", "STEP-RETRIES"]
    assert usage[1].split() == ["ask-a1", "Interrupted", "0", "0", "0", "$0.000000", "0"]
    assert usage[2].split() == ["ask-a2", "Succeeded", "1200", "310", "3", "$0.004210", "0"]
    # the operator has not summed them yet (no Run.status.usage): the Attempts' sum stands in
    assert usage[3].split() == ["total", "-", "1200", "310", "3", "$0.004210", "0"]
    assert story[-1].split("run Succeeded")[1].strip() == "ask-a2 committed the result"
    assert "Conditions:" in text and "Side-effect report:" in text
    assert "1 confirmed (1 cannot be undone), 0 compensated, 0 unknown" in text


def test_a_cancel_comes_before_what_it_causes_and_the_end_comes_last() -> None:
    condition = {"status": "True", "reason": "Cancelled", "lastTransitionTime": ts(4)}
    run = make_run(
        {
            "phase": "Cancelled",
            "message": "cancelled (cancel epoch 1)",
            "conditions": [
                {"type": "CancelRequested", **condition},
                {"type": "Succeeded", **condition, "status": "False"},
            ],
        },
        cancelEpoch=1,
    )
    aborted = attempt(1, "initial", "Aborted", 1, 4, failure={"class": "cancelled", "message": "cancelled"})
    story = [
        line.strip()[10:]
        for line in timeline.describe(run, [aborted], [], [], T0)
        .split("Timeline (UTC):\n")[1]
        .split("\n\n")[0]
        .splitlines()
    ]
    assert [line.split("  ")[0] for line in story] == [
        "run created",
        "attempt 1 started",
        "cancel requested",
        "attempt 1 Aborted",
        "run Cancelled",
    ]
    assert story[2].endswith("cancel epoch 1") and story[3].endswith("cancelled: cancelled")


def test_describe_shows_what_a_waiting_run_asks_for() -> None:
    text = timeline.describe(make_run(WAITING), [], [], [], T0)
    waiting = text.split("Waiting for:\n")[1]
    assert "request ask-r1 (input_required) at checkpoint ask-a1-s1" in waiting
    assert "Prompt:  Which priority?" in waiting
    assert '"enum": ["low", "high"]' in waiting
    assert "kubectl agentrun resume ask --value JSON -n team-a" in waiting


def test_describe_says_where_a_fork_started_and_what_it_inherited() -> None:
    fork_from = {"run": "source", "checkpointId": "source-a1-s2"}
    started = {
        "phase": "Running",
        "fork": {
            "run": "source",
            "uid": UID,
            "checkpointId": "source-a1-s2",
            "ledgerMark": 1,
            "inherited": 1,
        },
    }

    text = timeline.describe(make_run(started, forkFrom=fork_from), [], [], [], T0)
    not_started = timeline.describe(make_run(forkFrom=fork_from), [], [], [], T0)

    expected = f"Forked from:   run source at checkpoint source-a1-s2 (uid {UID}; 1 side effect(s) inherited)"
    assert expected in text
    assert "Forked from:   run source at checkpoint source-a1-s2 (not started)" in not_started
    assert "Forked from" not in timeline.describe(make_run(WAITING), [], [], [], T0)


def test_control_lines() -> None:
    accepted = ControlRecord.model_validate(
        control("k3", "Accepted", "Accepted", "answer to ask-r1 accepted", 5)
    )
    rejected = ControlRecord.model_validate(control("k2", "Rejected", "SchemaMismatch", "value at ...", 4))
    assert formats.control_line(accepted) == "Resume k3: Accepted (answer to ask-r1 accepted)"
    assert formats.control_line(rejected) == "Resume k2: Rejected, SchemaMismatch: value at ..."
    named = ControlRecord.model_validate(
        {**control("k4", "Accepted", "Accepted", "ok", 6), "requestedBy": "bob"}
    )
    assert formats.control_line(named) == "Resume k4 by bob: Accepted (ok)"


def test_the_report_separates_what_happened_from_what_cannot_be_undone() -> None:
    effects_ = formats.reported_effects(
        [
            side_effect("sfx-1", "Confirmed", externalReference="T-1"),
            side_effect("sfx-2", "Compensated", reversible=True, externalReference="T-2"),
            side_effect("sfx-3", "Unknown"),
            side_effect("sfx-4", None),
            side_effect("sfx-5", "Confirmed", reversible=True, externalReference="T-5"),
        ]
    )
    text = formats.report_text(make_run({"phase": "NeedsReconciliation", "message": "resolve"}), effects_)
    sections = {block.split(":")[0]: block for block in re.split(r"\n(?=[A-Z])", text)}
    assert "T-1" in sections["What happened (3)"] and "T-2" in sections["What happened (3)"]
    assert "T-2" in sections["What was compensated (1)"]
    assert (
        "T-1" in sections["What cannot be undone (1)"] and "T-5" not in sections["What cannot be undone (1)"]
    )
    assert "T-5" in sections["Could still be compensated (1)"]
    unknown = sections["Unknown"]
    assert "sfx-3" in unknown and "sfx-4" in unknown, "Pending counts as unknown once the Run has stopped"
    assert "kubectl agentrun resolve-effect sfx-3" in text


def test_the_report_of_a_run_without_effects_says_so() -> None:
    text = formats.report_text(make_run({"phase": "Succeeded", "message": "done"}), [])
    assert text.splitlines() == [
        "Run ask: Succeeded: done",
        "No external side effects: nothing to compensate, nothing that cannot be undone.",
    ]


def test_effects_table() -> None:
    text = formats.effects_table(
        [side_effect("sfx-1", "Confirmed", externalReference="T-1", attempt="ask-a2")]
    )
    assert [line.split() for line in text.splitlines()] == [
        ["NAME", "TOOL", "STATE", "REFERENCE", "REVERSIBLE", "ATTEMPT", "SENDS"],
        ["sfx-1", "create_ticket", "Confirmed", "T-1", "no", "ask-a2", "0/3"],
    ]


PHASES = (
    *("Queued", "Running", "RetryBackoff", "CancelRequested", "InputRequired", "Paused"),
    *("NeedsReconciliation", "Succeeded", "Failed", "Cancelled"),
)


def test_watch_stops_when_the_run_stops_or_waits() -> None:
    codes = {phase: watch.exit_code(make_run({"phase": phase})) for phase in PHASES}
    assert codes == {
        "Queued": None,
        "Running": None,
        "RetryBackoff": None,
        "CancelRequested": None,
        "InputRequired": 0,
        "Paused": 0,
        "NeedsReconciliation": 0,
        "Succeeded": 0,
        "Failed": 1,
        "Cancelled": 1,
    }


def test_api_refusals_read_clearly() -> None:
    assert describe_api_error(ApiError(403, "Forbidden", 'runs "x" is forbidden: User "bob" cannot get')) == (
        'forbidden: runs "x" is forbidden: User "bob" cannot get'
    )
    missing = describe_api_error(
        ApiError(404, "NotFound", "the server could not find the requested resource")
    )
    assert "CRDs installed" in missing

    refusal = ApiError(403, "Forbidden", "watch is forbidden")
    assert api_error_from(refusal) is refusal
    assert api_error_from(ValueError("no")) is None


def test_kubeapi_turns_client_exceptions_into_api_errors() -> None:
    """Requests and watch streams alike hand on the API server's Status, never the client's exception."""
    raw = ApiException(status=403, reason="Forbidden")
    raw.body = '{"kind": "Status", "reason": "Forbidden", "message": "watch is forbidden"}'
    converted = to_api_error(raw)
    assert (converted.status, converted.reason, converted.message) == (403, "Forbidden", "watch is forbidden")


@pytest.mark.parametrize(
    ("mode", "line"),
    [
        ("Bundled", "State store:   Bundled (the operator's bundled object store)"),
        ("External", "State store:   External (the object store the operator is configured with)"),
        ("Inline", "State store:   Inline (the operator has no state store: state stays in the cluster)"),
    ],
)
def test_describe_says_where_the_operator_keeps_the_runs_state(mode: str, line: str) -> None:
    text = timeline.describe(make_run({**WAITING, "stateStore": mode}), [], [], [], T0)

    assert line in text.splitlines()


def test_describe_of_a_run_no_operator_spoke_of_says_nothing_of_a_store() -> None:
    assert "State store:" not in timeline.describe(make_run(WAITING), [], [], [], T0)
