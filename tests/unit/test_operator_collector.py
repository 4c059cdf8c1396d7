"""The collector's pieces that need no store or cluster: how references are found in objects (tolerant
of malformed records), its settings, and when the runtime builds it. Its decisions:
test_core_collector.py; its sweeps on a real cluster and S3 server: tests/integration/test_collector.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import obstore
import pytest
from obstore.store import MemoryStore
from prometheus_client import CollectorRegistry

from agentrun.core.collector import ARCHIVES_SEGMENT, Marks, Roots, live_address
from agentrun.kubeapi import KubeApi
from agentrun.operator.collector import Collector, build_collector, references
from agentrun.operator.settings import OperatorSettings
from agentrun.statestore import BlobRef, archives, parse_store_url
from agentrun.statestore.documents import encode_document
from agentrun.statestore.operatorstore import OperatorStore
from support.clock import FakeClock
from unit.test_statestore_archives import NOW, summary

SHA = "a" * 64


def test_references_are_found_in_every_field_and_a_malformed_one_still_roots_its_key() -> None:
    run = {
        "metadata": {"name": "r", "annotations": {"x": "not a ref"}},
        "spec": {"input": {"nested": [{"key": "s/ns/u/sha256/" + SHA, "sha256": SHA, "size": 3}]}},
        "status": {
            "resultRef": {"key": "s/ns/u/sha256/" + "b" * 64, "sha256": "b" * 64, "size": 1, "links": True},
            "forged": {"key": "s/ns/u/sha256/c", "sha256": "not hex", "size": -1},
            "extra": {"key": "k", "sha256": SHA, "size": 1, "other": 1},
        },
    }
    found = {ref.key: ref for ref in references(run)}
    assert sorted(found) == ["s/ns/u/sha256/" + SHA, "s/ns/u/sha256/" + "b" * 64, "s/ns/u/sha256/c"]
    assert found["s/ns/u/sha256/" + "b" * 64].links
    assert not found["s/ns/u/sha256/c"].links  # rooted, never read as a document
    assert found["s/ns/u/sha256/" + SHA] == BlobRef("s/ns/u/sha256/" + SHA, SHA, 3)


def test_the_collector_runs_only_with_a_store_and_a_non_zero_interval(unreachable_api: KubeApi) -> None:
    store = OperatorStore.from_url("memory://state")
    clock = FakeClock()
    off = OperatorSettings(state_store_url="memory://state", state_store_gc_interval_seconds=0)
    on = OperatorSettings(state_store_url="memory://state")
    assert build_collector(unreachable_api, None, on, (), clock=clock, registry=None) is None
    assert build_collector(unreachable_api, store, off, (), clock=clock, registry=None) is None
    registry = CollectorRegistry()
    collector = build_collector(unreachable_api, store, on, ("team-a",), clock=clock, registry=registry)
    assert collector is not None
    assert (collector.settings.grace_seconds, collector.settings.quarantine_seconds) == (3600, 86400)
    assert collector.interval_seconds == 600
    assert collector.namespaces == ("team-a",)
    assert parse_store_url("memory://state") == store.location


def test_the_collector_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTRUN_STATE_STORE_GC_INTERVAL_SECONDS", "5")
    monkeypatch.setenv("AGENTRUN_STATE_STORE_GC_GRACE_SECONDS", "2.5")
    monkeypatch.setenv("AGENTRUN_STATE_STORE_GC_QUARANTINE_SECONDS", "7")
    config = OperatorSettings.from_env(auto_priority=0)
    assert (
        config.state_store_gc_interval_seconds,
        config.state_store_gc_grace_seconds,
        config.state_store_gc_quarantine_seconds,
    ) == (5, 2.5, 7)
    monkeypatch.setenv("AGENTRUN_STATE_STORE_GC_GRACE_SECONDS", "0")
    with pytest.raises(ValueError, match="grace and quarantine periods"):
        OperatorSettings.from_env(auto_priority=0)
    with pytest.raises(ValueError, match="0 \\(no collection\\) or more"):
        OperatorSettings(state_store_gc_interval_seconds=-1)


class SweepCountingClock(FakeClock):
    """The loop waits an interval after each sweep: the second wait says two sweeps are done."""

    two_sweeps: asyncio.Event
    waits = 0

    async def sleep(self, seconds: float) -> None:
        self.waits += 1
        if self.waits == 2:
            self.two_sweeps.set()
        await super().sleep(seconds)


def test_a_sweep_whose_roots_cannot_be_gathered_decides_nothing(unreachable_api: KubeApi) -> None:
    store = OperatorStore.from_url("memory://state")
    asyncio.run(store.put("team-a", "3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34", b"unreferenced"))
    registry = CollectorRegistry()
    config = OperatorSettings(state_store_url="memory://state", state_store_gc_grace_seconds=1)
    clock = SweepCountingClock()
    collector = build_collector(unreachable_api, store, config, (), clock=clock, registry=registry)
    assert isinstance(collector, Collector)

    async def two_sweeps_of_the_loop() -> None:
        clock.two_sweeps = asyncio.Event()
        collector.start()
        await clock.two_sweeps.wait()
        await collector.stop()
        await unreachable_api.aclose()

    asyncio.run(two_sweeps_of_the_loop())
    assert registry.get_sample_value("agentrun_state_store_gc_sweeps_total", {"outcome": "error"}) == 2
    assert registry.get_sample_value("agentrun_state_store_gc_sweeps_total", {"outcome": "ok"}) == 0
    assert collector.marks.unreferenced_since == {}
    assert len(asyncio.run(store.list_blobs())) == 1


RUN_UID = "3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34"


def memory() -> tuple[OperatorStore, MemoryStore]:
    raw = MemoryStore()
    return OperatorStore(raw, parse_store_url("memory://state")), raw


def roots_of(store: OperatorStore, objects: list[dict[str, Any]], api: KubeApi) -> Roots:
    collector = build_collector(
        api, store, OperatorSettings(state_store_url="memory://state"), (), clock=FakeClock(), registry=None
    )
    assert collector is not None
    return asyncio.run(collector.roots_of(objects))


def relative(ref: BlobRef) -> str:
    return ref.key.removeprefix("state/")


def checkpoint_naming(ref: BlobRef, namespace: str = "team-a") -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": namespace}, "spec": {"stateRef": ref.to_json()}}


def write_archive(store: OperatorStore, body: dict[str, Any]) -> archives.ArchiveEntry:
    """An archive of a Run that is gone, written and indexed as the operator's archiver does."""

    async def write() -> archives.ArchiveEntry:
        entry = await archives.write_archive(store, summary("gone", RUN_UID), "7", body, NOW)
        await archives.index_archive(store, entry)
        return entry

    return asyncio.run(write())


