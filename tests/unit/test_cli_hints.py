"""The commands kubectl agentrun suggests: they act where the command acted (namespace, context), and each
one is accepted in the state it is shown in, so following a hint never leads into a dead end."""

from __future__ import annotations

import argparse
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.api import CANCEL_FROZEN_PHASES, ControlRecord, Resolution, Run, SideEffect, SideEffectState
from agentrun.cli import config, formats, timeline
from agentrun.cli.app import parse
from agentrun.cli.cluster import Cluster
from agentrun.cli.commands import compensate, effects, resume
from agentrun.cli.commands.common import show_outcome
from agentrun.cli.context import Context
from agentrun.cli.controls import identifier_problem
from agentrun.cli.hints import Target
from agentrun.cli.nextsteps import NEW_KEY_VERSION_DOC, run_steps
from agentrun.cli.output import Output
from agentrun.core import compensation, controls, ledger
from agentrun.core.ledger import Step

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NS = "team-a"
HERE = Target(NS)
DIGEST = ledger.request_digest("create_ticket", "https://tickets.example/api", {"title": "t"})
PRIORITY = {"type": "object", "properties": {"priority": {"enum": ["low", "high"]}}}


def ts(seconds: int) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_in(phase: str, **status: Any) -> Run:
    return Run.model_validate(
        {
            "metadata": {"name": "paint", "namespace": NS, "uid": "u-1", "creationTimestamp": ts(0)},
            "spec": {"agent": {"image": "agentrun/agent:dev"}},
            "status": {"phase": phase, "attempts": 1, "currentAttempt": 1, "leaseEpoch": 1, **status},
        }
    )


def record(
    name: str, state: str, *, compensation_name: str = "", sends: int = 1, **status: Any
) -> SideEffect:
    outcome = {"Confirmed": "Confirmed", "Failed": "Failed"}.get(state, "Unknown")
    return SideEffect.model_validate(
        {
            "metadata": {"name": name, "creationTimestamp": ts(5), "resourceVersion": "7"},
            "spec": {
                "runName": "paint",
                "operationId": f"op-{name}",
                "tool": "create_ticket",
                "idempotencyKey": f"key-{name}",
                "target": "https://tickets.example/api",
                "requestDigest": DIGEST,
                "reversible": bool(compensation_name),
                "compensation": compensation_name,
            },
            "status": {
                "state": state,
                "attempt": "paint-a1",
                "sends": [
                    {
                        "sendId": f"op-{name}-s{i}",
                        "attempt": "paint-a1",
                        "time": ts(6 + i),
                        "outcome": outcome,
                    }
                    for i in range(sends)
                ],
                **status,
            },
        }
    )


@dataclass
class World:
    """A Run as a person finds it, with its ledger."""

    run: Run
    records: list[SideEffect] = field(default_factory=list)

    def texts(self) -> dict[str, str]:
        """Everything the plugin prints about this Run that may carry a suggestion."""
        listed = formats.reported_effects(self.records)
        undoable = {str(r.metadata.name) for r in self.records if compensation.compensable(r)}
        live = self.run.status.phase not in (
            "Succeeded",
            "Failed",
            "Cancelled",
            "NeedsReconciliation",
        )
        return {
            "watch": "\n".join(run_steps(self.run, HERE)),
            "describe": timeline.describe(self.run, [], [], self.records, T0, where=HERE),
            "report": formats.report_text(self.run, listed, live=live, where=HERE, compensable=undoable),
        }


COMMAND = re.compile(r"kubectl agentrun (?P<words>[^\n(),;]*?-n \S+)")


def suggested(text: str) -> list[list[str]]:
    return [m.group("words").split() for m in COMMAND.finditer(text)]


def settled(world: World) -> World:
    """The world after a person followed the report's "resolve" hints (the retry hints come after)."""
    records = [
        r
        if ledger.state_of(r) not in effects.OPEN
        else SideEffect.model_validate(
            {
                **r.to_api(),
                "status": {**(r.status.to_api() if r.status else {}), "state": "Failed", "resolvedBy": "me"},
            }
        )
        for r in world.records
    ]
    return World(world.run, records)


