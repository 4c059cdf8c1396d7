"""How the plugin reports a write the API server refused: the server's words as they are, then, for a
cause a person meets (agentrun.api.causes), one line of what to do. The messages are the policies' and
the CRD's own (agentrun.admission, agentrun.api.run), as the API server wraps them."""

from __future__ import annotations

import pytest

from agentrun.api.causes import RefusalCause
from agentrun.cli.errors import ADVICE, BEYOND_THE_PLUGIN, describe_api_error
from agentrun.kubeapi import ApiError

WHOAMI = "your user name as `kubectl auth whoami` shows it"


def denied(resource: str, name: str, policy: str, said: str) -> str:
    """A ValidatingAdmissionPolicy's refusal, as the API server words it."""
    return (
        f"{resource} \"{name}\" is forbidden: ValidatingAdmissionPolicy '{policy}.agentrun.dev' with binding "
        f"'{policy}.agentrun.dev' denied request: {said}"
    )


CASES = [
    pytest.param(
        "cannot resume run decide",
        403,
        denied(
            "runs.agentrun.dev",
            "decide",
            "run-requests",
            RefusalCause.NOT_NAMED.says(
                f"an answer to an approval names who approves: set spec.resume.answeredBy to bob, {WHOAMI}"
            ),
        ),
        RefusalCause.NOT_NAMED,
        id="resume an approval, the sender unnamed",
    ),
    pytest.param(
        "cannot cancel run decide",
        403,
        denied(
            "runs.agentrun.dev",
            "decide",
            "run-requests",
            RefusalCause.NOT_THE_SENDER.says(
                "spec.cancelRequest.requestedBy names carol but this request comes from dave: set "
                f"spec.cancelRequest.requestedBy to dave, {WHOAMI} (a bot acts for a person by "
                "impersonating them)"
            ),
        ),
        RefusalCause.NOT_THE_SENDER,
        id="cancel, another sender named",
    ),
    pytest.param(
        "cannot retry run decide",
        403,
        denied(
            "runs.agentrun.dev",
            "decide",
            "run-requests",
            RefusalCause.NOT_THE_SENDER.says(
                "spec.retryRequest.requestedBy names erin but this request comes from dave: set "
                f"spec.retryRequest.requestedBy to dave, {WHOAMI} (a bot acts for a person by "
                "impersonating them)"
            ),
        ),
        RefusalCause.NOT_THE_SENDER,
        id="retry, another sender named",
    ),
    pytest.param(
        "cannot resolve side effect sfx-1",
        403,
        denied(
            "sideeffects.agentrun.dev",
            "sfx-1",
            "sideeffects-decisions",
            RefusalCause.NOT_NAMED.says(
                f"a resolution names who made it: set status.resolvedBy to erin, {WHOAMI}"
            ),
        ),
        RefusalCause.NOT_NAMED,
        id="resolve-effect, the resolver unnamed",
    ),
    pytest.param(
        "cannot resolve side effect sfx-1",
        403,
        denied(
            "sideeffects.agentrun.dev",
            "sfx-1",
            "sideeffects-status",
            RefusalCause.NOT_POD_BOUND.says(
                "SideEffect status is written by the agentrun operator or by an attempt Pod; "
                "system:serviceaccount:team-a:ci presented a token that is not bound to a Pod"
            ),
        ),
        RefusalCause.NOT_POD_BOUND,
        id="resolve-effect with a ServiceAccount's token",
    ),
    pytest.param(
        "cannot resolve side effect sfx-1",
        403,
        denied(
            "sideeffects.agentrun.dev",
            "sfx-1",
            "sideeffects-status",
            RefusalCause.NOT_OWN_RUN.says(
                "Pod ci-runner-5f7c9 is not an Attempt of Run decide: it may not write its SideEffects"
            ),
        ),
        RefusalCause.NOT_OWN_RUN,
        id="resolve-effect from a Pod of another workload",
    ),
    pytest.param(
        "cannot pause run decide",
        403,
        denied(
            "runs.agentrun.dev",
            "decide",
            "operator-records",
            RefusalCause.NOT_OPERATOR_FIELD.says(
                "the agentrun operator changes only metadata.managedFields of runs decide"
            ),
        ),
        RefusalCause.NOT_OPERATOR_FIELD,
        id="pause with the operator's credentials",
    ),
    pytest.param(
        "cannot cancel run done",
        422,
        'Run.agentrun.dev "done" is invalid: spec.cancelEpoch: Invalid value: "integer": '
        "cannot change once the Run is Succeeded or Cancelled",
        None,
        id="a CRD rule without a cause",
    ),
    pytest.param(
        "cannot resume run decide",
        403,
        denied(
            "runs.agentrun.dev",
            "decide",
            "run-status",
            RefusalCause.STALE_WORKER.says("Run decide is InputRequired: its Attempt writes nothing now"),
        ),
        None,
        id="a worker's fence",
    ),
    pytest.param(
        "cannot retry run decide",
        403,
        'runs.agentrun.dev "decide" is forbidden: User "bob" cannot patch resource "runs" in API group '
        '"agentrun.dev" in the namespace "team-a"',
        None,
        id="RBAC",
    ),
]


@pytest.mark.parametrize(("doing", "status", "message", "cause"), CASES)
def test_a_refusal_says_the_servers_words_then_what_to_do_about_its_cause(
    doing: str, status: int, message: str, cause: RefusalCause | None
) -> None:
    kind = "forbidden" if status == 403 else "invalid"
    said = describe_api_error(ApiError(status, "Forbidden" if status == 403 else "Invalid", message), doing)
    expected = [f"{doing}: {kind}: {message}"]
    if cause is not None:
        expected.append(f"what to do: {ADVICE[cause]}")
    assert said.split("\n") == expected


def test_every_cause_is_advised_or_beyond_what_the_plugin_writes() -> None:
    """A new cause is placed on purpose: advised, or said to be beyond every write of the plugin."""
    assert set(ADVICE) | BEYOND_THE_PLUGIN == set(RefusalCause)
    assert not set(ADVICE) & BEYOND_THE_PLUGIN


@pytest.mark.parametrize("cause", list(ADVICE))
def test_the_advice_is_one_short_line(cause: RefusalCause) -> None:
    assert "\n" not in ADVICE[cause] and len(f"what to do: {ADVICE[cause]}") <= 120
