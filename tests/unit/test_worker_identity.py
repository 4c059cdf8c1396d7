"""What the worker knows from its Pod alone (the downward API), and so need not read."""

from __future__ import annotations

import asyncio

import pytest

from agentrun.kubeapi import KubeApi
from agentrun.worker.identity import Identity
from agentrun.worker.session import Session

POD_ENV = {
    "AGENTRUN_RUN": "triage",
    "AGENTRUN_NAMESPACE": "team",
    "AGENTRUN_ATTEMPT": "triage-a3",
    "AGENTRUN_LEASE_EPOCH": "4",
    "AGENTRUN_CANCEL_EPOCH": "1",
    "AGENTRUN_RESUME_FROM": "triage-a2-s1",
    "AGENTRUN_ATTEMPT_REASON": "retry:transient",
    "AGENTRUN_ATTEMPT_INPUT": "",
    "AGENTRUN_LEASE_RESOURCE_VERSION": "812",
}


def test_the_pod_annotations_become_the_identity() -> None:
    me = Identity.from_env(POD_ENV)
    assert (me.run, me.namespace, me.attempt, me.lease_epoch, me.cancel_epoch) == (
        "triage",
        "team",
        "triage-a3",
        4,
        1,
    )
    assert (me.resume_from, me.attempt_reason, me.attempt_input, me.lease_resource_version) == (
        "triage-a2-s1",
        "retry:transient",
        False,
        "812",
    )


def test_a_pod_of_an_older_operator_has_none_of_the_newer_values() -> None:
    """The downward API gives "" for an annotation the Pod lacks: the SDK then reads what it needs."""
    old = {**POD_ENV, "AGENTRUN_ATTEMPT_REASON": "", "AGENTRUN_LEASE_RESOURCE_VERSION": ""}
    me = Identity.from_env(old)
    assert (me.attempt_reason, me.attempt_input, me.lease_resource_version) == (None, False, None)


def test_the_attempt_comes_from_the_annotations_without_a_read(unreachable_api: KubeApi) -> None:
    session = Session(unreachable_api, Identity.from_env(POD_ENV))
    attempt = asyncio.run(session.read_attempt())
    assert unreachable_api.requests == 0
    assert attempt.metadata.name == "triage-a3"
    spec = attempt.spec
    assert (spec.run_name, spec.number, spec.lease_epoch, spec.cancel_epoch) == ("triage", 3, 4, 1)
    assert (spec.resume_from, spec.reason, spec.input) == ("triage-a2-s1", "retry:transient", None)


@pytest.mark.parametrize(
    "env",
    [{"AGENTRUN_ATTEMPT_INPUT": "true"}, {"AGENTRUN_ATTEMPT_REASON": ""}],
    ids=["carries-an-input-value", "pod-without-the-reason"],
)
def test_the_attempt_is_read_when_the_pod_cannot_say_it_all(
    unreachable_api: KubeApi, env: dict[str, str]
) -> None:
    session = Session(unreachable_api, Identity.from_env({**POD_ENV, **env}))

    async def read() -> None:
        try:
            await session.read_attempt()
        finally:
            await unreachable_api.aclose()

    with pytest.raises(OSError):  # connection refused: it did try to read
        asyncio.run(read())
    assert unreachable_api.requests == 1


def test_the_first_renewal_is_preconditioned_on_the_passed_version(unreachable_api: KubeApi) -> None:
    session = Session(unreachable_api, Identity.from_env(POD_ENV))
    assert session._lease_rv == "812"
