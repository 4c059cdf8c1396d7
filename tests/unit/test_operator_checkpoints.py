"""A step does not wake the operator: a Checkpoint's watch events keep the cache current and queue no
reconcile (agentrun.operator.informers.QUIET); a decision that needs a Checkpoint the cache does not hold
yet reads it (agentrun.operator.reconciler); the operator's own deletions leave the cache at once."""

from __future__ import annotations

import asyncio
from typing import Any

from agentrun.api import Checkpoint
from agentrun.core import retention
from agentrun.core.plan import DeleteCheckpoint, Plan
from agentrun.kubeapi import KubeApi
from agentrun.kubewatch import Event, Listed
from agentrun.operator.cache import AgentAccounts, Key, OwnedObjects
from agentrun.operator.informers import Informers
from agentrun.operator.metrics import OperatorMetrics
from agentrun.operator.runtime import Runtime
from agentrun.operator.settings import OperatorSettings
from agentrun.tracing import Tracing
from support.clock import FakeClock
from unit.factories import NAMESPACE, RUN, RUN_UID, make_attempt, make_run, name_of

JsonDict = dict[str, Any]
KEY: Key = (NAMESPACE, RUN)


def checkpoint(name: str, sequence: int, rv: str, *, kind: str = "State", **spec: Any) -> JsonDict:
    """A Checkpoint as the API server serves it: labelled for the Run, owned by it, named by its id."""
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Checkpoint",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "resourceVersion": rv,
            "uid": f"uid-{name}",
            "labels": {"agentrun.dev/run": RUN},
            "ownerReferences": [
                {"apiVersion": "agentrun.dev/v1alpha1", "kind": "Run", "name": RUN, "uid": RUN_UID}
            ],
        },
        "spec": {
            "runName": RUN,
            "id": name,
            "sequence": sequence,
            "attempt": name_of(1),
            "leaseEpoch": 1,
            "kind": kind,
            "state": {"step": sequence},
            **spec,
        },
    }


def attempt_body(rv: str) -> JsonDict:
    body = make_attempt(1, phase="Running").to_api()
    body["metadata"].update(resourceVersion=rv, labels={"agentrun.dev/run": RUN})
    return body


class Watching:
    """Informers fed by hand (no API server): what they woke and what they reported delivered."""

    def __init__(self) -> None:
        self.cache = OwnedObjects(FakeClock())
        self.woken: list[Key] = []
        self.delivered: list[tuple[str, bool]] = []
        self.informers = Informers(
            None,  # type: ignore[arg-type]
            self.cache,
            AgentAccounts(),
            [NAMESPACE],
            wake=self.woken.append,
            delivered=lambda kind, woke: self.delivered.append((kind, woke)),
        )

    def event(self, kind: str, type_: str, obj: JsonDict) -> None:
        self.informers._changed(kind, Event(type_, obj))


def test_a_checkpoint_event_keeps_the_cache_current_and_wakes_no_run() -> None:
    watching = Watching()
    for sequence in range(1, 4):
        watching.event("checkpoints", "ADDED", checkpoint(f"c{sequence}", sequence, str(10 + sequence)))

    assert sorted(c["metadata"]["name"] for c in watching.cache.of("checkpoints", KEY)) == ["c1", "c2", "c3"]
    assert watching.woken == []
    assert watching.delivered == [("checkpoints", False)] * 3

    watching.event("checkpoints", "DELETED", checkpoint("c1", 1, "20"))
    assert sorted(c["metadata"]["name"] for c in watching.cache.of("checkpoints", KEY)) == ["c2", "c3"]
    assert watching.woken == []

    # Another kind the Run owns still wakes it, and says so.
    watching.event("attempts", "ADDED", attempt_body("30"))
    assert watching.woken == [KEY]
    assert watching.delivered[-1] == ("attempts", True)


def test_a_relist_of_checkpoints_wakes_no_run_a_relist_of_attempts_does() -> None:
    watching = Watching()
    watching.informers._listed("checkpoints", Listed([], "1"), NAMESPACE, first=True)
    watching.informers._listed("attempts", Listed([], "1"), NAMESPACE, first=True)
    watching.informers._listed("checkpoints", Listed([checkpoint("c1", 1, "5")], "6"), NAMESPACE, first=False)
    assert [c["metadata"]["name"] for c in watching.cache.of("checkpoints", KEY)] == ["c1"]
    assert watching.woken == []
    watching.informers._listed("attempts", Listed([attempt_body("7")], "8"), NAMESPACE, first=False)
    assert watching.woken == [KEY]


class ServedCheckpoints:
    """The API server's Checkpoints, for the reconciler's reads: counts the GETs."""

    def __init__(self, *served: JsonDict) -> None:
        self.served = {c["metadata"]["name"]: c for c in served}
        self.gets: list[str] = []
        self.deleted: list[str] = []

    custom_path = staticmethod(KubeApi.custom_path)

    async def get(self, path: str) -> JsonDict | None:
        self.gets.append(path.rsplit("/", 1)[-1])
        return self.served.get(path.rsplit("/", 1)[-1])

    async def delete(self, path: str, *args: Any, **kwargs: Any) -> bool:
        name = path.rsplit("/", 1)[-1]
        self.deleted.append(name)
        return self.served.pop(name, None) is not None


def start_up(api: ServedCheckpoints) -> Runtime:
    runtime = Runtime(
        api,  # type: ignore[arg-type]
        OperatorSettings(),
        operator_account=None,
        tracing=Tracing("agentrun-operator", {}),
        operator_metrics=OperatorMetrics(None),
        clock=FakeClock(),
        identity="replica-a",
    )
    return runtime