def test_the_collector_and_the_archives_agree_on_where_archives_live() -> None:
    assert archives.ARCHIVES_FOLDER == ARCHIVES_SEGMENT


def test_roots_follow_links_through_documents_and_archives(unreachable_api: KubeApi) -> None:
    store, _ = memory()

    def put(data: bytes, namespace: str = "team-a") -> BlobRef:
        return asyncio.run(store.put(namespace, RUN_UID, data))

    channel, message, archived = put(b"channel"), put(b"message"), put(b"archived state")
    inner = replace(put(encode_document("Writes", [message], {})), links=True)
    manifest = replace(put(encode_document("Manifest", [channel, inner], {"parents": []})), links=True)
    write_archive(store, {"checkpoints": [{"spec": {"stateRef": archived.to_json()}}]})

    roots = roots_of(store, [checkpoint_naming(manifest)], unreachable_api)
    assert roots.keys == {relative(r) for r in (manifest, channel, inner, message, archived)}
    assert (roots.held, roots.complete) == (frozenset(), True)


def test_a_document_that_cannot_be_read_holds_its_namespace(unreachable_api: KubeApi) -> None:
    store = OperatorStore.from_url("memory://state")
    missing = BlobRef(f"state/team-b/{RUN_UID}/sha256/{'b' * 64}", "b" * 64, 10, links=True)
    not_a_document = replace(asyncio.run(store.put("team-c", RUN_UID, b"[1, 2]")), links=True)
    objects = [checkpoint_naming(missing, "team-b"), checkpoint_naming(not_a_document, "team-c")]
    roots = roots_of(store, objects, unreachable_api)
    assert roots.held == {"team-b", "team-c"}
    assert roots.complete
    assert roots.keys == {relative(missing), relative(not_a_document)}


def test_a_document_in_quarantine_is_read_there_and_an_unreadable_archive_stops_all(
    unreachable_api: KubeApi,
) -> None:
    store, raw = memory()
    named = asyncio.run(store.put("team-a", RUN_UID, b"named"))
    stored = asyncio.run(store.put("team-a", RUN_UID, encode_document("M", [named], {})))
    document = replace(stored, links=True)
    address = live_address(relative(document))
    assert address is not None
    asyncio.run(store.quarantine(address))
    roots = roots_of(store, [checkpoint_naming(document)], unreachable_api)
    assert relative(named) in roots.keys
    assert roots.complete

    entry = write_archive(store, {"checkpoints": []})
    obstore.put(raw, entry.key, b'{"refs": []}')  # changed behind its index entry: not what was verified
    assert not roots_of(store, [], unreachable_api).complete


def test_a_start_forgets_the_marks_made_before_a_replica_stood_by(unreachable_api: KubeApi) -> None:
    store, _ = memory()
    config = OperatorSettings(state_store_url="memory://state")
    collector = build_collector(unreachable_api, store, config, (), clock=FakeClock(), registry=None)
    assert collector is not None
    collector.marks = Marks({"team-a/uid/sha256/" + "a" * 64: FakeClock().now()})

    async def start_and_stop() -> None:
        collector.start()
        assert collector.marks == Marks()
        await collector.stop()
        await unreachable_api.aclose()

    asyncio.run(start_and_stop())