def accepted(world: World, words: list[str]) -> str | None:
    """None when the plugin and the operator accept the suggested command in this world; else why not."""
    verb, name, rest = words[0], words[1], words[2:]
    run = world.run
    if verb in ("report", "describe", "effects"):
        return None  # reading is always possible
    if verb == "resume":
        args = argparse.Namespace(request_id=None, checkpoint=None, key=None)
        value = {"priority": "high"} if "--value" in rest else {}
        try:
            answer = resume.plan_answer(run, args, value)
        except Exception as exc:
            return str(exc)
        return resume.local_refusal(run, answer, explicit_request=False)
    if verb == "retry":
        if run.status.phase in CANCEL_FROZEN_PHASES:
            return f"the plugin refuses a retry of a {run.status.phase} Run"
        after = settled(world)
        unresolved = [str(r.metadata.name) for r in after.records if ledger.state_of(r).value == "Unknown"]
        asked = Run.model_validate(
            {**run.to_api(), "spec": {**run.spec.to_api(), "retryRequest": {"idempotencyKey": "k-1"}}}
        )
        verdict = controls.judge_retry(asked, {"paint-a1-s1"}, unresolved)
        return None if verdict.accepted else f"{verdict.reason}: {verdict.message}"
    if verb == "compensate":
        if not compensate.compensable_now(run):
            return "the plugin refuses to send it"
        asked = Run.model_validate(
            {**run.to_api(), "spec": {**run.spec.to_api(), "compensateRequest": {"idempotencyKey": "k-2"}}}
        )
        verdict, started = compensation.judge(asked, world.records)
        if not verdict.accepted or (started is None and not compensation.is_incomplete(run)):
            return f"{verdict.reason}: {verdict.message} (nothing would happen)"
        return None
    if verb == "resolve-effect":
        target = next(r for r in world.records if r.metadata.name == name)
        given = {"--confirmed": Resolution.CONFIRMED, "--absent": Resolution.ABSENT}.get(
            rest[0], Resolution.FAILED
        )
        return effects.refusal(target, given)
    return f"unexpected command {verb}"


WAITING: dict[str, Any] = {
    "latestCheckpoint": "paint-a1-s1",
    "pendingRequest": {
        "requestId": "paint-r1",
        "reason": "input_required",
        "checkpointId": "paint-a1-s1",
        "prompt": "Which priority?",
        "acceptedSchema": PRIORITY,
    },
}
FAILED = {"failure": {"class": "deterministic", "message": "DNS: no such host", "fingerprint": "f1"}}
INCOMPLETE = {"compensating": {"returnPhase": "Succeeded", "firstAttempt": 2}}

ASKED: dict[str, Any] = WAITING["pendingRequest"]
APPROVAL = {**WAITING, "pendingRequest": {**ASKED, "reason": "auth_required"}}
PAUSED = {**WAITING, "pendingRequest": {**ASKED, "reason": "paused", "acceptedSchema": None}}

WORLDS: dict[str, World] = {
    "waiting for input": World(run_in("InputRequired", **WAITING)),
    "waiting for an approval": World(run_in("AuthRequired", **APPROVAL)),
    "paused": World(run_in("Paused", **PAUSED)),
    "succeeded, nothing done outside": World(run_in("Succeeded")),
    "succeeded, a ticket that can be closed": World(
        run_in("Succeeded"), [record("sfx-t", "Confirmed", compensation_name="close_ticket")]
    ),
    "cancelled, a ticket that can be closed": World(
        run_in("Cancelled"), [record("sfx-t", "Confirmed", compensation_name="close_ticket")]
    ),
    "succeeded, a ticket nothing closes": World(run_in("Succeeded"), [record("sfx-t", "Confirmed")]),
    "failed, nothing done outside": World(run_in("Failed", **FAILED, latestCheckpoint="paint-a1-s1")),
    "failed, its tool's call failed for good (a wrong target)": World(
        run_in("Failed", **FAILED), [record("sfx-t", "Failed")]
    ),
    "needs reconciliation, an unknown outcome": World(
        run_in("NeedsReconciliation", message="LookupUnavailable"), [record("sfx-t", "Unknown")]
    ),
    "needs reconciliation, sends spent (pending)": World(
        run_in("NeedsReconciliation", message="MaxSendsReached"), [record("sfx-t", "Pending", sends=3)]
    ),
    "needs reconciliation, a failed record": World(
        run_in("NeedsReconciliation", message="MaxSendsReached"), [record("sfx-t", "Failed", sends=3)]
    ),
    "compensation incomplete, a compensation that could not run": World(
        run_in("NeedsReconciliation", **INCOMPLETE),
        [record("sfx-t", "Confirmed", compensation_name="close_ticket")],
    ),
    "compensation incomplete, an open outcome": World(
        run_in("NeedsReconciliation", **INCOMPLETE),
        [record("sfx-t", "Confirmed", compensation_name="close_ticket"), record("sfx-u", "Unknown")],
    ),
}
# States a person must act on: each must offer a command that moves the Run (not only one that reads).
STUCK = {"InputRequired", "AuthRequired", "Paused", "Failed", "NeedsReconciliation"}
MOVING = {"resume", "retry", "compensate", "resolve-effect"}


