"""The operator's cache keeps what the reconciler reads, and never goes back to an older version."""

from __future__ import annotations

from typing import Any

from agentrun.operator.cache import HAS_MANAGED_FIELDS, AgentAccounts, OwnedObjects
from agentrun.operator.run_cache import RunCache
from support.clock import FakeClock

RUN_LABEL = {"agentrun.dev/run": "triage"}
MANAGED = [{"manager": "agentrun-worker", "operation": "Update", "fieldsV1": {"f:spec": {}}}]


def served(kind: str, name: str, rv: str, **body: Any) -> dict[str, Any]:
    metadata = {"name": name, "namespace": "team-a", "resourceVersion": rv, "labels": RUN_LABEL}
    return {"kind": kind, "metadata": {**metadata, "managedFields": MANAGED}, **body}


def test_a_checkpoint_is_cached_without_its_state_or_managed_fields() -> None:
    cache = OwnedObjects(FakeClock())
    spec = {"runName": "triage", "id": "ckpt-1", "sequence": 1, "state": {"notes": "x" * 10_000}}
    cache.put("checkpoints", served("Checkpoint", "triage-ckpt-1", "7", spec=spec))

    [cached] = cache.of("checkpoints", ("team-a", "triage"))
    assert cached["spec"] == {"runName": "triage", "id": "ckpt-1", "sequence": 1}
    assert "managedFields" not in cached["metadata"]


def test_an_attempt_is_cached_whole_but_for_managed_fields() -> None:
    cache = OwnedObjects(FakeClock())
    status = {"phase": "Running", "usage": {"inputTokens": 12}}
    cache.put("attempts", served("Attempt", "triage-a1", "7", spec={"number": 1}, status=status))

    [cached] = cache.of("attempts", ("team-a", "triage"))
    assert (cached["spec"], cached["status"]) == ({"number": 1}, status)
    assert "managedFields" not in cached["metadata"]


def test_an_older_version_never_replaces_a_newer_one() -> None:
    cache = OwnedObjects(FakeClock())
    cache.put("attempts", served("Attempt", "triage-a1", "9", status={"phase": "Succeeded"}))
    cache.put("attempts", served("Attempt", "triage-a1", "8", status={"phase": "Running"}))

    [cached] = cache.of("attempts", ("team-a", "triage"))
    assert cached["status"]["phase"] == "Succeeded"


def test_the_cache_says_whether_an_object_carries_managed_fields_not_what_they_are() -> None:
    cache = OwnedObjects(FakeClock())
    cache.put("sideeffects", served("SideEffect", "triage-k1", "7", status={"state": "Confirmed"}))
    [cached] = cache.of("sideeffects", ("team-a", "triage"))
    assert cached[HAS_MANAGED_FIELDS] is True and "managedFields" not in cached["metadata"]

    cleared = served("SideEffect", "triage-k1", "8", status={"state": "Confirmed"})
    del cleared["metadata"]["managedFields"]  # as the API server answers a reset
    cache.put("sideeffects", cleared)
    [cached] = cache.of("sideeffects", ("team-a", "triage"))
    assert HAS_MANAGED_FIELDS not in cached


def test_the_run_cache_says_whether_the_run_carries_managed_fields() -> None:
    runs = RunCache()
    metadata = {"name": "triage", "namespace": "team-a", "uid": "u", "resourceVersion": "7"}
    ended = {"status": {"phase": "Succeeded"}}
    runs.put({"metadata": {**metadata, "managedFields": MANAGED}, **ended})
    assert runs.has_managed_fields(("team-a", "triage"))

    runs.put({"metadata": {**metadata, "resourceVersion": "8"}, **ended})  # as a reset answers
    assert not runs.has_managed_fields(("team-a", "triage"))
    assert not runs.has_managed_fields(("team-a", "other"))


def account(namespace: str, name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "labels": {"agentrun.dev/agent": "true"}}}


def test_the_opted_in_accounts_tell_which_namespace_changed_and_which_are_opted_in() -> None:
    """What the namespaces' principals act on (operator.store_principals): an account put, removed, or
    gone at a relist (its namespace deleted while the watch was down) names its namespace."""
    accounts, told = AgentAccounts(), list[str]()
    accounts.on_change(told.append)

    accounts.replace([account("a", "default"), account("b", "agents")])
    assert accounts.namespaces() == {"a", "b"} and sorted(told) == ["a", "b"]
    told.clear()
    accounts.put(account("a", "second"))
    accounts.remove(account("a", "default"))
    assert accounts.namespaces() == {"a", "b"} and told == ["a", "a"]
    told.clear()
    accounts.replace([account("a", "second")])  # b's accounts are gone at the relist
    assert accounts.namespaces() == {"a"} and told == ["a", "b"]
