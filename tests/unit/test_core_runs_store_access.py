"""core.runs: every Attempt's Pod is told of the state store (its URL, the namespace's credentials
Secret), whichever rule starts it; without a store, none is."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun.core.plan import CreatePod
from agentrun.core.pods import AGENT_CONTAINER, StateStorePodEnv
from agentrun.core.runs import World, decide
from unit.factories import held_by, make_run, make_world, of_type, run_status
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