@pytest.mark.parametrize("name", sorted(WORLDS))
def test_every_suggested_command_is_accepted_where_it_is_shown(name: str) -> None:
    world = WORLDS[name]
    shown = {where: suggested(text) for where, text in world.texts().items()}
    for where, commands in shown.items():
        for words in commands:
            assert words[-2:] == ["-n", NS], f"{where}: {words} must name the namespace"
            assert words[1] == "paint" or words[1].startswith("sfx-"), words
            problem = accepted(world, words)
            assert problem is None, f"{name}, {where} suggests `{' '.join(words)}`: {problem}"
    if world.run.status.phase in STUCK:
        moving = {words[0] for commands in shown.values() for words in commands} & MOVING
        assert moving, f"{name}: no way out is suggested: {shown}"


def test_a_failed_call_after_a_fixed_target_offers_a_new_key_version_and_a_resend() -> None:
    report = WORLDS["failed, its tool's call failed for good (a wrong target)"].texts()["report"]
    assert "kubectl agentrun resolve-effect sfx-t --absent -n team-a" in report
    assert "kubectl agentrun retry paint --reason TEXT -n team-a" in report
    assert NEW_KEY_VERSION_DOC in report
    assert "docs/api.md" in NEW_KEY_VERSION_DOC
    heading = "### Changing what a side effect sends"
    assert heading in (Path(__file__).parents[2] / "docs" / "api.md").read_text()


def test_compensate_is_suggested_only_where_a_compensation_would_run() -> None:
    for name in ("succeeded, a ticket that can be closed", "cancelled, a ticket that can be closed"):
        assert "kubectl agentrun compensate paint -n team-a" in WORLDS[name].texts()["report"]
    nothing_undoes = WORLDS["succeeded, a ticket nothing closes"].texts()["report"]
    assert "kubectl agentrun compensate" not in nothing_undoes
    # NeedsReconciliation for another reason: the operator would refuse a compensation (NotTerminal)
    assert not compensate.compensable_now(WORLDS["needs reconciliation, an unknown outcome"].run)


def test_an_absent_verdict_on_a_failed_record_lets_the_next_attempt_send_it_afresh() -> None:
    failed = record("sfx-t", "Failed", sends=2)
    assert ledger.next_step(failed, DIGEST, T0).step == Step.REFUSE, "a Failed record is final by itself"
    assert effects.refusal(failed, Resolution.ABSENT) is None
    assert "only --absent applies" in str(effects.refusal(failed, Resolution.CONFIRMED))
    assert "only --absent applies" in str(effects.refusal(failed, Resolution.FAILED))
    confirmed = record("sfx-c", "Confirmed")
    assert "Confirmed: only an Unknown (or Pending)" in str(effects.refusal(confirmed, Resolution.ABSENT))

    patch = effects.resolution(
        failed,
        SideEffectState.FAILED,
        who="alice",
        reference=None,
        result=None,
        now=ts(60),
        verdict=Resolution.ABSENT,
        reason="the DNS name was wrong; fixed",
    )
    status = patch["status"]
    assert (status["state"], status["resolution"], status["resolvedSends"]) == ("Failed", "Absent", 2)
    assert status["history"][-1]["message"] == (
        "resolved Absent by alice (kubectl agentrun): the DNS name was wrong; fixed"
    )
    resolved = SideEffect.model_validate(
        {**failed.to_api(), "status": {**(failed.status.to_api() if failed.status else {}), **status}}
    )
    assert effects.already_absent(resolved)
    assert ledger.next_step(resolved, DIGEST, T0 + timedelta(seconds=61)).step == Step.EXECUTE
    # the same key with another request (the target in the digest changed) is still refused, never sent
    other = ledger.request_digest("create_ticket", "https://tickets.fixed/api", {"title": "t"})
    assert ledger.next_step(resolved, other, T0).step == Step.REFUSE


# ---- where the commands act -----------------------------------------------------------------------------


