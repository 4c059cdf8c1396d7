"""agentrun.integrations.langgraph.manifests on a memory:// store, without a cluster: a checkpoint's
manifest reads back the checkpoint it was written from; an unchanged channel is referenced, not written
again; a growing list writes its new items only, and a new item a pending write holds is that write's
blob; what a superstep writes does not grow with the thread; a blob missing or changed is
StateUnverifiable, never a shorter list. The same through the saver on a real API server and
versitygw: tests/integration/test_langgraph_state_store.py."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import obstore
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentrun.integrations.langgraph.manifests import (
    INLINE_LIMIT,
    MANIFEST_KIND,
    SEGMENTS_PER_NODE,
    Document,
    Parent,
    ThreadBlobs,
    Write,
    parent_writes,
    read_manifest,
    write_manifest,
)
from agentrun.integrations.langgraph.serde import AllowListSerializer
from agentrun.statestore import BlobStore
from agentrun.statestore.documents import document_refs
from agentrun.worker import RunBlobs
from agentrun.worker.errors import StateUnverifiable

NAMESPACE = "team-a"
RUN_UID = "3f1c2a9e-8d5b-4c47-9f0e-2b6d7a1c5e34"
OUTPUT = 40_000  # what the tool returns per call, in characters
SERDE = AllowListSerializer()


class Thread:
    """A ReAct-style thread saved superstep by superstep as the saver does: the model asks for a tool,
    the tool answers with OUTPUT characters; `messages` grows (operator.add), `step` changes each time,
    `system` never does."""

    def __init__(self) -> None:
        self.store = BlobStore.from_url("memory://runs")
        self.blobs = ThreadBlobs(RunBlobs(self.store, NAMESPACE, RUN_UID))
        self.messages: list[Any] = [HumanMessage("read the files", id="h0")]
        self.versions: dict[str, int] = {"messages": 1, "step": 1, "system": 1}
        self.parent = Parent(None, {}, [])
        self.manifests: list[Document] = []
        self.written: list[int] = []  # bytes put per superstep
        self.new_data: list[int] = []  # serialized bytes of the superstep's new messages

    def superstep(self, n: int) -> Document:
        new = (
            [AIMessage("", tool_calls=[{"name": "read", "args": {"n": n}, "id": f"c{n}"}], id=f"a{n}")]
            if n % 2 == 0
            else [ToolMessage(f"{n:05d}" + "x" * OUTPUT, tool_call_id=f"c{n - 1}", id=f"t{n}")]
        )
        before = self.blobs.written
        writes = asyncio.run(self._writes(n, new))
        self.messages = self.messages + new
        self.versions = {**self.versions, "messages": self.versions["messages"] + 1, "step": n + 2}
        checkpoint = {
            "v": 4,
            "id": f"cp{n:04d}",
            "ts": "2026-12-02T00:00:00+00:00",
            "channel_values": {"messages": self.messages, "step": n, "system": "be brief " * 100},
            "channel_versions": dict(self.versions),
            "versions_seen": {"model": {"messages": self.versions["messages"]}},
            "updated_channels": ["messages", "step"],
        }
        parent = Parent(self.parent.manifest, self.parent.versions, writes)
        manifest = asyncio.run(
            write_manifest(
                self.blobs,
                SERDE,
                parent,
                checkpoint=checkpoint,
                metadata={"source": "loop", "step": n},
                new_versions={"messages": self.versions["messages"], "step": n + 2},
                header={"checkpointId": checkpoint["id"], "sequence": n + 1},
                link_parent=False,
            )
        )
        self.written.append(self.blobs.written - before)
        self.new_data.append(len(SERDE.dumps_typed(new)[1]))
        self.manifests.append(manifest)
        self.parent = Parent(manifest, dict(self.versions), [])
        return manifest

    async def _writes(self, n: int, new: list[Any]) -> list[Write]:
        typed = SERDE.dumps_typed(new)
        stored, _ = await self.blobs.store_value(typed)
        self.blobs.remember_value(hashlib.sha256(typed[1]).hexdigest(), new)
        return [Write(f"task{n}", f"~path{n}", 0, "messages", stored)]

    def read(self, manifest: Document) -> dict[str, Any]:
        fresh = ThreadBlobs(RunBlobs(self.store, NAMESPACE, RUN_UID))  # a new Attempt: nothing cached
        return asyncio.run(read_manifest(fresh, manifest, SERDE)).checkpoint


def test_a_manifest_reads_back_the_checkpoint_it_was_written_from() -> None:
    thread = Thread()
    for n in range(2 * SEGMENTS_PER_NODE + 7):  # long enough for a list document
        manifest = thread.superstep(n)
    checkpoint = thread.read(manifest)
    assert checkpoint["channel_values"]["messages"] == thread.messages
    assert checkpoint["channel_values"]["step"] == 2 * SEGMENTS_PER_NODE + 6
    assert checkpoint["channel_versions"] == thread.versions
    assert checkpoint["id"] == f"cp{2 * SEGMENTS_PER_NODE + 6:04d}"
    # every blob the manifest names is in its refs, and a list document is marked to be followed
    data = asyncio.run(thread.store.get(manifest.ref))
    refs = document_refs(data)
    assert {r.sha256 for r in refs} == set(manifest.refs)
    assert [r.links for r in refs if r.sha256 == manifest.body["channels"]["messages"]["prev"]] == [True]
    assert manifest.ref.links


def test_an_unchanged_channel_is_referenced_and_a_growing_list_writes_only_its_new_items() -> None:
    thread = Thread()
    for n in range(40):
        thread.superstep(n)
    first, last = thread.manifests[3], thread.manifests[-1]
    assert first.body["channels"]["system"] == last.body["channels"]["system"]  # the same blob
    # Beyond its new messages (put once, by the pending write), a superstep puts its manifest (its list
    # entry names at most SEGMENTS_PER_NODE segments) and, when that entry is full, a list document
    # holding them: a few KiB, whatever the thread's length.
    overhead = [w - new for w, new in zip(thread.written, thread.new_data, strict=True)]
    assert max(overhead) < 8 * 1024
    assert sum(thread.written) < 1.5 * sum(thread.new_data)


def test_a_new_message_held_by_a_pending_write_is_one_blob() -> None:
    thread = Thread()
    for n in range(4):
        thread.superstep(n)
    keys = asyncio.run(_keys(thread.store))
    outputs = [k for k in keys if asyncio.run(_size(thread.store, k)) > OUTPUT]
    assert len(outputs) == 2  # tool calls 1 and 3: each stored once, for the write and the list


def test_what_a_superstep_writes_does_not_grow_with_the_thread() -> None:
    thread = Thread()
    for n in range(4 * SEGMENTS_PER_NODE + 12):
        thread.superstep(n)
    early = thread.manifests[8:13]
    late = thread.manifests[-5:]
    assert max(m.ref.size for m in late) <= max(m.ref.size for m in early) + 256
    early_written = sum(thread.written[8:12])
    late_written = sum(thread.written[-4:])
    assert late_written <= early_written + SEGMENTS_PER_NODE * 400
    assert thread.read(thread.manifests[-1])["channel_values"]["messages"] == thread.messages


def test_the_parent_writes_are_recorded_with_their_blobs() -> None:
    thread = Thread()
    thread.superstep(0)
    manifest = thread.superstep(1)
    (write,) = parent_writes(manifest)
    assert write.channel == "messages" and write.task_id == "task1"
    assert write.ref is not None and write.ref.size > INLINE_LIMIT
    assert write.ref.sha256 in manifest.refs


def test_a_segment_deleted_or_replaced_is_state_unverifiable_never_a_shorter_list() -> None:
    thread = Thread()
    for n in range(6):
        manifest = thread.superstep(n)
    outputs = [k for k in asyncio.run(_keys(thread.store)) if asyncio.run(_size(thread.store, k)) > OUTPUT]
    inner = thread.store._store  # the object store behind BlobStore: a hostile writer's view
    obstore.put(inner, outputs[0], b"x" * asyncio.run(_size(thread.store, outputs[0])))
    with pytest.raises(StateUnverifiable, match=outputs[0]):
        thread.read(manifest)
    obstore.delete(inner, outputs[0])
    with pytest.raises(StateUnverifiable, match=outputs[0]):
        thread.read(manifest)


def test_a_manifest_is_returned_only_once_every_blob_it_names_is_stored() -> None:
    """The manifest is put at the same time as the blobs it names (write_manifest): it is handed out, for
    a Checkpoint object to name, only once every one of them is stored and verified. A blob that cannot
    be (here a planted one at its key: put-if-absent finds it and it is not this content) fails the
    whole checkpoint, and no put is left running behind the caller."""
    thread = Thread()
    for n in range(4):
        thread.superstep(n)
    typed = SERDE.dumps_typed("a new channel value " * 40)  # a blob of its own (over INLINE_LIMIT)
    key = thread.blobs.blobs.store.key_for(NAMESPACE, RUN_UID, hashlib.sha256(typed[1]).hexdigest())
    obstore.put(thread.store._store, key, b"x" * len(typed[1]))  # a hostile writer got there first
    checkpoint: dict[str, Any] = {
        "v": 4,
        "id": "cp-planted",
        "ts": "2026-12-02T00:00:00+00:00",
        "channel_values": {"messages": thread.messages, "extra": "a new channel value " * 40},
        "channel_versions": {**thread.versions, "extra": 1},
        "versions_seen": {},
        "updated_channels": ["extra"],
    }

    async def save() -> list[asyncio.Task[Any]]:
        with pytest.raises(StateUnverifiable, match=key):
            await write_manifest(
                thread.blobs,
                SERDE,
                thread.parent,
                checkpoint=checkpoint,
                metadata={"source": "loop", "step": 4},
                new_versions={"extra": 1},
                header={"checkpointId": "cp-planted", "sequence": 5},
                link_parent=False,
            )
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(save()) == []
    checkpoint["channel_values"] = {**checkpoint["channel_values"], "extra": "another value " * 60}
    manifest = asyncio.run(
        write_manifest(
            thread.blobs,
            SERDE,
            thread.parent,
            checkpoint=checkpoint,
            metadata={"source": "loop", "step": 4},
            new_versions={"extra": 1},
            header={"checkpointId": "cp-planted", "sequence": 5},
            link_parent=False,
        )
    )
    stored = set(asyncio.run(_keys(thread.store)))
    assert {ref.key for ref in manifest.refs.values()} <= stored
    assert manifest.ref.key in stored
    assert thread.read(manifest)["channel_values"]["extra"] == "another value " * 60


def test_a_list_that_does_not_extend_its_previous_version_is_written_whole() -> None:
    thread = Thread()
    for n in range(4):
        thread.superstep(n)
    thread.messages = [thread.messages[0], *thread.messages[2:]]  # one removed (RemoveMessage)
    manifest = thread.superstep(4)
    assert thread.read(manifest)["channel_values"]["messages"] == thread.messages
    assert manifest.body["channels"]["messages"]["count"] == len(thread.messages)


def test_a_manifest_of_another_kind_is_refused() -> None:
    thread = Thread()
    for n in range(2 * SEGMENTS_PER_NODE):  # long enough for a list document
        manifest = thread.superstep(n)
    node = manifest.refs[manifest.body["channels"]["messages"]["prev"]]
    fresh = ThreadBlobs(RunBlobs(thread.store, NAMESPACE, RUN_UID))
    with pytest.raises(StateUnverifiable, match=MANIFEST_KIND):
        asyncio.run(fresh.document(node, MANIFEST_KIND))


async def _keys(store: BlobStore) -> list[str]:
    return [meta["path"] for batch in obstore.list(store._store) for meta in batch]


async def _size(store: BlobStore, key: str) -> int:
    return int((await obstore.head_async(store._store, key))["size"])
