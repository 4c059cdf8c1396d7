"""The agentrun.dev API on a real API server: the generated CRDs install, every example applies, the
server fills in the defaults, teaches the API through `kubectl explain` and `kubectl get`, and accepts
the legal moves of the state its rules guard (the refusals are in test_api_corpus.py)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrun.api import (
    SIDE_EFFECT_TRANSITIONS,
    LeaseSpec,
    RetryPolicy,
    Run,
    RunSpec,
    SideEffectState,
    is_allowed_transition,
)
from support.agentrun import CRD_NAMES, Api, rule
from support.corpus import CRD_DIR, PATCH_EXAMPLES, RUN_EXAMPLES, load_yaml, valid_object
from support.kube import PERSON, Kube

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("agentrun_crds")]


@pytest.fixture(scope="module")
def api(kube: Kube, module_namespace: str) -> Api:
    return Api(kube, module_namespace)


@pytest.fixture(scope="module")
def person(kube: Kube, module_namespace: str) -> Api:
    """The API as the person alice: a field that names a person names the user who writes it."""
    return Api(kube.impersonating(PERSON), module_namespace)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def words(text: str) -> str:
    """Text with every run of whitespace made one space (kubectl wraps descriptions)."""
    return " ".join(text.split())


# --- installation -------------------------------------------------------------------------------------


def test_the_four_crds_are_established_in_the_agentrun_category(kube: Kube) -> None:
    for name in CRD_NAMES:
        crd = kube.extensions.read_custom_resource_definition(name)
        conditions = {c.type: c.status for c in crd.status.conditions}
        assert conditions["Established"] == "True", name
        assert crd.spec.names.categories == ["agentrun"]
        assert crd.spec.scope == "Namespaced"
        assert crd.spec.versions[0].subresources.status == {}


def test_installing_the_crds_again_changes_nothing(kube: Kube) -> None:
    before = {
        name: kube.extensions.read_custom_resource_definition(name).metadata.generation for name in CRD_NAMES
    }
    out = kube.kubectl(
        "apply", "--server-side", "--force-conflicts", "--field-manager=agentrun-tests", "-f", str(CRD_DIR)
    )
    assert out.stdout.count("serverside-applied") == 4
    after = {
        name: kube.extensions.read_custom_resource_definition(name).metadata.generation for name in CRD_NAMES
    }
    assert after == before


# --- examples -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", RUN_EXAMPLES, ids=lambda path: path.name)
def test_run_example_applies_as_written(kube: Kube, module_namespace: str, example: Path) -> None:
    created = kube.kubectl("apply", "-f", str(example), namespace=module_namespace)
    name = load_yaml(example)["metadata"]["name"]
    assert created.stdout.strip() == f"run.agentrun.dev/{name} created"

    stored = kube.get("run", name, module_namespace)
    assert stored is not None
    # What the server stored, with its defaults, is what the models make of the file.
    assert (
        Run.model_validate(stored).to_api()["spec"] == Run.model_validate(load_yaml(example)).to_api()["spec"]
    )
    again = kube.kubectl("apply", "-f", str(example), namespace=module_namespace)
    assert again.stdout.strip() == f"run.agentrun.dev/{name} unchanged"


def status_before(patch: Path) -> dict[str, Any]:
    """The Run status (as the operator would write it) in which a control patch makes sense."""
    spec = load_yaml(patch)["spec"]
    if "resume" in spec:  # the Run waits for exactly the request the example answers
        resume = spec["resume"]
        pending = {
            "requestId": resume["requestId"],
            "checkpointId": resume["checkpointId"],
            "reason": "input_required",
            "prompt": "Approve the plan?",
            "acceptedSchema": {"type": "object", "required": ["approved"]},
        }
        return {
            "phase": "InputRequired",
            "latestCheckpoint": resume["checkpointId"],
            "pendingRequest": pending,
        }
    if "retryRequest" in spec:
        return {"phase": "Failed", "failure": {"class": "transient", "reason": "RetriesExhausted"}}
    if "compensateRequest" in spec:  # compensation is asked of a Run that has ended
        return {"phase": "Succeeded", "currentAttempt": 1, "attempts": 1, "leaseEpoch": 1}
    return {"phase": "Running", "currentAttempt": 1, "attempts": 1, "leaseEpoch": 1}


@pytest.mark.parametrize("patch", PATCH_EXAMPLES, ids=lambda path: path.name)
def test_control_patch_example_applies_to_a_run_in_a_suitable_state(
    kube: Kube, api: Api, module_namespace: str, patch: Path
) -> None:
    name = unique("control")
    api.create(valid_object("Run", name))
    api.patch_status("Run", name, status_before(patch))

    out = kube.kubectl(
        "patch", "run", name, "--type", "merge", "--patch-file", str(patch), namespace=module_namespace
    )
    assert out.stdout.strip() == f"run.agentrun.dev/{name} patched"
    stored = api.get("Run", name)
    assert stored is not None
    for field, value in load_yaml(patch)["spec"].items():
        assert stored["spec"][field] == value
    assert stored["status"] == status_before(patch)  # a spec patch leaves the status alone

    # The documented promise of every control patch: sending it again is harmless.
    again = kube.kubectl(
        "patch", "run", name, "--type", "merge", "--patch-file", str(patch), namespace=module_namespace
    )
    assert again.stdout.strip() == f"run.agentrun.dev/{name} patched (no change)"
    assert api.get("Run", name) == stored


def test_kubectl_prints_the_rule_message_when_a_cancel_goes_backwards(
    kube: Kube, api: Api, module_namespace: str
) -> None:
    name = unique("cancelled")
    api.create(valid_object("Run", name))
    cancel = str(next(path for path in PATCH_EXAMPLES if path.name == "cancel.patch.yaml"))
    kube.kubectl("patch", "run", name, "--type", "merge", "--patch-file", cancel, namespace=module_namespace)

    back = kube.kubectl(
        "patch",
        "run",
        name,
        "--type",
        "merge",
        "-p",
        '{"spec":{"cancelEpoch":0}}',
        namespace=module_namespace,
        check=False,
    )
    assert back.returncode != 0
    assert f'The Run "{name}" is invalid' in back.stderr
    assert rule("Run", ".spec.cancelEpoch").message in words(back.stderr)
    stored = api.get("Run", name)
    assert stored is not None
    assert stored["spec"]["cancelEpoch"] == 1


# --- defaults -----------------------------------------------------------------------------------------


def test_a_minimal_run_is_stored_with_the_server_side_defaults(api: Api) -> None:
    name = unique("minimal")
    stored = api.create(valid_object("Run", name))
    spec = stored["spec"]
    assert spec["lease"] == {"durationSeconds": 100, "renewSeconds": 60}
    assert spec["retry"]["maxAttempts"] == 3
    assert spec["retry"]["backoff"] == {"initialSeconds": 5, "factor": 2, "maxSeconds": 300}
    assert spec["retry"]["retryOn"] == ["transient", "rate_limited", "infrastructure", "lease_lost"]
    assert spec["retry"]["sameErrorLimit"] == 2
    assert spec["cancelEpoch"] == 0
    assert spec["checkpointRetention"] == 20
    assert "deadlineSeconds" not in spec
    assert "status" not in stored  # nothing is claimed about a Run the operator has not seen yet
    # The same defaults as the models: the server and the operator never disagree about a Run.
    assert spec == Run.model_validate(valid_object("Run", name)).to_api()["spec"]
    assert api.get("Run", name) == stored


def test_a_partial_lease_is_completed_with_the_other_default(api: Api) -> None:
    name = unique("partial")
    run = valid_object(
        "Run", name, {".spec.lease": {"durationSeconds": 300}, ".spec.retry": {"maxAttempts": 7}}
    )
    stored = api.create(run)
    assert stored["spec"]["lease"] == {"durationSeconds": 300, "renewSeconds": 60}
    assert stored["spec"]["retry"]["maxAttempts"] == 7
    assert stored["spec"]["retry"]["sameErrorLimit"] == 2


# --- kubectl explain ----------------------------------------------------------------------------------


def test_kubectl_explain_teaches_the_retry_policy(kube: Kube) -> None:
    out = words(kube.kubectl("explain", "runs.spec.retry").stdout)
    assert "FIELD: retry <Object>" in out
    assert words(RunSpec.model_fields["retry"].description or "") in out
    for name, field in RetryPolicy.model_fields.items():
        assert field.alias, name
        assert f"{field.alias} <" in out
        assert words(field.description or "") in out, field.alias
    assert "The most Attempts the Run makes, the first one included, before it fails." in out


def test_kubectl_explain_describes_the_lease_duration(kube: Kube) -> None:
    out = words(kube.kubectl("explain", "runs.spec.lease.durationSeconds").stdout)
    assert "FIELD: durationSeconds <integer>" in out
    assert words(LeaseSpec.model_fields["duration_seconds"].description or "") in out
    assert "Seconds the lease stays valid after its last renewal." in out


def test_kubectl_explain_reaches_every_kind_by_its_short_name(kube: Kube) -> None:
    for short_name, kind in [
        ("arun", "Run"),
        ("att", "Attempt"),
        ("ckpt", "Checkpoint"),
        ("sfx", "SideEffect"),
    ]:
        out = words(kube.kubectl("explain", short_name).stdout)
        assert f"KIND: {kind}" in out
        assert "DESCRIPTION:" in out
        assert "spec <Object> -required-" in out


# --- kubectl get --------------------------------------------------------------------------------------

SHOWN: dict[str, tuple[dict[str, Any], dict[str, Any] | None, dict[str, str]]] = {
    # kind: (object changes, status, the row `kubectl get` prints under each column)
    "Run": (
        {},
        {
            "phase": "InputRequired",
            "message": "waiting for approval of the plan",
            "currentAttempt": 2,
            "attempts": 2,
            "leaseEpoch": 3,
            "pendingRequest": {
                "requestId": "req-approve-plan",
                "reason": "input_required",
                "checkpointId": "c-2",
            },
        },
        {
            "PHASE": "InputRequired",
            "ATTEMPT": "2",
            "LEASE EPOCH": "3",
            "CANCEL EPOCH": "0",
            "WAITING FOR": "req-approve-plan",
            "HELD BY": "",
        },
    ),
    "Attempt": (
        {".metadata.name": "echo-a2", ".spec.number": 2, ".spec.reason": "retry:transient"},
        {"phase": "Running", "podName": "echo-a2"},
        {"RUN": "echo", "NUMBER": "2", "PHASE": "Running", "REASON": "retry:transient", "POD": "echo-a2"},
    ),
    "SideEffect": (
        {},
        {"state": "Confirmed", "externalReference": "TICKET-42"},
        {"RUN": "echo", "TOOL": "create_ticket", "STATE": "Confirmed", "EXTERNAL REFERENCE": "TICKET-42"},
    ),
    "Checkpoint": (
        {".spec.step": "plan"},
        None,
        {"RUN": "echo", "SEQUENCE": "1", "STEP": "plan", "KIND": "State"},
    ),
}
COLUMNS = {
    "Run": ["NAME", "PHASE", "ATTEMPT", "LEASE EPOCH", "CANCEL EPOCH", "WAITING FOR", "HELD BY", "AGE"],
    "Attempt": ["NAME", "RUN", "NUMBER", "PHASE", "REASON", "POD", "AGE"],
    "SideEffect": ["NAME", "RUN", "TOOL", "STATE", "EXTERNAL REFERENCE", "AGE"],
    "Checkpoint": ["NAME", "RUN", "SEQUENCE", "STEP", "KIND", "AGE"],
}


@pytest.fixture(scope="module")
def one_of_each(kube: Kube) -> Iterator[tuple[str, dict[str, str]]]:
    """A namespace of its own holding one object of each kind, with a status; yields it and the names."""
    namespace = unique("t-get")
    kube.core.create_namespace({"metadata": {"name": namespace, "labels": {"agentrun.dev/test": "true"}}})
    api = Api(kube, namespace)
    names: dict[str, str] = {}
    for kind, (changes, status, _) in SHOWN.items():
        obj = api.create(valid_object(kind, changes=changes))
        names[kind] = obj["metadata"]["name"]
        if status is not None:
            api.patch_status(kind, names[kind], status)
    yield namespace, names
    kube.core.delete_namespace(namespace)


def table(output: str) -> list[dict[str, str]]:
    """The rows of a `kubectl get` table, as column header -> cell (columns are left-aligned)."""
    header, *lines = output.rstrip("\n").split("\n")
    starts = [match.start() for match in re.finditer(r"(?:^|(?<=\s{2}))\S+(?: \S+)*", header)]
    names = [header[start:end].strip() for start, end in zip(starts, [*starts[1:], None], strict=True)]
    return [
        {
            name: line[start:end].strip()
            for name, start, end in zip(names, starts, [*starts[1:], None], strict=True)
        }
        for line in lines
    ]


def test_kubectl_get_agentrun_lists_all_four_kinds(
    kube: Kube, one_of_each: tuple[str, dict[str, str]]
) -> None:
    namespace, names = one_of_each
    out = kube.kubectl("get", "agentrun", "-o", "name", namespace=namespace).stdout.split()
    assert sorted(out) == sorted(f"{kind.lower()}.agentrun.dev/{name}" for kind, name in names.items())
    by_short_name = kube.kubectl("get", "arun,att,ckpt,sfx", "-o", "name", namespace=namespace).stdout.split()
    assert sorted(by_short_name) == sorted(out)
    # the default output: one table per kind, each with the printer columns of its kind
    tables = kube.kubectl("get", "agentrun", namespace=namespace).stdout.strip().split("\n\n")
    headers = sorted(list(table(text)[0]) for text in tables)
    assert headers == sorted(COLUMNS.values())


@pytest.mark.parametrize("kind", list(SHOWN))
def test_kubectl_get_shows_the_printer_columns(
    kube: Kube, one_of_each: tuple[str, dict[str, str]], kind: str
) -> None:
    namespace, names = one_of_each
    out = kube.kubectl("get", kind.lower(), names[kind], namespace=namespace).stdout
    (row,) = table(out)
    assert list(row) == COLUMNS[kind]
    assert row["NAME"] == names[kind]
    assert {column: row[column] for column in SHOWN[kind][2]} == SHOWN[kind][2]
    assert re.fullmatch(r"[0-9]+[smhdy][0-9smhdy]*", row["AGE"])


def test_kubectl_get_wide_adds_the_run_message(kube: Kube, one_of_each: tuple[str, dict[str, str]]) -> None:
    namespace, _ = one_of_each
    (row,) = table(kube.kubectl("get", "runs", "-o", "wide", namespace=namespace).stdout)
    assert row["MESSAGE"] == "waiting for approval of the plan"
    assert row["PHASE"] == "InputRequired"


# --- the legal moves are accepted ---------------------------------------------------------------------

WAY_TO: dict[SideEffectState, list[SideEffectState]] = {
    SideEffectState.PENDING: [SideEffectState.PENDING],
    SideEffectState.CONFIRMED: [SideEffectState.PENDING, SideEffectState.CONFIRMED],
    SideEffectState.FAILED: [SideEffectState.PENDING, SideEffectState.FAILED],
    SideEffectState.UNKNOWN: [SideEffectState.PENDING, SideEffectState.UNKNOWN],
    SideEffectState.COMPENSATED: [
        SideEffectState.PENDING,
        SideEffectState.CONFIRMED,
        SideEffectState.COMPENSATED,
    ],
}
TRANSITIONS = [(old, new) for old in SideEffectState for new in SideEffectState]


@pytest.mark.parametrize(
    ("old", "new"),
    TRANSITIONS,
    ids=[
        f"{old} to {new} is {'accepted' if is_allowed_transition(old, new) else 'refused'}"
        for old, new in TRANSITIONS
    ],
)
def test_the_side_effect_ledger_enforces_the_transition_table(
    person: Api, old: SideEffectState, new: SideEffectState
) -> None:
    api = person
    assert set(SIDE_EFFECT_TRANSITIONS) == set(WAY_TO)
    name = unique("sfx")
    api.create(valid_object("SideEffect", name))
    for state in WAY_TO[old]:
        api.patch_status("SideEffect", name, {"state": state})
    before = api.get("SideEffect", name)
    # leaving Unknown takes a resolver; that rule has its own cases in the corpus
    status = {"state": new, "resolvedBy": PERSON} if old == SideEffectState.UNKNOWN else {"state": new}
    if (old, new) == (SideEffectState.FAILED, SideEffectState.PENDING):
        # The table allows it only after a person's resolution Absent (the rule on the status says so);
        # its own cases follow below.
        message = api.refusal(lambda: api.patch_status("SideEffect", name, status))
        assert rule("SideEffect", ".status", "resolvedSends").message in message
        assert api.get("SideEffect", name) == before
    elif is_allowed_transition(old, new):
        assert api.patch_status("SideEffect", name, status)["status"]["state"] == new
    else:
        message = api.refusal(lambda: api.patch_status("SideEffect", name, status))
        assert rule("SideEffect", ".status.state").message in message
        assert api.get("SideEffect", name) == before


# A spentKeys digest (sha256:<32 hex>) or a controls digest (sha256:<64 hex>), as the operator writes them.
SOME_DIGEST = "sha256:" + "0" * 32
SOME_FULL_DIGEST = "sha256:" + "0" * 64
SEND = {"sendId": "op-1-s1", "attempt": "echo-a1", "time": "2026-01-01T00:00:00Z", "outcome": "Unknown"}


@pytest.mark.parametrize(
    ("resolution", "sends_after", "accepted"),
    [
        ({"resolution": "Absent", "resolvedBy": "alice", "resolvedSends": 1}, 0, True),
        ({"resolution": "Absent", "resolvedBy": "alice", "resolvedSends": 1}, 1, False),
        ({"resolution": "Absent", "resolvedBy": "alice"}, 0, False),
        ({"resolution": "Failed", "resolvedBy": "alice", "resolvedSends": 1}, 0, False),
    ],
    ids=["absent: sent afresh", "absent, sent since", "absent without its count", "failed for good"],
)
def test_a_failed_side_effect_is_sent_again_only_after_a_resolution_absent(
    person: Api, resolution: dict[str, Any], sends_after: int, accepted: bool
) -> None:
    api = person
    name = unique("sfx")
    api.create(valid_object("SideEffect", name))
    api.patch_status("SideEffect", name, {"state": "Pending", "sends": [SEND]})
    api.patch_status("SideEffect", name, {"state": "Unknown"})
    api.patch_status("SideEffect", name, {"state": "Failed", **resolution})
    if sends_after:
        api.patch_status("SideEffect", name, {"sends": [SEND, {**SEND, "sendId": "op-1-s2"}]})
    again = {"state": "Pending"}
    if accepted:
        assert api.patch_status("SideEffect", name, again)["status"]["state"] == "Pending"
    else:
        message = api.refusal(lambda: api.patch_status("SideEffect", name, again))
        assert rule("SideEffect", ".status", "resolvedSends").message in message


def test_a_resolution_names_who_made_it(api: Api) -> None:
    name = unique("sfx")
    api.create(valid_object("SideEffect", name))
    api.patch_status("SideEffect", name, {"state": "Pending"})
    message = api.refusal(
        lambda: api.patch_status("SideEffect", name, {"state": "Failed", "resolution": "Absent"})
    )
    assert rule("SideEffect", ".status", "has(self.resolution)").message in message


def test_a_side_effect_goes_unknown_then_resolved_then_compensated(person: Api) -> None:
    api = person
    name = unique("sfx")
    api.create(valid_object("SideEffect", name))
    api.patch_status("SideEffect", name, {"state": "Pending", "attempt": "echo-a1", "leaseEpoch": 1})
    api.patch_status("SideEffect", name, {"state": "Unknown"})
    api.patch_status(
        "SideEffect", name, {"state": "Confirmed", "resolvedBy": "alice", "externalReference": "T-1"}
    )
    done = api.patch_status("SideEffect", name, {"state": "Compensated"})
    assert done["status"] == {
        "state": "Compensated",
        "attempt": "echo-a1",
        "leaseEpoch": 1,
        "resolvedBy": "alice",
        "externalReference": "T-1",
    }


@pytest.mark.parametrize(
    "phases",
    [
        ["Pending", "Running", "Succeeded"],
        ["Running", "Failed", "Rejected"],
        ["Running", "Interrupted", "Rejected"],
        ["Running", "LeaseLost", "LeaseLost"],
        ["Pending", "Aborted"],
    ],
    ids=" then ".join,
)
def test_an_attempt_moves_forward_through_its_phases(api: Api, phases: list[str]) -> None:
    name = unique("att")
    api.create(valid_object("Attempt", name))
    for phase in phases:
        assert api.patch_status("Attempt", name, {"phase": phase})["status"]["phase"] == phase


def test_a_result_committed_under_the_current_epochs_is_accepted_and_stays(api: Api) -> None:
    name = unique("commit")
    api.create(valid_object("Run", name))
    api.patch_status("Run", name, {"phase": "Running", "leaseEpoch": 2})
    committed_by = {"attempt": f"{name}-a2", "leaseEpoch": 2, "cancelEpoch": 0}
    committed = api.patch_status("Run", name, {"result": {"ticket": "T-1"}, "committedBy": committed_by})
    assert committed["status"]["result"] == {"ticket": "T-1"}

    # The result stays valid while the epochs move on (a cancel arriving after the commit).
    api.patch("Run", name, {"spec": {"cancelEpoch": 1}})
    api.patch_status("Run", name, {"leaseEpoch": 3, "observedCancelEpoch": 1})
    final = api.patch_status("Run", name, {"phase": "Succeeded"})
    assert final["status"]["result"] == {"ticket": "T-1"}
    assert final["status"]["committedBy"] == committed_by


def test_repeating_a_control_request_is_harmless_and_a_new_key_is_a_new_request(api: Api) -> None:
    name = unique("repeat")
    resume = {"requestId": "r1", "checkpointId": "c1", "value": {"approved": True}, "idempotencyKey": "k1"}
    retry = {"idempotencyKey": "retry-1", "reason": "fixed"}
    pause = {"requestId": "pause-1", "reason": "maintenance"}
    api.create(
        valid_object("Run", name, {".spec.resume": resume, ".spec.retryRequest": retry, ".spec.pause": pause})
    )
    same = api.patch("Run", name, {"spec": {"resume": resume, "retryRequest": retry, "pause": pause}})
    assert same["metadata"]["generation"] == 1
    # the operator processed the answer (its key is spent): another answer may replace it now
    api.patch_status("Run", name, {"spentKeys": [{"key": "k1", "op": "Resume", "digest": SOME_DIGEST}]})
    changed = api.patch(
        "Run",
        name,
        {
            "spec": {
                "resume": {"requestId": "r2", "value": False, "idempotencyKey": "k2"},
                "retryRequest": {"idempotencyKey": "retry-2", "fromCheckpoint": "c1"},
                "pause": {"requestId": "pause-2", "reason": "another window"},
            }
        },
    )
    assert changed["spec"]["resume"]["value"] is False
    assert changed["spec"]["retryRequest"] == {
        "idempotencyKey": "retry-2",
        "fromCheckpoint": "c1",
        "reason": "fixed",
    }
    assert changed["metadata"]["generation"] == 2


def test_cancel_epoch_grows_while_the_run_has_not_ended(api: Api) -> None:
    name = unique("grows")
    api.create(valid_object("Run", name))
    assert api.patch("Run", name, {"spec": {"cancelEpoch": 1}})["spec"]["cancelEpoch"] == 1
    assert api.patch("Run", name, {"spec": {"cancelEpoch": 5}})["spec"]["cancelEpoch"] == 5
    api.patch_status(
        "Run", name, {"phase": "Failed"}
    )  # a Failed Run has not ended for good: it can be retried
    assert api.patch("Run", name, {"spec": {"cancelEpoch": 6}})["spec"]["cancelEpoch"] == 6


def test_immutable_objects_still_take_labels_and_can_be_deleted(api: Api) -> None:
    for kind in ("Checkpoint", "Attempt", "SideEffect"):
        name = unique(kind.lower())
        api.create(valid_object(kind, name))
        labelled = api.patch(kind, name, {"metadata": {"labels": {"agentrun.dev/run": "echo"}}})
        assert labelled["metadata"]["labels"] == {"agentrun.dev/run": "echo"}
        api.kube.kubectl("delete", kind.lower(), name, namespace=api.namespace)
        assert api.get(kind, name) is None


def _spent_as_a_key(key: str) -> dict[str, Any]:
    return {"spentKeys": [{"key": key, "op": "Resume", "digest": SOME_DIGEST}]}


def _spent_as_a_record(key: str) -> dict[str, Any]:
    record = {
        "idempotencyKey": key,
        "op": "Resume",
        "digest": SOME_FULL_DIGEST,
        "outcome": "Rejected",
        "reason": "NotWaiting",
        "time": "2026-01-01T00:00:00Z",
    }
    return {"controls": [record]}


@pytest.mark.parametrize(
    ("key", "spent"),
    [("alice-1", _spent_as_a_key), ("alice-" + "x" * 60, _spent_as_a_record)],
    ids=["a short key, remembered in spentKeys", "a long key, found in controls"],
)
def test_an_answer_is_replaced_only_once_the_operator_processed_it(
    api: Api, key: str, spent: Callable[[str], dict[str, Any]]
) -> None:
    name = unique("answer")
    first = {"requestId": "r1", "checkpointId": "c1", "value": {"priority": "high"}, "idempotencyKey": key}
    second = {**first, "value": {"priority": "low"}, "idempotencyKey": "bob-1"}
    api.create(valid_object("Run", name, {".spec.resume": first}))

    # a second person answering before the operator saw the first answer is refused, and told why
    message = api.refusal(lambda: api.patch("Run", name, {"spec": {"resume": second}}))
    assert f"spec.resume holds an answer to r1 (idempotencyKey {key}) that the operator has not" in message
    assert f"read the Run again (kubectl agentrun describe {name})" in message
    assert "has not processed yet" in api.refusal(lambda: api.patch("Run", name, {"spec": {"resume": None}}))
    assert api.patch("Run", name, {"spec": {"resume": first}})["spec"]["resume"] == first, "a repeat is fine"

    api.patch_status("Run", name, spent(key))  # the operator processed it
    assert api.patch("Run", name, {"spec": {"resume": second}})["spec"]["resume"] == second
