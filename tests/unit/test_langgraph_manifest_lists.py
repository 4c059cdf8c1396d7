"""A growing list in the state store (integrations.langgraph.manifests) on a memory:// store.

- A new version of a list that starts with the very items the saver stored or read back is recognized
  without serializing them again; anything else (an item replaced, a field of one reassigned in place, a
  dict or list inside one changed in place, a saver that holds no items of that list) is compared byte
  for byte.
- The newest segments live in the manifest's list entry (small ones inline), up to SEGMENTS_PER_NODE or
  INLINE_NODE_BYTES, then go to a list document of their own: no list document put per superstep.
- A list saved in format 1 (a list document per version) is read and extended.
What a reader that shares nothing with the writer gets back is always the value saved.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from obstore.store import MemoryStore

from agentrun.integrations.langgraph import manifests
from agentrun.integrations.langgraph.manifests import LIST_KIND, MANIFEST_KIND, Document, Parent, ThreadBlobs
from agentrun.integrations.langgraph.serde import AllowListSerializer
from agentrun.statestore import BlobStore, StoreRequest
from agentrun.statestore.location import parse_store_url
from agentrun.worker import RunBlobs

RUN_UID = "0f0e0d0c-0000-4000-8000-000000000001"


class CountingSerde(AllowListSerializer):
    """Counts the values it serializes."""

    def __init__(self) -> None:
        super().__init__()
        self.dumped = 0

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        self.dumped += 1
        return super().dumps_typed(obj)


class Puts(list[StoreRequest]):
    def __call__(self, request: StoreRequest) -> None:
        if request.operation == "put":
            self.append(request)


def run_blobs(puts: Puts | None = None) -> RunBlobs:
    store = BlobStore(MemoryStore(), parse_store_url("memory://state"), observer=puts)
    return RunBlobs(store, "ns", RUN_UID)


def tool_outputs(n: int, start: int = 0) -> list[BaseMessage]:
    return [
        ToolMessage(f"output {i} " + "x" * 2000, tool_call_id=f"c{i}", id=f"m{i}") for i in range(start, n)
    ]


def save(
    blobs: ThreadBlobs, serde: AllowListSerializer, parent: Document | None, value: list[Any], version: int
) -> Document:
    checkpoint = {
        "v": 4,
        "id": f"id-{version}",
        "ts": "",
        "channel_values": {"messages": value},
        "channel_versions": {"messages": version},
        "versions_seen": {},
    }
    return asyncio.run(
        manifests.write_manifest(
            blobs,
            serde,
            Parent(parent, {"messages": version - 1} if parent else {}, []),
            checkpoint=checkpoint,
            metadata={},
            new_versions={"messages": version},
            header={"checkpointId": f"id-{version}"},
            link_parent=False,
        )
    )


def read_back(stored: RunBlobs, document: Document) -> list[Any]:
    """The list as a reader that shares nothing with the writer gets it (every blob read and verified)."""
    reader = ThreadBlobs(stored)
    manifest = asyncio.run(reader.document(document.ref, MANIFEST_KIND))
    found = asyncio.run(manifests.read_manifest(reader, manifest, AllowListSerializer()))
    value: list[Any] = found.checkpoint["channel_values"]["messages"]
    return value


def entry_of(document: Document) -> dict[str, Any]:
    entry: dict[str, Any] = document.body["channels"]["messages"]
    return entry


def test_a_list_that_extends_the_items_it_stored_is_not_serialized_again() -> None:
    stored = run_blobs()
    blobs, serde = ThreadBlobs(stored), CountingSerde()
    value = tool_outputs(40)
    first = save(blobs, serde, None, value, 1)
    grown = [*value, AIMessage("next", id="a40")]
    serde.dumped = 0
    second = save(blobs, serde, first, grown, 2)
    # the new item's segment, the checkpoint and its metadata: none of the 40 items stored before
    assert serde.dumped == 3
    assert read_back(stored, second) == grown
    entry = entry_of(second)
    assert entry["count"] == 41
    assert [s[1] for s in entry["segments"]] == [40, 1]  # the first 40 items' blob, then the new item inline
    assert len(entry["segments"][1]) == 5


def test_an_item_whose_field_was_reassigned_in_place_is_saved_as_it_is_now() -> None:
    stored = run_blobs()
    blobs, serde = ThreadBlobs(stored), CountingSerde()
    value = tool_outputs(10)
    first = save(blobs, serde, None, value, 1)
    value[3].content = "changed in place"
    grown = [*value, AIMessage("next", id="a10")]
    second = save(blobs, serde, first, grown, 2)
    assert read_back(stored, second)[3].content == "changed in place"
    assert read_back(stored, second) == grown
    assert [s[1] for s in entry_of(second)["segments"]] == [11]  # written again, whole


def test_an_item_changed_inside_a_field_in_place_is_saved_as_it_is_now() -> None:
    stored = run_blobs()
    blobs, serde = ThreadBlobs(stored), CountingSerde()
    call = AIMessage("call", id="a0", additional_kwargs={"note": ["kept"]})
    value: list[BaseMessage] = [call, *tool_outputs(5)]
    first = save(blobs, serde, None, value, 1)
    value[0].additional_kwargs["note"].append("added in place")  # no field reassigned
    grown = [*value, AIMessage("next", id="a6")]
    second = save(blobs, serde, first, grown, 2)
    assert read_back(stored, second)[0].additional_kwargs == {"note": ["kept", "added in place"]}
    assert read_back(stored, second) == grown


def test_a_plain_dict_item_changed_in_place_is_saved_as_it_is_now() -> None:
    stored = run_blobs()
    blobs, serde = ThreadBlobs(stored), CountingSerde()
    value: list[Any] = [{"role": "tool", "content": f"output {i}"} for i in range(5)]
    first = save(blobs, serde, None, value, 1)
    value[2]["content"] = "changed in place"
    grown = [*value, {"role": "assistant", "content": "next"}]
    second = save(blobs, serde, first, grown, 2)
    assert read_back(stored, second)[2]["content"] == "changed in place"
    assert read_back(stored, second) == grown


def test_an_item_replaced_by_an_equal_object_is_compared_byte_for_byte() -> None:
    stored = run_blobs()
    blobs, serde = ThreadBlobs(stored), CountingSerde()
    value = tool_outputs(10)
    first = save(blobs, serde, None, value, 1)
    copied = [m.model_copy() for m in value]  # other objects, the same bytes: the list still extends
    grown = [*copied, AIMessage("next", id="a10")]
    serde.dumped = 0
    second = save(blobs, serde, first, grown, 2)
    assert serde.dumped == 1 + 3  # the 10 items again as their one segment, then as before
    assert [s[1] for s in entry_of(second)["segments"]] == [10, 1]
    assert read_back(stored, second) == grown


def test_a_saver_that_read_the_list_back_extends_it_without_serializing_it_again() -> None:
    stored = run_blobs()
    first = save(ThreadBlobs(stored), CountingSerde(), None, tool_outputs(20), 1)
    reader, serde = ThreadBlobs(stored), CountingSerde()
    parent = asyncio.run(reader.document(first.ref, MANIFEST_KIND))
    read = asyncio.run(manifests.read_manifest(reader, parent, serde))
    value = read.checkpoint["channel_values"]["messages"]
    serde.dumped = 0
    second = save(reader, serde, parent, [*value, AIMessage("next", id="a20")], 2)
    assert serde.dumped == 3
    assert read_back(stored, second) == [*value, AIMessage("next", id="a20")]


def test_a_long_list_puts_its_new_items_and_a_manifest_and_spills_full_entries_to_list_documents() -> None:
    puts = Puts()
    stored = run_blobs(puts)
    blobs, serde = ThreadBlobs(stored), AllowListSerializer()
    value: list[Any] = []
    parent: Document | None = None
    spills = 0
    for step in range(1, 61):  # a big item, then a small one, as a tool's and a model's supersteps
        new = tool_outputs(step, step - 1) if step % 2 else [AIMessage(f"ask {step}", id=f"a{step}")]
        value = [*value, *new]
        before = len(puts)
        parent = save(blobs, serde, parent, value, step)
        made = len(puts) - before
        entry = entry_of(parent)
        assert len(entry["segments"]) <= manifests.SEGMENTS_PER_NODE
        inline = [s for s in entry["segments"] if len(s) == 5]
        inline_bytes = sum(len(manifests.Segment.from_json(s).data or b"") for s in inline)
        assert inline_bytes <= manifests.INLINE_NODE_BYTES
        # a big item: its blob and the manifest; a small one: the manifest alone; a list document only
        # when the entry was full
        spilled = made - (2 if step % 2 else 1)
        assert spilled in (0, 1)
        spills += spilled
    assert parent is not None
    assert spills >= 3
    assert read_back(stored, parent) == value
    segments = asyncio.run(blobs.list_chain(entry_of(parent), parent))
    assert sum(s.count for s, _ in segments) == len(value)


def test_a_list_saved_in_format_1_is_read_and_extended() -> None:
    stored = run_blobs()
    blobs, serde = ThreadBlobs(stored), AllowListSerializer()
    value = tool_outputs(3)
    typed = serde.dumps_typed(value)
    blob = asyncio.run(blobs.put(typed[1]))
    segment = [blob.sha256, 3, typed[0], False]
    list_body = {"format": 1, "prev": None, "prevCount": 0, "segments": [segment]}
    node = asyncio.run(blobs.put_document(LIST_KIND, [blob], list_body))
    versions = {"channel_versions": {"messages": 1}, "versions_seen": {}}
    core = serde.dumps_typed({"v": 4, "id": "id-1", "ts": "", **versions})
    metadata = serde.dumps_typed({})
    body = {
        "format": 1,
        "checkpointId": "id-1",
        "checkpoint": {"type": core[0], "data": manifests._b64(core[1])},
        "metadata": {"type": metadata[0], "data": manifests._b64(metadata[1])},
        "channels": {"messages": {"list": node.ref.sha256, "count": 3}},
        "parentWrites": [],
    }
    old = asyncio.run(blobs.put_document(MANIFEST_KIND, [node.ref], body))
    assert read_back(stored, old) == value

    fresh = ThreadBlobs(stored)  # holds none of the items: compares bytes, then extends
    parent = asyncio.run(fresh.document(old.ref, MANIFEST_KIND))
    grown = [*tool_outputs(3), AIMessage("next", id="a3")]
    second = save(fresh, serde, parent, grown, 2)
    entry = entry_of(second)
    assert entry["prev"] == node.ref.sha256 and entry["prevCount"] == 3
    assert [s[1] for s in entry["segments"]] == [1]
    assert read_back(stored, second) == grown