def test_commands_carry_the_namespace_and_only_a_chosen_context_or_kubeconfig() -> None:
    assert HERE.command("resume", "paint", "--value", "JSON") == (
        "kubectl agentrun resume paint --value JSON -n team-a"
    )
    elsewhere = Target("agentrun-system", context="staging", kubeconfig="/home/me/my config")
    assert elsewhere.command("report", "paint") == (
        "kubectl agentrun report paint -n agentrun-system --context staging --kubeconfig '/home/me/my config'"
    )
    assert "-n team-a" in "\n".join(run_steps(run_in("Paused", **WAITING), HERE))


def test_the_context_is_named_only_when_it_is_not_the_current_one(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    cluster = {"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "dev", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
                    {"name": "ops", "context": {"cluster": "c", "user": "u", "namespace": "agentrun-system"}},
                ],
                "current-context": "dev",
            }
        )
    )
    path = str(kubeconfig)
    assert config.other_context(path, None) is None
    assert config.other_context(path, "dev") is None
    assert config.other_context(path, "ops") == "ops"
    assert config.default_namespace(path, "ops") == "agentrun-system"
    assert config.default_namespace(path) == "team-a"
    args = parse(["--context", "ops", "--kubeconfig", path, "watch", "paint"])
    assert args.context == "ops"


# ---- keys checked before anything is sent ----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["resume", "paint", "--key", "has space"],
        ["retry", "paint", "--key", "_leading"],
        ["retry", "paint", "--key", "k" * 129],
        ["compensate", "paint", "--key", "trailing."],
        ["compensate", "paint", "--effect", "a,b"],
        ["cancel", "paint", "--idempotency-key", "ünïcode"],
        ["pause", "paint", "--request-id", "x y"],
    ],
)
def test_bad_keys_are_refused_before_anything_is_sent(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "is not a valid" in err and "letters, digits and . _ : / @ = + -" in err


def test_good_keys_pass_and_the_rule_is_the_crds() -> None:
    assert parse(["retry", "paint", "--key", "fix-dns:v2"]).key == "fix-dns:v2"
    assert identifier_problem("k" * 128) is None
    assert "129 characters" in str(identifier_problem("k" * 129))
    assert identifier_problem("a") is None and identifier_problem("a/b@c=d+e") is None
    assert identifier_problem("") is not None


# ---- what -o json|yaml prints ---------------------------------------------------------------------------

MANAGED = {"metadata": {"name": "paint", "managedFields": [{"manager": "kubectl"}]}, "spec": {}}


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_raw_output_hides_managed_fields_unless_asked(fmt: str) -> None:
    load: Callable[[str], Any] = json.loads if fmt == "json" else yaml.safe_load

    def printed(body: dict[str, Any], **options: Any) -> Any:
        out = io.StringIO()
        Output(fmt, out=out, err=io.StringIO(), **options).obj(body)
        return load(out.getvalue())

    assert printed(MANAGED) == {"metadata": {"name": "paint"}, "spec": {}}
    listed = printed({"kind": "List", "items": [MANAGED, MANAGED]})
    assert [item["metadata"] for item in listed["items"]] == [{"name": "paint"}] * 2
    assert printed(MANAGED, managed_fields=True) == MANAGED
    assert MANAGED["metadata"]["managedFields"], "the object itself is left as it was"
    assert parse(["get", "paint", "-o", fmt, "--show-managed-fields"]).show_managed_fields is True


def test_a_rejected_request_points_at_the_report_of_its_namespace() -> None:
    out, err = io.StringIO(), io.StringIO()
    ctx = Context(Cluster(None, NS), Output("table", out=out, err=err), target=Target(NS, context="ops"))  # type: ignore[arg-type]
    record = ControlRecord.model_validate(
        {
            "idempotencyKey": "k-1",
            "op": "Retry",
            "digest": "sha256:" + "0" * 64,
            "outcome": "Rejected",
            "reason": "UnresolvedSideEffects",
            "message": "resolve the side effects whose outcome is unknown first (sfx-t)",
            "time": ts(1),
        }
    )
    assert show_outcome(ctx, "paint", record, {}) == 1
    assert out.getvalue() == (
        "run paint: Retry k-1: Rejected, UnresolvedSideEffects: resolve the side effects whose outcome is "
        "unknown first (sfx-t)\n"
    )
    assert err.getvalue() == (
        "what the Run waits for, and the ways out: kubectl agentrun report paint -n team-a --context ops\n"
    )
