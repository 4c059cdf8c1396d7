"""core.fork and the ForkStart rule: which sources a fork refuses and why, what it copies, which of the
source's SideEffects it inherits (exactly those up to the checkpoint's ledger mark), and how the ledger,
the report and compensation treat inherited records."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun.api import Checkpoint, Run, SideEffect
from agentrun.core import compensation, fork, ledger, report
from agentrun.core.fork import ForkSourceView
from agentrun.core.ledger import Step, StopReason, side_effect_name
from agentrun.core.plan import CreateAttempt, CreateCheckpoint, CreateSideEffect, WriteLease
from agentrun.core.runs import decide
from unit.factories import NAMESPACE, NOW, kinds, make_run, make_world, of_type, run_patch, ts

SOURCE = "source"
SOURCE_UID = "5d1e0c5a-0000-4000-8000-00000000beef"
FORK = "fork"
MARK = 2
BLOB = "a" * 64
LABELS = {"agentrun.dev/run": SOURCE}


def source_run() -> Run:
    return make_run(
        {"phase": "Succeeded"}, metadata={"name": SOURCE, "uid": SOURCE_UID, "resourceVersion": "77"}
    )


def fork_run(checkpoint_id: str = "source-a1-s2", run: str = SOURCE, **status: Any) -> Run:
    spec = {"forkFrom": {"run": run, "checkpointId": checkpoint_id}}
    return make_run(status or None, spec=spec, metadata={"name": FORK})


def checkpoint(
    checkpoint_id: str = "source-a1-s2", kind: str = "State", mark: int | None = MARK, **spec: Any
) -> Checkpoint:
    body: dict[str, Any] = {
        "runName": SOURCE,
        "id": checkpoint_id,
        "sequence": 2,
        "attempt": "source-a1",
        "leaseEpoch": 1,
        "kind": kind,
        "step": "drafted",
        "stateRef": {"key": f"agentrun/{NAMESPACE}/{SOURCE_UID}/sha256/{BLOB}", "sha256": BLOB, "size": 9},
        **spec,
    }
    if mark is not None:
        body["ledgerMark"] = mark
    return Checkpoint.model_validate(
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "Checkpoint",
            "metadata": {"name": checkpoint_id, "namespace": NAMESPACE, "labels": LABELS},
            "spec": body,
        }
    )


def record(key: str, sequence: int | None, state: str | None = "Confirmed", **status: Any) -> SideEffect:
    spec: dict[str, Any] = {"runName": SOURCE, "tool": "create_ticket", "idempotencyKey": key}
    if sequence is not None:
        spec["ledgerSequence"] = sequence
    body: dict[str, Any] = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "SideEffect",
        "metadata": {"name": side_effect_name(SOURCE, key), "namespace": NAMESPACE},
        "spec": spec,
    }
    if state is not None:
        found = {"externalReference": f"T-{key}", "result": {"id": f"T-{key}"}}
        body["status"] = {"state": state, **found, **status}
    return SideEffect.model_validate(body)


def view(**kw: Any) -> ForkSourceView:
    defaults: dict[str, Any] = {"run": source_run(), "checkpoint": checkpoint(), "side_effects": ()}
    return ForkSourceView(**{**defaults, **kw})


def decide_fork(source: ForkSourceView | None, run: Run | None = None) -> Any:
    world = replace(make_world(run or fork_run()), fork_source=source)
    return decide(world)


# ---- refused sources ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "run", "reason", "says"),
    [
        (ForkSourceView(run=None), None, fork.NOT_FOUND, "no Run source in namespace team-a"),
        (view(checkpoint=None), None, fork.NOT_FOUND, "Run source has no checkpoint source-a1-s2"),
        (
            view(checkpoint=None, missing_note="compacted"),
            None,
            fork.NOT_FOUND,
            "no checkpoint source-a1-s2 (compacted)",
        ),
        (view(checkpoint=checkpoint(kind="Writes")), None, fork.INVALID, "is a Writes checkpoint"),
        (view(checkpoint=checkpoint(kind="Journal")), None, fork.INVALID, "is a Journal checkpoint"),
        (view(checkpoint=checkpoint(mark=None)), None, fork.INVALID, "records no ledger mark"),
        (view(checkpoint=checkpoint(deltaBase="source-a1-s1")), None, fork.INVALID, "deltas"),
        (
            view(checkpoint=checkpoint(thread={"id": SOURCE, "ns": "tools:6f1c"})),
            None,
            fork.INVALID,
            "a checkpoint of a subgraph (checkpoint namespace 'tools:6f1c')",
        ),
        (view(), fork_run(run=FORK), fork.INVALID, "names this Run itself (fork)"),
    ],
)
def test_a_fork_from_an_unusable_source_fails_before_any_attempt(
    source: ForkSourceView, run: Run | None, reason: str, says: str
) -> None:
    plan = decide_fork(source, run)

    assert kinds(plan) == ["PatchRunStatus"]  # no Lease, no Attempt, no copy
    patch = run_patch(plan)
    assert patch["phase"] == "Failed"
    assert patch["failure"]["reason"] == reason
    assert says in patch["message"]


def test_a_fork_whose_source_was_not_read_yet_waits() -> None:
    plan = decide_fork(None)

    assert plan.actions == [] and plan.requeue_after is not None


# ---- a fork that starts ------------------------------------------------------------------------------


def test_a_fork_copies_the_checkpoint_inherits_up_to_the_mark_then_resumes_from_the_copy() -> None:
    records = [record("k1", 1), record("k2", 2), record("k3", 3), record("k4", 4, "Pending")]
    plan = decide_fork(view(side_effects=records))

    assert kinds(plan) == [
        "CreateCheckpoint",
        "CreateSideEffect",
        "CreateSideEffect",
        "WriteLease",
        "PatchRunStatus",
        "CreateAttempt",
        "CreatePod",
    ]
    copy = of_type(plan, CreateCheckpoint)[0].body
    assert copy["metadata"]["name"] == copy["spec"]["id"] == "fork-a0-s2"
    assert copy["metadata"]["labels"] == {"agentrun.dev/run": FORK}
    assert copy["spec"]["runName"] == FORK
    # the same state reference: the source's blob, shared by digest, never copied
    assert copy["spec"]["stateRef"] == checkpoint().spec.state_ref.to_api()  # type: ignore[union-attr]
    assert copy["spec"]["ledgerMark"] == MARK
    assert copy["spec"]["copiedFrom"] == {"run": SOURCE, "uid": SOURCE_UID, "checkpoint": "source-a1-s2"}
    assert "parent" not in copy["spec"]

    inherited = of_type(plan, CreateSideEffect)
    assert [c.body["spec"]["idempotencyKey"] for c in inherited] == ["k1", "k2"]  # k3, k4 came after
    first = inherited[0]
    assert first.body["metadata"]["name"] == side_effect_name(FORK, "k1")  # the fork's own record
    assert first.body["spec"]["runName"] == FORK
    (status,) = first.statuses
    assert status["state"] == "Confirmed"
    assert status["result"] == {"id": "T-k1"}
    source_record = side_effect_name(SOURCE, "k1")
    assert status["inheritedFrom"] == {"run": SOURCE, "uid": SOURCE_UID, "record": source_record}
    assert status["history"][-1]["message"] == f"inherited from Run {SOURCE} ({source_record})"

    patch = run_patch(plan)
    assert patch["phase"] == "Running"
    assert patch["latestCheckpoint"] == "fork-a0-s2"
    assert patch["fork"] == {
        "run": SOURCE,
        "uid": SOURCE_UID,
        "checkpointId": "source-a1-s2",
        "ledgerMark": MARK,
        "inherited": 2,
        "archived": False,
    }
    attempt = of_type(plan, CreateAttempt)[0].body
    assert attempt["spec"]["resumeFrom"] == "fork-a0-s2"
    assert attempt["spec"]["reason"] == "initial"
    assert of_type(plan, WriteLease)[0].epoch == 1


def test_a_langgraph_checkpoint_of_the_root_graph_is_forked_with_its_thread_as_it_is() -> None:
    thread = {"id": SOURCE, "ns": ""}
    plan = decide_fork(view(checkpoint=checkpoint(thread=thread), side_effects=[record("k1", 1)]))

    assert kinds(plan)[:2] == ["CreateCheckpoint", "CreateSideEffect"]
    copy = of_type(plan, CreateCheckpoint)[0].body
    assert copy["spec"]["thread"] == thread  # run_graph in the fork continues it on the fork's own thread
    assert copy["spec"]["ledgerMark"] == MARK
    assert copy["spec"]["stateRef"]["key"].startswith(f"agentrun/{NAMESPACE}/{SOURCE_UID}/")


def test_records_without_a_ledger_sequence_are_inherited_so_nothing_is_repeated() -> None:
    plan = decide_fork(view(side_effects=[record("old", None), record("later", 5)]))

    assert [c.body["spec"]["idempotencyKey"] for c in of_type(plan, CreateSideEffect)] == ["old"]


def test_an_archived_source_starts_the_fork_like_a_live_one() -> None:
    plan = decide_fork(view(archived=True, side_effects=[record("k1", 1)]))

    assert run_patch(plan)["fork"]["archived"] is True
    assert "CreateAttempt" in kinds(plan)


@pytest.mark.parametrize("state", ["Pending", "Unknown", None])
def test_an_inherited_open_record_stops_the_fork_before_any_attempt(state: str | None) -> None:
    plan = decide_fork(view(side_effects=[record("k1", 1), record("k2", 2, state)]))

    assert kinds(plan) == ["CreateCheckpoint", "CreateSideEffect", "CreateSideEffect", "PatchRunStatus"]
    open_status = of_type(plan, CreateSideEffect)[1].statuses[-1]
    assert open_status["state"] == "Unknown"  # a Pending one may still be in flight at the source
    patch = run_patch(plan)
    assert patch["phase"] == "NeedsReconciliation"
    assert patch["failure"]["reason"] == fork.INHERITED_UNKNOWN
    assert patch["latestCheckpoint"] == "fork-a0-s2"  # a retry after the resolution resumes there
    assert side_effect_name(SOURCE, "k2") in patch["message"]


def test_a_compensated_source_record_is_written_confirmed_then_compensated() -> None:
    plan = decide_fork(view(side_effects=[record("k1", 1, "Compensated")]))

    statuses = of_type(plan, CreateSideEffect)[0].statuses
    assert [s["state"] for s in statuses] == ["Confirmed", "Compensated"]


def test_a_started_fork_is_not_forked_again() -> None:
    run = fork_run(phase="Running", currentAttempt=1, attempts=1, leaseEpoch=1)
    world = replace(make_world(run), fork_source=view())

    assert not of_type(decide(world), CreateCheckpoint)


# ---- inherited records in the ledger, the report and compensation ----------------------------------------


def inherited_record(state: str) -> SideEffect:
    source = record("k1", 1, state)
    body, statuses = fork.inherited_record(fork_run(), source_run(), source, NOW)
    return SideEffect.model_validate({**body, "status": statuses[-1]})


def test_the_fork_reuses_an_inherited_confirmed_effect_and_never_sends_it() -> None:
    effect = inherited_record("Confirmed")

    assert ledger.next_step(effect, effect.spec.request_digest or "", NOW).step == Step.REUSE
    assert ledger.is_inherited(effect)


@pytest.mark.parametrize("state", ["Pending", "Unknown"])
def test_the_fork_stops_on_an_inherited_open_effect_without_a_lookup(state: str) -> None:
    effect = inherited_record(state)

    decision = ledger.next_step(effect, "", NOW)
    assert decision.step == Step.RECONCILE and decision.reason == StopReason.INHERITED_UNKNOWN


def test_the_fork_never_compensates_an_inherited_effect_and_the_report_says_so() -> None:
    body = inherited_record("Confirmed").to_api()
    body["spec"].update(reversible=True, compensation="close_ticket")
    body["metadata"]["creationTimestamp"] = ts(NOW)
    effect = SideEffect.model_validate(body)
    own = SideEffect.model_validate(
        {
            **body,
            "metadata": {"name": "sfx-own", "namespace": NAMESPACE, "creationTimestamp": ts(NOW)},
            "status": {"state": "Confirmed"},
        }
    )

    assert compensation.to_compensate([effect, own]) == [own]
    assert compensation.to_settle([inherited_record("Unknown")]) == []
    fates = report.run_report([effect, own])
    assert fates["happened"] == ["sfx-own"]
    listed = {e["name"]: e for e in fates["effects"]}
    assert listed[str(effect.metadata.name)]["inherited"] is True
    assert "inherited" not in listed["sfx-own"]
    assert "never executed nor compensated" in listed[str(effect.metadata.name)]["note"]
    assert report.side_effect_counts([effect, own])["confirmed"] == 1


def test_an_archived_source_is_read_from_its_archive_document() -> None:
    document = {
        "object": source_run().to_api(),
        "checkpoints": [checkpoint("source-a1-s1").to_api(), checkpoint().to_api()],
        "sideEffects": [record("k1", 1).to_api(), record("k3", 3).to_api()],
        "report": {},
    }

    source = fork.archived_source(document, "source-a1-s2")
    plan = decide_fork(source)

    assert source.archived and source.checkpoint is not None and source.checkpoint.spec.id == "source-a1-s2"
    assert [c.body["spec"]["idempotencyKey"] for c in of_type(plan, CreateSideEffect)] == ["k1"]
    assert run_patch(plan)["fork"]["archived"] is True
    missing = decide_fork(fork.archived_source(document, "nope"))
    assert run_patch(missing)["failure"]["reason"] == fork.NOT_FOUND


def test_a_fork_that_never_started_is_not_retried_from_the_beginning() -> None:
    failure = {"class": "deterministic", "reason": fork.NOT_FOUND, "message": "no Run", "fingerprint": "f"}
    run = fork_run(phase="Failed", failure=failure)
    body = run.to_api()
    body["spec"]["retryRequest"] = {"idempotencyKey": "retry-1"}
    plan = decide(make_world(Run.model_validate(body)))

    assert kinds(plan) == ["PatchRunStatus"]  # no Attempt
    [control] = run_patch(plan)["controls"]
    assert (control["outcome"], control["reason"]) == ("Rejected", "ForkNotStarted")
