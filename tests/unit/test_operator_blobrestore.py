"""The operator's restorer of overwritten blobs (agentrun.operator.blobrestore), its pieces that need no
cluster, on a memory:// store: the channel blob a document names is found through the document, and a
blob that verifies (or a store that keeps no versions) is said without a write. Its decisions:
test_core_blobrestore.py; on a real cluster and versitygw: tests/integration/test_hostile_store.py."""

from __future__ import annotations

import asyncio

import obstore

from agentrun.core.blobrestore import Outcome, Reference, Target
from agentrun.kubeapi import KubeApi
from agentrun.operator.blobrestore import RestoreMetrics, StateRestorer
from agentrun.statestore import BlobRef
from agentrun.statestore.documents import encode_document
from agentrun.statestore.operatorstore import OperatorStore

NAMESPACE, RUN_UID = "team-a", "3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34"


def make_restorer(api: KubeApi) -> tuple[StateRestorer, OperatorStore]:
    store = OperatorStore.from_url("memory://state")
    return StateRestorer(store, metrics=RestoreMetrics(None)), store


def test_a_blob_named_only_inside_a_document_is_found_there_with_its_checkpoint(
    unreachable_api: KubeApi,
) -> None:
    restorer, store = make_restorer(unreachable_api)
    channel = asyncio.run(store.put(NAMESPACE, RUN_UID, b'{"messages": ["a channel version"]}'))
    elsewhere = asyncio.run(store.put("team-b", RUN_UID, b'{"another namespace": true}'))
    stored = asyncio.run(store.put(NAMESPACE, RUN_UID, encode_document("Segment", [channel], {})))
    inner = BlobRef(stored.key, stored.sha256, stored.size, links=True)  # a document naming a document
    manifest = asyncio.run(
        store.put(NAMESPACE, RUN_UID, encode_document("Manifest", [inner, elsewhere], {"step": 3}))
    )
    nowhere = store.key_for(NAMESPACE, RUN_UID, "e" * 64)
    broken = Reference(nowhere, "e" * 64, 10, "Checkpoint c-s1", "c-s1", links=True)
    roots = [
        broken,  # unreadable: passed over
        Reference(manifest.key, manifest.sha256, manifest.size, "Checkpoint c-s2", "c-s2", links=True),
    ]
    inside = store.location.key(NAMESPACE) + "/"

    found = asyncio.run(restorer._in_documents(roots, frozenset({channel.key}), inside))

    by_key = {r.key: r for r in found}
    assert set(by_key) == {inner.key, channel.key}, "what another namespace's key names is not followed"
    assert by_key[channel.key] == Reference(
        channel.key, channel.sha256, channel.size, f"document {inner.key}", "c-s2"
    )


def test_a_blob_that_verifies_is_not_written_and_a_store_without_versions_is_said(
    unreachable_api: KubeApi,
) -> None:
    restorer, store = make_restorer(unreachable_api)
    data = b'{"state": "genuine"}'
    ref = asyncio.run(store.put(NAMESPACE, RUN_UID, data))
    target = Target(ref.key, ref.sha256, ref.size, ("c-s2",))
    assert asyncio.run(restorer._restore(target)).outcome == Outcome.VERIFIED

    obstore.put(store._store, ref.key, data.replace(b"genuine", b"forged!"))
    said = asyncio.run(restorer._restore(target))
    assert said.outcome == Outcome.UNSUPPORTED
    assert said.detail == "a memory:// store keeps no versions the operator can list"