def test_a_checkpoint_the_run_names_before_its_event_came_is_read_once_and_decided_on() -> None:
    """The worker's pointer write (a Run event) may come before the Checkpoint's own event: the one it
    names is read from the API server, cached (its event later is an echo), and not read again; one the
    API server does not have is read once."""
    older = [checkpoint(f"c{n}", n, str(n)) for n in range(1, 4)]
    pointed = checkpoint("c9", 9, "90", parent="c3", deltaBase="c1")
    api = ServedCheckpoints(*older, pointed)
    runtime = start_up(api)
    for body in older:
        runtime.cache.put("checkpoints", body)
    run = make_run(
        {"phase": "Running", "currentAttempt": 1, "leaseEpoch": 1, "latestCheckpoint": "c9"},
        spec={"retryRequest": {"idempotencyKey": "k", "fromCheckpoint": "c-gone"}},
    )
    attempts = [make_attempt(1, phase="Running")]

    seen = asyncio.run(runtime.reconciler._checkpoints(KEY, run, attempts))
    again = asyncio.run(runtime.reconciler._checkpoints(KEY, run, attempts))

    assert sorted(c["metadata"]["name"] for c in seen) == ["c1", "c2", "c3", "c9"]
    assert sorted(c["metadata"]["name"] for c in again) == ["c1", "c2", "c3", "c9"]
    assert sorted(api.gets) == ["c-gone", "c9"]  # each once
    cached = runtime.cache.get("checkpoints", KEY, "c9")
    assert cached is not None and "state" not in cached["spec"]  # cached as any other
    assert not runtime.cache.take("checkpoints", pointed)[2]  # its watch event is an echo now


def test_nothing_is_read_when_the_cache_holds_what_the_run_names() -> None:
    api = ServedCheckpoints()
    runtime = start_up(api)
    runtime.cache.put("checkpoints", checkpoint("c1", 1, "1"))
    run = make_run({"phase": "Running", "currentAttempt": 1, "leaseEpoch": 1, "latestCheckpoint": "c1"})

    seen = asyncio.run(runtime.reconciler._checkpoints(KEY, run, []))

    assert [c["metadata"]["name"] for c in seen] == ["c1"]
    assert api.gets == []


def test_retention_keeps_what_the_pointer_read_from_the_api_server_is_rebuilt_from() -> None:
    """Decided on the cache alone, the states a pointer's delta is rebuilt from could be pruned before its
    Checkpoint's event came: with it read, they are kept."""
    chain = [
        checkpoint("c1", 1, "1"),
        *(checkpoint(f"c{n}", n, str(n), parent=f"c{n - 1}", deltaBase="c1") for n in (2, 3)),
        checkpoint("c4", 4, "4", parent="c3"),  # whole: the newest cached keeps nothing older
    ]
    pointed = checkpoint("c5", 5, "5", parent="c4", deltaBase="c1")
    api = ServedCheckpoints(*chain, pointed)
    runtime = start_up(api)
    for body in chain:
        runtime.cache.put("checkpoints", body)
    run = make_run(
        {"phase": "Running", "currentAttempt": 1, "leaseEpoch": 1, "latestCheckpoint": "c5"},
        spec={"checkpointRetention": 1},
    )
    cached_only = [Checkpoint.model_validate(c) for c in runtime.cache.of("checkpoints", KEY)]
    read = [Checkpoint.model_validate(c) for c in asyncio.run(runtime.reconciler._checkpoints(KEY, run, []))]

    assert retention.prunable(run, cached_only, []) == ["c3", "c2", "c1"]  # what less would have deleted
    assert retention.prunable(run, read, []) == []


def test_a_checkpoint_the_operator_deletes_leaves_the_cache_and_the_run_is_decided_again() -> None:
    api = ServedCheckpoints(checkpoint("c1", 1, "1"))
    runtime = start_up(api)
    runtime.cache.put("checkpoints", checkpoint("c1", 1, "1"))
    run = make_run({"phase": "Running", "currentAttempt": 1, "leaseEpoch": 1})

    executed = asyncio.run(runtime.executor.execute(Plan([DeleteCheckpoint("c1")]), run))

    assert api.deleted == ["c1"]
    assert runtime.cache.of("checkpoints", KEY) == []
    assert executed.changed  # its DELETED event wakes no one: decided again on what is left


class ListedCheckpoints(ServedCheckpoints):
    async def list_pages(self, collection: str, label_selector: str | None = None) -> Any:
        yield list(self.served.values())


def test_the_checkpoints_a_finished_run_s_index_lists_are_cached_for_the_compaction_after_it() -> None:
    """The index names every Checkpoint of the Run (listed: the last one's event may not have come); the
    compaction after it (the superseded deleted, managedFields cleared) decides on the cache: it has them."""
    api = ListedCheckpoints(checkpoint("c1", 1, "1"), checkpoint("c2", 2, "2"))
    runtime = start_up(api)
    runtime.cache.put("checkpoints", checkpoint("c1", 1, "1"))
    run = make_run({"phase": "Succeeded", "currentAttempt": 1, "leaseEpoch": 1, "latestCheckpoint": "c1"})

    every = asyncio.run(runtime.executor._every_checkpoint(run, runtime.cache.of("checkpoints", KEY)))

    assert sorted(c["metadata"]["name"] for c in every) == ["c1", "c2"]
    assert sorted(c["metadata"]["name"] for c in runtime.cache.of("checkpoints", KEY)) == ["c1", "c2"]
