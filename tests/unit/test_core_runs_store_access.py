"""core.runs: every Attempt's Pod is told of the state store (its URL, the namespace's credentials
Secret), whichever rule starts it; without a store, none is."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun.core.plan import CreatePod, ProvisionStoreCredentials
from agentrun.core.pods import AGENT_CONTAINER, StateStorePodEnv
from agentrun.core.runs import World, decide
from unit.factories import events, held_by, kinds, make_run, make_world, of_type, run_patch, run_status
from unit.run_worlds import (
    NOT_STARTED,
    backing_off,
    queued,
    resume,
    retry_spec,
    stopped,
    supervising,
    waiting,
)

STORE = StateStorePodEnv("s3://agentrun/runs?endpoint=http://objects.example:7070", "agentrun-state-store")
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
FILE_STORE = StateStorePodEnv("file:///var/lib/agentrun", "agentrun-state-store")

# Every way an Attempt's Pod comes to be created.
POD_STARTS: dict[str, World] = {
    "first-attempt": make_world(make_run()),
    "queued": queued(),
    "automatic-retry": backing_off(),
    "resume": waiting(spec=resume()),
    "manual-retry": stopped("Failed", spec=retry_spec()),
    "interrupted-grant": make_world(
        make_run(run_status("Running", current=1, lease_epoch=1)), lease=held_by(1)
    ),
    "pod-missing": supervising(pod=None, attempt=NOT_STARTED),
}


def created_pod_env(world: World) -> dict[str, dict[str, Any]]:
    (created,) = of_type(decide(world), CreatePod)
    (container,) = [c for c in created.body["spec"]["containers"] if c["name"] == AGENT_CONTAINER]
    return {e["name"]: e for e in container["env"]}


@pytest.mark.parametrize("world", POD_STARTS.values(), ids=POD_STARTS.keys())
@pytest.mark.parametrize(
    ("store", "told"),
    [
        (None, set()),
        (STORE, {"AGENTRUN_STATE_STORE_URL", *S3_CREDENTIALS}),
        (FILE_STORE, {"AGENTRUN_STATE_STORE_URL"}),
    ],
    ids=["no-store", "s3", "file"],
)
def test_each_attempts_pod_is_told_of_the_store(
    world: World, store: StateStorePodEnv | None, told: set[str]
) -> None:
    env = created_pod_env(replace(world, state_store=store))

    assert {name for name in env if name.startswith(("AGENTRUN_STATE_STORE", "AWS_"))} == told
    if store is not None:
        assert env["AGENTRUN_STATE_STORE_URL"]["value"] == store.url
        for name in told - {"AGENTRUN_STATE_STORE_URL"}:
            assert env[name]["valueFrom"]["secretKeyRef"]["name"] == store.secret


# ---- StateStoreCredentialsMissing -------------------------------------------------------------------------

GS_STORE = StateStorePodEnv("gs://agentrun/runs", "agentrun-state-store")
CREDENTIALS_MISSING = "StateStoreCredentialsMissing"

# (world, the store, whether its namespace has the Secret) -> the Run fails before any Pod, or starts one.
CREDENTIAL_CASES: dict[str, tuple[World, StateStorePodEnv | None, bool, bool]] = {
    "first-attempt-missing": (make_world(make_run()), STORE, True, True),
    "queued-missing": (queued(), STORE, True, True),
    "automatic-retry-missing": (backing_off(), STORE, True, True),
    "manual-retry-missing": (stopped("Failed", spec=retry_spec()), STORE, True, True),
    "resume-missing": (waiting(spec=resume()), STORE, True, True),
    "interrupted-grant-missing": (POD_STARTS["interrupted-grant"], STORE, True, True),
    "first-attempt-found": (make_world(make_run()), STORE, False, False),
    "automatic-retry-found": (backing_off(), STORE, False, False),
    # Nothing to take from a Secret: one machine's directory, or every key optional (workload identity).
    "file-store-needs-none": (make_world(make_run()), FILE_STORE, True, False),
    "gs-store-needs-none": (make_world(make_run()), GS_STORE, True, False),
    "no-store-needs-none": (make_world(make_run()), None, True, False),
}


@pytest.mark.parametrize(
    ("world", "store", "missing", "fails"), CREDENTIAL_CASES.values(), ids=CREDENTIAL_CASES.keys()
)
def test_a_run_fails_before_any_pod_where_its_namespace_has_no_store_credentials(
    world: World, store: StateStorePodEnv | None, missing: bool, fails: bool
) -> None:
    plan = decide(replace(world, state_store=store, store_credentials_missing=missing))

    if not fails:
        assert len(of_type(plan, CreatePod)) == 1
        return
    assert of_type(plan, CreatePod) == []
    assert kinds(plan)[-1] == "PatchRunStatus"  # after the Attempt an interrupted grant promised
    status = run_patch(plan)
    assert status["phase"] == "Failed"
    assert status["failure"]["reason"] == CREDENTIALS_MISSING
    assert status["failure"]["class"] == "deterministic"
    assert ("Warning", CREDENTIALS_MISSING) in events(plan)


def test_the_refusal_says_what_to_create() -> None:
    plan = decide(replace(make_world(make_run()), state_store=STORE, store_credentials_missing=True))

    message = run_patch(plan)["failure"]["message"]
    namespace = make_run().metadata.namespace
    assert (
        f"kubectl create secret generic agentrun-state-store -n {namespace} "
        "--from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=..."
    ) in message
    assert "no delete" in message
    assert "retryRequest" in message


def test_a_retry_once_the_secret_exists_starts_the_run() -> None:
    failed = decide(replace(make_world(make_run()), state_store=STORE, store_credentials_missing=True))
    status = run_patch(failed)
    world = stopped("Failed", spec=retry_spec(), failure=status["failure"])

    plan = decide(replace(world, state_store=STORE, store_credentials_missing=False))

    assert len(of_type(plan, CreatePod)) == 1


@pytest.mark.parametrize(
    ("identity", "reason"),
    [
        ({"account_refusal": "not labelled"}, "ServiceAccountNotAllowed"),
        ({"attempt_role_denied": ("patch runs/status",)}, "AttemptRoleNotBound"),
    ],
    ids=["not-opted-in", "role-not-bound"],
)
def test_who_the_pods_run_as_is_said_before_the_missing_secret(identity: dict[str, Any], reason: str) -> None:
    """A namespace not set up at all: the fix of its ServiceAccount first (with the bundled server, the
    opt-in is what makes the Secret)."""
    world = replace(make_world(make_run()), state_store=STORE, store_credentials_missing=True, **identity)

    assert run_patch(decide(world))["failure"]["reason"] == reason


# ---- with the bundled store, the operator makes the Secret: an action of the table, not of observing ----


@pytest.mark.parametrize(
    ("world", "store", "missing", "fails"), CREDENTIAL_CASES.values(), ids=CREDENTIAL_CASES.keys()
)
def test_where_the_operator_makes_the_secret_it_is_made_first_and_nothing_else_is_written(
    world: World, store: StateStorePodEnv | None, missing: bool, fails: bool
) -> None:
    plan = decide(
        replace(
            world, state_store=store, store_credentials_missing=missing, provisions_store_credentials=True
        )
    )

    if not fails:  # found (or none needed): nothing to make, the Pod starts
        assert of_type(plan, ProvisionStoreCredentials) == []
        assert len(of_type(plan, CreatePod)) == 1
        return
    assert list(plan.actions) == [ProvisionStoreCredentials(str(make_run().metadata.namespace))]
    assert plan.requeue_after == 0  # decided again at once: the grant follows on the Secret made
    assert not plan.needs_fresh_run  # no object of the Run is written


@pytest.mark.parametrize(
    ("world", "store", "missing", "fails"), CREDENTIAL_CASES.values(), ids=CREDENTIAL_CASES.keys()
)
def test_where_the_bundled_store_refused_to_make_it_the_run_fails_as_without_it(
    world: World, store: StateStorePodEnv | None, missing: bool, fails: bool
) -> None:
    refused = replace(
        world,
        state_store=store,
        store_credentials_missing=missing,
        provisions_store_credentials=True,
        store_provisioning_refused=True,
    )
    without = replace(world, state_store=store, store_credentials_missing=missing)

    assert decide(refused) == decide(without)
    assert of_type(decide(refused), ProvisionStoreCredentials) == []


@pytest.mark.parametrize(
    ("identity", "reason"),
    [
        ({"account_refusal": "not labelled"}, "ServiceAccountNotAllowed"),
        ({"attempt_role_denied": ("patch runs/status",)}, "AttemptRoleNotBound"),
    ],
    ids=["not-opted-in", "role-not-bound"],
)
def test_nothing_is_made_for_a_run_whose_pods_may_not_run_as_its_account(
    identity: dict[str, Any], reason: str
) -> None:
    world = replace(
        make_world(make_run()),
        state_store=STORE,
        store_credentials_missing=True,
        provisions_store_credentials=True,
        **identity,
    )

    plan = decide(world)

    assert of_type(plan, ProvisionStoreCredentials) == []
    assert run_patch(plan)["failure"]["reason"] == reason


def test_nothing_is_made_for_a_stopped_run_that_starts_no_pod() -> None:
    world = replace(
        stopped("Failed"),
        state_store=STORE,
        store_credentials_missing=True,
        provisions_store_credentials=True,
    )

    assert of_type(decide(world), ProvisionStoreCredentials) == []
