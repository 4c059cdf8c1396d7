"""AgentrunSaver: a LangGraph checkpointer whose checkpoints are the Run's Checkpoint objects.

One LangGraph checkpoint is one immutable Checkpoint (kind State, `thread` = LangGraph's thread id and
checkpoint namespace); the pending writes of one task are one immutable Checkpoint of kind Writes whose
parent is that State checkpoint. Both carry the Run's label and owner, the writing Attempt and its
lease epoch. Values are serialized by AllowListSerializer (msgpack, base64 in the object's JSON), so
a stored checkpoint cannot name a class outside the allow-list and have it run.

Two ways to build one:
- `AgentrunSaver.for_attempt(ctx)` inside an attempt Pod: every checkpoint of the Run's own thread
  (thread id = the Run, root namespace) moves status.latestCheckpoint with the fences of
  ctx.checkpoint (lease epoch, cancel epoch), and "the latest checkpoint" of that thread is the one the
  Run points at, never merely the newest object (a stale worker may have created one the fence then
  refused). Deleting is refused: only the operator deletes Checkpoints.
- `AgentrunSaver(api, namespace, run)` anywhere else (tools, tests, LangGraph's conformance suite):
  the objects of a Run that exists, written as an identity RBAC lets write them, no fences.

With a state store (the Attempt's, or `state_store=` outside one), a State Checkpoint holds pointers
only (ids, parent, delta seeds) and names its manifest in the store (`stateRef`, module manifests): a
blob per channel version, an unchanged channel referenced rather than written again, a growing list
written as its new items only, and pending writes' values as blobs. A superstep then costs its change,
not the thread's history, in etcd and in the store. Checkpoints saved inline stay readable.

Without a store, values stay inline: each object's JSON must fit the Checkpoint state budget (256 KiB);
past it, a PermanentError. A LangGraph checkpoint holds every channel's full value then, so a long
thread (a growing message list) should use LangGraph's DeltaChannel, or configure the store.

Delta channels: a checkpoint records where each delta channel's value is rebuilt from (`deltaSeeds`,
and the oldest such ancestor as spec.deltaBase, which retention keeps with the chain up to it), and the
saver answers LangGraph's delta-history query itself by walking the thread's own Checkpoints: an
ancestor or Writes missing on the way is StateUnverifiable, never a shorter state (module ancestry).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
)
from langgraph.checkpoint.base import Checkpoint as LangGraphCheckpoint

from agentrun.api import API_VERSION, RUN_LABEL, CheckpointKind
from agentrun.api.budgets import CHECKPOINT_STATE_BUDGET, over_budget
from agentrun.integrations.langgraph import ancestry, forks, manifests
from agentrun.integrations.langgraph.ancestry import Seed, Stored
from agentrun.integrations.langgraph.manifests import (
    MANIFEST_KIND,
    Applied,
    Document,
    Parent,
    ThreadBlobs,
    Write,
)
from agentrun.integrations.langgraph.serde import AllowListSerializer, TypeKey, type_key
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.statestore import BlobRef, BlobStore
from agentrun.worker import PermanentError, RunBlobs, StateUnverifiable

if TYPE_CHECKING:
    from agentrun.worker import Context, RunPort

JsonDict = dict[str, Any]
T = TypeVar("T")
V = TypeVar("V")

THREAD_LABEL: Final = "agentrun.dev/thread"  # hash of the thread id: delete_thread, list
NAMESPACE_LABEL: Final = "agentrun.dev/thread-ns"  # hash of (thread id, checkpoint ns): get_tuple, list
PARENT_LABEL: Final = "agentrun.dev/parent"  # Writes: hash of the State checkpoint they belong to
KIND_LABEL: Final = "agentrun.dev/checkpoint-kind"
OUTSIDE_ATTEMPT: Final = "a0"  # spec.attempt suffix of objects written outside any Attempt
SIZE_ADVICE: Final = (
    "configure the agent-state store (AGENTRUN_STATE_STORE_URL) so that checkpoints go there, or keep "
    "large data out of the graph state (store it elsewhere and keep a reference), or use LangGraph's "
    "DeltaChannel for channels that grow with the thread (message lists)"
)
_KNOWN_PARENTS: Final = 64  # parents whose Writes a saver keeps at hand (for the next checkpoint)
_UUID_LIKE = re.compile(r"^[0-9a-f][0-9a-f-]{0,62}[0-9a-f]$")


class PauseRequested(Exception):
    """Raised after a checkpoint of the Run's thread is saved while spec.pause asks the Run to pause:
    run_graph stops the graph there, between supersteps."""

    def __init__(self, request_id: str, reason: str | None) -> None:
        super().__init__(request_id)
        self.request_id = request_id
        self.reason = reason


def _digest(*parts: str, size: int = 10) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:size]


def _encode(typed: tuple[str, bytes]) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode()]


def _decode(stored: Any) -> tuple[str, bytes]:
    encoding, data = stored
    return str(encoding), base64.b64decode(data)


@dataclass
class _Shared:
    """What a saver and its clones (LangGraph derives one per graph with its allow-list) share."""

    run_uid: str | None = None
    pointer: str | None = None  # in an Attempt: the Run's latestCheckpoint (a name)
    paused: set[str] = field(default_factory=set)  # pause requests that do not stop this Attempt
    sequences: dict[str, int] = field(default_factory=dict)  # State name -> its sequence
    seeds: dict[str, dict[str, Seed]] = field(default_factory=dict)  # State name -> its deltaSeeds
    writes: dict[str, int] = field(default_factory=dict)  # State name -> last Writes sequence known
    epochs: dict[str, int] = field(default_factory=dict)  # State name -> its lease epoch
    manifests: dict[str, BlobRef] = field(default_factory=dict)  # State name -> its manifest
    # State name -> its Writes objects known (read or written here), newest parents last
    write_bodies: OrderedDict[str, dict[str, JsonDict]] = field(default_factory=OrderedDict)
    # State name -> the writes this saver is storing for it now (a new list item is matched against them)
    staged: OrderedDict[str, list[Applied]] = field(default_factory=OrderedDict)
    blobs: ThreadBlobs | None = None
    blobs_opened: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    loop_lock: threading.Lock = field(default_factory=threading.Lock)
    clones: dict[frozenset[TypeKey], AgentrunSaver] = field(default_factory=dict)


@dataclass(frozen=True)
class _Node:
    """A State checkpoint on a walk: what ancestry reads of it, and its manifest (None: inline)."""

    stored: Stored
    manifest: Document | None


class _Decoded(Mapping[str, V]):
    """Objects by name, each decoded once and only when asked for (a walk reads part of a thread)."""

    def __init__(self, names: Iterable[str], decode: Callable[[str], V]) -> None:
        self._names = set(names)
        self._decode = decode
        self._done: dict[str, V] = {}

    def __getitem__(self, name: str) -> V:
        if name not in self._done:
            if name not in self._names:
                raise KeyError(name)
            self._done[name] = self._decode(name)
        return self._done[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class AgentrunSaver(BaseCheckpointSaver[int]):
    """LangGraph checkpoints and pending writes as the Run's Checkpoints (sync and async)."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        run: str,
        *,
        allowed_types: Iterable[TypeKey | type] = (),
        attempt: str | None = None,
        lease_epoch: int = 0,
        state_store: BlobStore | None = None,
    ) -> None:
        """The Checkpoints of Run `run` in `namespace`, written as whoever `api` authenticates as.

        allowed_types: classes (or (module, name)) a checkpoint may contain beyond LangGraph's safe
        types (messages, Send, Interrupt, datetime, ...); a compiled graph adds its state schema's own.
        state_store: where values go (the Run's blobs, a manifest per checkpoint); None keeps them inline.
        """
        super().__init__(serde=AllowListSerializer(allowed_types))
        self.api = api
        self.namespace = namespace
        self.run = run
        self.attempt = attempt or f"{run}-{OUTSIDE_ATTEMPT}"
        self.lease_epoch = lease_epoch
        self.collection = api.custom_path("checkpoints", namespace)
        self._session: RunPort | None = None
        self._state_store = state_store
        self._shared = _Shared()

    @classmethod
    def for_attempt(cls, ctx: Context, *, allowed_types: Iterable[TypeKey | type] = ()) -> AgentrunSaver:
        """The saver of this attempt Pod's Run: fenced, continuing from the Attempt's resume point."""
        session = ctx.store  # the SDK's public port: fenced writes, as ctx.checkpoint makes them
        saver = cls(
            session.api,
            ctx.namespace,
            ctx.run_name,
            allowed_types=allowed_types,
            attempt=ctx.attempt,
            lease_epoch=ctx.lease_epoch,
        )
        saver._session = session
        saver._shared.pointer = session.resume_from
        if session.run is not None:
            saver._shared.run_uid = session.run.metadata.uid
        return saver

    def ignore_pause(self, request_id: str) -> None:
        """A pause request this Attempt does not stop for (the one it continues after, or answered)."""
        self._shared.paused.add(request_id)

    @property
    def session(self) -> RunPort | None:
        """The attempt Pod's fenced access to its Run (ctx.store, for_attempt), or None outside one."""
        return self._session

    @property
    def latest(self) -> str | None:
        """In an Attempt: the name of the Checkpoint the Run points at (its latestCheckpoint)."""
        return self._shared.pointer

    def with_allowlist(self, extra_allowlist: Any) -> AgentrunSaver:
        """LangGraph passes the types of the graph's own state schema: read them too (a clone that
        shares this saver's state)."""
        assert isinstance(self.serde, AllowListSerializer)
        key = frozenset(type_key(e) for e in extra_allowlist)
        if key <= self.serde.allowed:
            return self
        if (clone := self._shared.clones.get(key)) is None:
            clone = copy.copy(self)
            clone.serde = self.serde.with_types(key)
            self._shared.clones[key] = clone
        return clone

    # ---- names ---------------------------------------------------------------------------------------

    def state_name(self, thread_id: str, ns: str, checkpoint_id: str) -> str:
        """The object name (and spec.id) of a LangGraph checkpoint: the Run, its thread, its id."""
        tail = checkpoint_id if _UUID_LIKE.match(checkpoint_id) else _digest(checkpoint_id, size=32)
        return f"{self.run}-{_digest(thread_id, ns)}-{tail}"

    def _is_runs_thread(self, thread_id: str, ns: str) -> bool:
        return self._session is not None and thread_id == self.run and ns == ""

    async def _owned_metadata(self, name: str, labels: dict[str, str]) -> JsonDict:
        if self._shared.run_uid is None:
            run = await self.api.get(self.api.custom_path("runs", self.namespace, self.run))
            if run is None:
                raise PermanentError(
                    f"Run {self.run} does not exist in {self.namespace}: its checkpoints cannot"
                )
            self._shared.run_uid = run["metadata"]["uid"]
        owner = {"apiVersion": API_VERSION, "kind": "Run", "name": self.run, "uid": self._shared.run_uid}
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": {RUN_LABEL: self.run, **labels},
            "ownerReferences": [{**owner, "blockOwnerDeletion": True}],
        }

    async def _run_uid(self) -> str:
        if self._shared.run_uid is None:
            await self._owned_metadata("", {})
        assert self._shared.run_uid is not None
        return self._shared.run_uid

    async def _blobs(self) -> ThreadBlobs | None:
        """The Run's blobs in the state store (the Attempt's, or the one given), or None: inline."""
        if not self._shared.blobs_opened:
            run_blobs: RunBlobs | None = None
            if self._session is not None:
                run_blobs = await self._session.blobs()
            elif self._state_store is not None:
                run_blobs = RunBlobs(self._state_store, self.namespace, await self._run_uid())
            clock = self._session.clock if self._session is not None else None
            self._shared.blobs = ThreadBlobs(run_blobs, clock) if run_blobs is not None else None
            self._shared.blobs_opened = True
        return self._shared.blobs

    async def _reading_blobs(self, what: str) -> ThreadBlobs:
        if (blobs := await self._blobs()) is None:
            raise StateUnverifiable(
                f"{what} is in the state store, but this saver has none configured "
                "(AGENTRUN_STATE_STORE_URL in an attempt Pod, state_store= elsewhere): it was not loaded"
            )
        return blobs

    async def _create(self, body: JsonDict, what: str) -> None:
        """Creates an immutable object; one that already exists under that name is the same one (a
        repeated call)."""
        if reason := over_budget(what, body["spec"]["state"], CHECKPOINT_STATE_BUDGET, SIZE_ADVICE):
            raise PermanentError(reason)
        try:
            await self.api.create(self.collection, body)
        except ApiError as exc:
            if exc.conflict:
                return
            if exc.too_large:
                raise PermanentError(
                    f"{what} was refused as too large ({exc.message}): {SIZE_ADVICE}"
                ) from None
            if self._session is not None:
                await self._session.raise_refusal(exc, what)
            raise

    # ---- reading -------------------------------------------------------------------------------------

    async def _select(self, selector: str) -> list[JsonDict]:
        items: list[JsonDict] = []
        async for page in self.api.list_pages(
            self.collection, label_selector=f"{RUN_LABEL}={self.run},{selector}"
        ):
            items.extend(page)
        return items

    def _merged(self, states: list[JsonDict], writes: list[JsonDict]) -> dict[str, list[Write]]:
        """Each State's pending writes as stored, merged as LangGraph's savers do: per (task, index), the
        first write of a regular channel counts and the last of a special one (error, interrupt,
        resume); in writes_sort_key order (task path, task id, index)."""
        epochs = {s["spec"]["id"]: s["spec"]["leaseEpoch"] for s in states}
        by_parent: dict[str, list[JsonDict]] = {}
        for entry in writes:
            parent = entry["spec"].get("parent")
            # Readers ignore records written under an older lease epoch than the checkpoint they name.
            if parent in epochs and entry["spec"]["leaseEpoch"] >= epochs[parent]:
                by_parent.setdefault(parent, []).append(entry)
        merged: dict[str, list[Write]] = {}
        for parent, entries in by_parent.items():
            entries.sort(key=lambda e: (e["spec"]["sequence"], e["metadata"]["name"]))
            found: dict[tuple[str, int], Write] = {}
            for entry in entries:
                state = entry["spec"]["state"]
                task_id, task_path = state["taskId"], state.get("taskPath", "")
                for idx, channel, value in state["writes"]:
                    key = (task_id, int(idx))
                    if key in found and channel not in WRITES_IDX_MAP:
                        continue
                    # inline as [type, base64] (also before the store), or {type, data} / {type, ref}
                    stored = value if isinstance(value, dict) else {"type": value[0], "data": value[1]}
                    found[key] = Write(task_id, task_path, int(idx), channel, stored)
            merged[parent] = sorted(found.values(), key=lambda w: (w.task_path, w.task_id, w.idx))
        return merged

    def _know_writes(self, states: list[JsonDict], writes: list[JsonDict]) -> None:
        """Remembers the Writes objects read for these States (the next checkpoint records them)."""
        by_parent: dict[str, list[JsonDict]] = {}
        for entry in writes:
            by_parent.setdefault(str(entry["spec"].get("parent")), []).append(entry)
        for state in states:
            name = state["spec"]["id"]
            self._shared.epochs[name] = int(state["spec"]["leaseEpoch"])
            known = self._shared.write_bodies.setdefault(name, {})
            self._shared.write_bodies.move_to_end(name)
            for entry in by_parent.get(name, []):
                known[entry["metadata"]["name"]] = entry
                self._shared.writes[name] = max(self._shared.writes.get(name, 0), entry["spec"]["sequence"])
        while len(self._shared.write_bodies) > _KNOWN_PARENTS:
            self._shared.write_bodies.popitem(last=False)

    async def _decode_writes(self, writes: list[Write]) -> list[PendingWrite]:
        found: list[PendingWrite] = []
        for write in writes:
            what = f"the pending write {write.idx} of task {write.task_id}"
            if "ref" in write.stored:
                blobs = await self._reading_blobs(what)
                value = await blobs.load_value(write.stored, self.serde, what)
            else:
                value = self.serde.loads_typed(_decode([write.stored["type"], write.stored["data"]]))
                if self._shared.blobs is not None:
                    self._shared.blobs.remember_value(write.digest(), value)
            found.append((write.task_id, write.channel, value))
        return found

    async def _pending_writes(
        self, states: list[JsonDict], writes: list[JsonDict]
    ) -> dict[str, list[PendingWrite]]:
        """Each State's pending writes, merged and decoded (values in the store read and verified)."""
        self._know_writes(states, writes)
        merged = self._merged(states, writes)
        return {parent: await self._decode_writes(found) for parent, found in merged.items()}

    async def _tuple(self, state: JsonDict, pending: list[PendingWrite]) -> CheckpointTuple:
        spec = state["spec"]
        stored = spec["state"]
        thread = spec["thread"]
        self._shared.sequences[spec["id"]] = spec["sequence"]
        self._shared.seeds[spec["id"]] = ancestry.seeds_of(stored)
        self._shared.epochs[spec["id"]] = int(spec["leaseEpoch"])
        self._shared.writes.setdefault(spec["id"], 0)
        if (manifest := await self._manifest_of(state)) is not None:
            blobs = await self._reading_blobs(f"the checkpoint {spec['id']}")
            read = await manifests.read_manifest(blobs, manifest, self.serde)
            checkpoint: LangGraphCheckpoint = read.checkpoint  # type: ignore[assignment]
            metadata: CheckpointMetadata = read.metadata  # type: ignore[assignment]
        else:
            checkpoint = self.serde.loads_typed(_decode(stored["checkpoint"]))
            metadata = self.serde.loads_typed(_decode(stored["metadata"]))
        configurable = {"thread_id": thread["id"], "checkpoint_ns": thread["ns"]}
        parent_id = stored.get("parentCheckpointId")
        return CheckpointTuple(
            config={"configurable": {**configurable, "checkpoint_id": stored["checkpointId"]}},
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config={"configurable": {**configurable, "checkpoint_id": parent_id}}
            if parent_id
            else None,
            pending_writes=pending,
        )

    async def _manifest_of(self, state: JsonDict) -> Document | None:
        """The manifest a State checkpoint names (read and verified), or None: saved inline."""
        ref = self._manifest_ref(state)
        if ref is None:
            return None
        blobs = await self._reading_blobs(f"the checkpoint {state['spec']['id']}")
        return await blobs.document(ref, MANIFEST_KIND)

    def _manifest_ref(self, state: JsonDict) -> BlobRef | None:
        raw = (state.get("spec") or {}).get("stateRef")
        if raw is None:
            return None
        try:
            ref = BlobRef.from_json(raw)
        except ValueError as exc:
            name = state["spec"].get("id")
            raise StateUnverifiable(f"the checkpoint {name} names no readable manifest: {exc}") from None
        self._shared.manifests[state["spec"]["id"]] = ref
        return ref

    def _is_langgraph(self, body: JsonDict | None, thread_id: str | None = None, ns: str = "") -> bool:
        """A State checkpoint this saver wrote (of that thread and namespace, when given)."""
        spec = (body or {}).get("spec") or {}
        thread = spec.get("thread")
        return (
            spec.get("kind", "State") == CheckpointKind.STATE
            and spec.get("runName") == self.run
            and isinstance(thread, dict)
            and (thread_id is None or thread == {"id": thread_id, "ns": ns})
            and isinstance(spec.get("state"), dict)
            and "checkpointId" in spec["state"]
            and ("checkpoint" in spec["state"] or isinstance(spec.get("stateRef"), dict))
        )

    async def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config.get("configurable") or {}
        thread_id, ns = str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            name: str | None = self.state_name(thread_id, ns, checkpoint_id)
        elif self._is_runs_thread(thread_id, ns):
            name = self._shared.pointer  # where the Run continues from, not the newest object
        else:
            states = await self._select(f"{KIND_LABEL}=State,{NAMESPACE_LABEL}={_digest(thread_id, ns)}")
            states = [s for s in states if self._is_langgraph(s, thread_id, ns)]
            if not states:
                return None
            name = max(states, key=lambda s: str(s["spec"]["state"]["checkpointId"]))["metadata"]["name"]
        if name is None:
            return None
        state = await self.api.get(self.api.custom_path("checkpoints", self.namespace, name))
        if (
            not checkpoint_id
            and self._is_runs_thread(thread_id, ns)
            and not self._is_langgraph(state, thread_id, ns)
            and forks.is_fork_copy(state)
        ):
            assert state is not None
            name = await self._continue_fork(state, thread_id, ns)
            state = await self.api.get(self.api.custom_path("checkpoints", self.namespace, name))
        if not self._is_langgraph(state, thread_id, ns):
            return None  # absent, or not a LangGraph checkpoint of this thread (ctx.checkpoint's own)
        assert state is not None
        if checkpoint_id and state["spec"]["state"]["checkpointId"] != checkpoint_id:
            return None
        writes = await self._select(f"{KIND_LABEL}=Writes,{PARENT_LABEL}={_digest(name)}")
        return await self._tuple(state, (await self._pending_writes([state], writes)).get(name, []))

    async def _list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        configurable = (config or {}).get("configurable") or {}
        thread_id, ns = str(configurable.get("thread_id", "")), str(configurable.get("checkpoint_ns", ""))
        if "thread_id" not in configurable:
            selector = ""
        elif "checkpoint_ns" in configurable:
            selector = f",{NAMESPACE_LABEL}={_digest(thread_id, ns)}"
        else:
            selector = f",{THREAD_LABEL}={_digest(thread_id)}"
        states = [s for s in await self._select(f"{KIND_LABEL}=State{selector}") if self._is_langgraph(s)]
        if "thread_id" in configurable:
            states = [s for s in states if s["spec"]["thread"]["id"] == str(configurable["thread_id"])]
        if "checkpoint_ns" in configurable:
            states = [s for s in states if s["spec"]["thread"]["ns"] == str(configurable["checkpoint_ns"])]
        if wanted := get_checkpoint_id(config) if config else None:
            states = [s for s in states if s["spec"]["state"]["checkpointId"] == wanted]
        if before and (cursor := get_checkpoint_id(before)):
            states = [s for s in states if s["spec"]["state"]["checkpointId"] < cursor]
        states.sort(key=lambda s: str(s["spec"]["state"]["checkpointId"]), reverse=True)
        if not states:
            return
        writes = await self._select(f"{KIND_LABEL}=Writes{selector}")
        pending = await self._pending_writes(states, writes)
        count = 0
        for state in states:
            found = await self._tuple(state, pending.get(state["spec"]["id"], []))
            if filter and not all(found.metadata.get(k) == v for k, v in filter.items()):
                continue
            yield found
            count += 1
            if limit is not None and count >= limit:
                return

    async def _continue_fork(self, copy: JsonDict, thread_id: str, ns: str) -> str:
        """A fork's first Attempt, pointed at the operator's copy of the source's LangGraph checkpoint:
        saves the fork root (module forks: that checkpoint on this Run's thread, its manifest shared by
        digest), moves latestCheckpoint to it (fenced) and returns its name. Again in a later Attempt
        that resumes from the copy: the root exists already, and is the one continued from."""
        assert self._session is not None
        what = f"the forked checkpoint {copy['spec']['id']}"
        pointers = forks.inline_pointers(copy)
        if pointers is None:
            ref = self._manifest_ref(copy)
            assert ref is not None  # forks.is_fork_copy: inline pointers or a manifest
            blobs = await self._reading_blobs(what)
            header = (await blobs.document(ref, MANIFEST_KIND)).body
            pointers = {k: header[k] for k in forks.POINTERS if k in header}
        if not isinstance(pointers.get("checkpointId"), str):
            raise StateUnverifiable(f"{what} records no LangGraph checkpoint id: it cannot be continued")
        name = self.state_name(thread_id, ns, pointers["checkpointId"])
        labels = {
            KIND_LABEL: "State",
            THREAD_LABEL: _digest(thread_id),
            NAMESPACE_LABEL: _digest(thread_id, ns),
        }
        body = forks.root_checkpoint(
            copy,
            pointers,
            name=name,
            attempt=self.attempt,
            lease_epoch=self.lease_epoch,
            ledger_mark=await self._session.ledger_mark(),
            thread={"id": thread_id, "ns": ns},
            metadata=await self._owned_metadata(name, labels),
        )
        await self._create(body, f"the fork's first LangGraph checkpoint (Checkpoint {name}, from {what})")
        await self._session.fenced_status_write({"latestCheckpoint": name}, f"checkpoint {name}")
        self._shared.pointer = name
        return name

    # ---- delta channels: the history walk ------------------------------------------------------------

    async def _thread_states(
        self, thread_id: str, ns: str, channels: Sequence[str]
    ) -> tuple[dict[str, JsonDict], Mapping[str, Stored]]:
        """The State checkpoints of one thread and namespace by name: as stored, and decoded when the
        walk first reaches each (those in the store are read now: a walk over the Checkpoint objects is
        for checkpoints saved before delta seeds were recorded, all inline)."""
        listed = await self._select(f"{KIND_LABEL}=State,{NAMESPACE_LABEL}={_digest(thread_id, ns)}")
        found = {s["metadata"]["name"]: s for s in listed if self._is_langgraph(s, thread_id, ns)}
        loaded: dict[str, Stored] = {}
        for name, body in found.items():
            if self._manifest_ref(body) is not None:
                node = await self._node(body, thread_id, ns, channels)
                loaded[name] = node.stored
        return found, _Decoded(
            found, lambda name: loaded.get(name) or self._stored(found[name], thread_id, ns)
        )

    def _stored(self, body: JsonDict, thread_id: str, ns: str) -> Stored:
        spec = body["spec"]
        state = spec["state"]
        checkpoint: LangGraphCheckpoint = self.serde.loads_typed(_decode(state["checkpoint"]))
        parent_id = state.get("parentCheckpointId")
        return Stored(
            name=body["metadata"]["name"],
            sequence=int(spec["sequence"]),
            parent=self.state_name(thread_id, ns, parent_id) if parent_id else None,
            values=checkpoint["channel_values"],
            versions=checkpoint["channel_versions"],
        )

    async def _node(self, body: JsonDict, thread_id: str, ns: str, channels: Sequence[str] | None) -> _Node:
        """One State checkpoint as the walk reads it, from its Checkpoint object."""
        manifest = await self._manifest_of(body)
        if manifest is None:
            return _Node(self._stored(body, thread_id, ns), None)
        return await self._manifest_node(manifest, thread_id, ns, channels)

    async def _manifest_node(
        self, manifest: Document, thread_id: str, ns: str, channels: Sequence[str] | None
    ) -> _Node:
        """A checkpoint as the walk reads it from its manifest: the values of `channels` it stores
        (all when None), its versions, its parent."""
        blobs = await self._reading_blobs(f"the manifest {manifest.ref.key}")
        body = manifest.body
        core = manifests.core_of(manifest, self.serde)
        stored_channels = body.get("channels", {})
        wanted = list(stored_channels) if channels is None else [c for c in channels if c in stored_channels]
        values = {ch: await manifests.channel_value(blobs, manifest, ch, self.serde) for ch in wanted}
        parent_id = body.get("parentCheckpointId")
        stored = Stored(
            name=self.state_name(thread_id, ns, str(body["checkpointId"])),
            sequence=int(body.get("sequence", 0)),
            parent=self.state_name(thread_id, ns, str(parent_id)) if parent_id else None,
            values=values,
            versions=core.get("channel_versions") or {},
        )
        return _Node(stored, manifest)

    async def ancestry_of(
        self, target: JsonDict, thread_id: str, ns: str, channels: Sequence[str]
    ) -> tuple[dict[str, Stored], dict[str, list[PendingWrite]]]:
        """The ancestors of the State checkpoint `target` (its Checkpoint object) that the values of
        `channels` are rebuilt from, with their pending writes: the one place a thread's ancestry is
        resolved. A checkpoint whose manifest names its parent's is followed in the store (its parent's
        writes are in that manifest), so no Checkpoint object on the way is needed; a checkpoint saved
        inline is followed through the thread's Checkpoint objects. An ancestor that is missing is left
        out: ancestry.history then refuses (StateUnverifiable) instead of a shorter state."""
        states: dict[str, Stored] = {}
        pending: dict[str, list[PendingWrite]] = {}
        listed: tuple[dict[str, JsonDict], dict[str, list[JsonDict]]] | None = None

        async def inline() -> tuple[dict[str, JsonDict], dict[str, list[JsonDict]]]:
            """The thread's Checkpoint objects, listed once (two requests) when the walk needs one."""
            nonlocal listed
            if listed is None:
                selector = f"{NAMESPACE_LABEL}={_digest(thread_id, ns)}"
                bodies = await self._select(f"{KIND_LABEL}=State,{selector}")
                found = {b["metadata"]["name"]: b for b in bodies if self._is_langgraph(b, thread_id, ns)}
                by_parent: dict[str, list[JsonDict]] = {}
                for entry in await self._select(f"{KIND_LABEL}=Writes,{selector}"):
                    by_parent.setdefault(str(entry["spec"].get("parent")), []).append(entry)
                listed = found, by_parent
            return listed

        node = await self._node(target, thread_id, ns, channels)
        remaining = set(channels)
        while True:
            states[node.stored.name] = node.stored
            parent = node.stored.parent
            if parent is None or not remaining or parent in states:
                break
            linked = node.manifest.body.get("parentManifest") if node.manifest is not None else None
            parent_node: _Node | None = None
            if node.manifest is not None and isinstance(linked, str):
                blobs = await self._reading_blobs(f"the manifest {node.manifest.ref.key}")
                manifest = await blobs.document(node.manifest.named(linked), MANIFEST_KIND)
                parent_node = await self._manifest_node(manifest, thread_id, ns, channels)
            elif (parent_body := (await inline())[0].get(parent)) is not None:
                parent_node = await self._node(parent_body, thread_id, ns, channels)
            if node.manifest is not None:
                written = [w for w in manifests.parent_writes(node.manifest) if w.channel in remaining]
                pending[parent] = await self._decode_writes(written)
            elif parent_node is not None:
                bodies, writes = await inline()
                decoded = await self._pending_writes([bodies[parent]], writes.get(parent, []))
                pending[parent] = decoded.get(parent, [])
            if parent_node is None:
                break  # missing: history() names it
            node = parent_node
            remaining -= {ch for ch in remaining if ch in node.stored.values}
        return states, pending

    async def _delta_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        if not channels:
            return {}
        configurable = config.get("configurable") or {}
        thread_id, ns = str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))
        if checkpoint_id := get_checkpoint_id(config):
            target = self.state_name(thread_id, ns, checkpoint_id)
        elif (latest := await self._get_tuple(config)) is not None:
            target = self.state_name(thread_id, ns, latest.config["configurable"]["checkpoint_id"])
        else:
            raise StateUnverifiable(f"thread {thread_id!r} has no checkpoint to rebuild delta channels of")
        body = await self.api.get(self.api.custom_path("checkpoints", self.namespace, target))
        if not self._is_langgraph(body, thread_id, ns):
            raise StateUnverifiable(f"the checkpoint {target} is missing: its state cannot be rebuilt")
        assert body is not None
        states, pending = await self.ancestry_of(body, thread_id, ns, channels)
        return ancestry.history(target, states, pending, channels)

    # ---- writing -------------------------------------------------------------------------------------

    async def _sequence_of(self, name: str | None) -> int:
        if name is None:
            return 0
        if name not in self._shared.sequences or name not in self._shared.seeds:
            parent = await self.api.get(self.api.custom_path("checkpoints", self.namespace, name))
            spec = (parent or {}).get("spec") or {}
            self._shared.sequences[name] = int(spec.get("sequence", 0))
            self._shared.seeds[name] = ancestry.seeds_of(spec.get("state"))
            self._shared.epochs[name] = int(spec.get("leaseEpoch", 0))
            if parent is not None and self._is_langgraph(parent):
                self._manifest_ref(parent)
        return self._shared.sequences[name]

    async def _writes_of(self, parent: str) -> list[Write]:
        """The pending writes of `parent` this saver knows (read or written here), else as stored."""
        if parent not in self._shared.write_bodies:
            found = await self._select(f"{KIND_LABEL}=Writes,{PARENT_LABEL}={_digest(parent)}")
            state = {"spec": {"id": parent, "leaseEpoch": self._shared.epochs.get(parent, 0)}}
            self._know_writes([state], found)
        bodies = list(self._shared.write_bodies.get(parent, {}).values())
        state = {"spec": {"id": parent, "leaseEpoch": self._shared.epochs.get(parent, 0)}}
        return self._merged([state], bodies).get(parent, [])

    async def _parent(self, blobs: ThreadBlobs, parent: str | None) -> Parent:
        if parent is None:
            return Parent(None, {}, [])
        ref = self._shared.manifests.get(parent)
        manifest = await blobs.document(ref, MANIFEST_KIND) if ref is not None else None
        versions = manifests.core_of(manifest, self.serde).get("channel_versions", {}) if manifest else {}
        staged = self._shared.staged.get(parent, [])
        return Parent(manifest, versions, await self._writes_of(parent), list(staged))

    async def _delta_ancestry(
        self,
        *,
        thread_id: str,
        ns: str,
        name: str,
        sequence: int,
        parent: str | None,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
    ) -> ancestry.Recorded:
        """Where this checkpoint's delta channels are rebuilt from, from its parent's record; a parent
        saved without one (before deltaSeeds were recorded) is walked once."""
        parent_seeds = self._shared.seeds.get(parent, {}) if parent else None
        found = ancestry.record(name, sequence, checkpoint, metadata, parent_seeds)
        if found.unknown and parent is not None:
            _, states = await self._thread_states(thread_id, ns, sorted(found.unknown))
            walked = {ch: ancestry.seed_by_walking(parent, ch, states) for ch in found.unknown}
            known = {ch: seed for ch, seed in walked.items() if seed is not None}
            found = ancestry.record(name, sequence, checkpoint, metadata, {**(parent_seeds or {}), **known})
        return found

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config.get("configurable") or {}
        thread_id, ns = str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))
        parent_id = configurable.get("checkpoint_id")
        name = self.state_name(thread_id, ns, checkpoint["id"])
        parent = self.state_name(thread_id, ns, parent_id) if parent_id else None
        sequence = await self._sequence_of(parent) + 1
        merged_metadata = {**metadata}
        delta = await self._delta_ancestry(
            thread_id=thread_id,
            ns=ns,
            name=name,
            sequence=sequence,
            parent=parent,
            checkpoint=checkpoint,
            metadata=metadata,
        )
        stored: JsonDict = {"checkpointId": checkpoint["id"]}
        if parent_id:
            stored["parentCheckpointId"] = parent_id
        if delta.seeds:
            stored["deltaSeeds"] = {ch: seed.to_json() for ch, seed in sorted(delta.seeds.items())}
        spec: JsonDict = {
            "runName": self.run,
            "id": name,
            "sequence": sequence,
            "attempt": self.attempt,
            "leaseEpoch": self.lease_epoch,
            "step": f"langgraph:{metadata.get('source', '')}:{metadata.get('step', '')}"[:128],
            "kind": CheckpointKind.STATE.value,
            "thread": {"id": thread_id, "ns": ns},
            "state": stored,
        }
        if self._session is not None:
            # The Run's ledger as it stands (as ctx.checkpoint records it): a fork from this checkpoint
            # inherits exactly the records opened before it, and never sends again what they confirmed.
            spec["ledgerMark"] = await self._session.ledger_mark()
        if (blobs := await self._blobs()) is not None:
            header: JsonDict = {"checkpointId": checkpoint["id"], "sequence": sequence}
            if parent_id:
                header["parentCheckpointId"] = parent_id
            if delta.seeds:
                header["deltaSeeds"] = stored["deltaSeeds"]
            manifest = await manifests.write_manifest(
                blobs,
                self.serde,
                await self._parent(blobs, parent),
                checkpoint=checkpoint,
                metadata=merged_metadata,
                new_versions=new_versions,
                header=header,
                link_parent=delta.base is not None,
            )
            spec["stateRef"] = manifest.ref.to_json()
        else:
            stored["checkpoint"] = _encode(self.serde.dumps_typed(checkpoint))
            stored["metadata"] = _encode(self.serde.dumps_typed(merged_metadata))
        if parent:
            spec["parent"] = parent
        if delta.base is not None:
            spec["deltaBase"] = delta.base.checkpoint
        labels = {
            KIND_LABEL: "State",
            THREAD_LABEL: _digest(thread_id),
            NAMESPACE_LABEL: _digest(thread_id, ns),
        }
        body = {
            "apiVersion": API_VERSION,
            "kind": "Checkpoint",
            "metadata": await self._owned_metadata(name, labels),
            "spec": spec,
        }
        await self._create(body, f"the LangGraph checkpoint {checkpoint['id']} (Checkpoint {name})")
        self._shared.sequences[name] = sequence
        self._shared.seeds[name] = delta.seeds
        self._shared.epochs[name] = self.lease_epoch
        self._shared.writes.setdefault(name, 0)
        if "stateRef" in spec:
            self._shared.manifests[name] = BlobRef.from_json(spec["stateRef"])
        self._shared.write_bodies.setdefault(name, {})
        if self._session is not None and self._is_runs_thread(thread_id, ns):
            # The Run continues from here: moved with the fences of ctx.checkpoint. The Run this worker
            # wrote last is checked and written with its resourceVersion (no read when nothing changed).
            run = await self._session.fenced_status_write({"latestCheckpoint": name}, f"checkpoint {name}")
            self._shared.pointer = name
            pause = run.spec.pause
            if pause and pause.request_id not in self._shared.paused:
                answered = {i.request_id for i in run.status.inputs or []}
                if pause.request_id not in answered:
                    raise PauseRequested(pause.request_id, pause.reason)
        return {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}
        }

    async def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config.get("configurable") or {}
        thread_id, ns = str(configurable["thread_id"]), str(configurable.get("checkpoint_ns", ""))
        checkpoint_id = str(configurable["checkpoint_id"])
        parent = self.state_name(thread_id, ns, checkpoint_id)
        if parent not in self._shared.write_bodies:
            # a checkpoint this saver neither wrote nor read: learn its writes
            found = await self._select(f"{KIND_LABEL}=Writes,{PARENT_LABEL}={_digest(parent)}")
            state = {"spec": {"id": parent, "leaseEpoch": self._shared.epochs.get(parent, 0)}}
            self._know_writes([state], found)
        sequence = self._shared.writes.get(parent, 0) + 1
        self._shared.writes[parent] = sequence
        name = f"{parent}-w{sequence}-{_digest(task_id, task_path, self.attempt)}"
        blobs = await self._blobs()
        serialized = [
            (WRITES_IDX_MAP.get(channel, idx), channel, value, self.serde.dumps_typed(value))
            for idx, (channel, value) in enumerate(writes)
        ]
        entries = []
        if blobs is None:
            entries = [[idx, channel, _encode(typed)] for idx, channel, _, typed in serialized]
        else:
            # Known before any put: the checkpoint LangGraph saves next may be saved meanwhile, and its
            # new list items are these values (one blob, put once).
            staged = self._shared.staged.setdefault(parent, [])
            self._shared.staged.move_to_end(parent)
            while len(self._shared.staged) > _KNOWN_PARENTS:
                self._shared.staged.popitem(last=False)
            for idx, channel, value, typed in serialized:
                digest = manifests.sha256(typed[1])
                blobs.remember_value(digest, value)
                staged.append(Applied(task_path, task_id, idx, channel, typed[0], digest))
            # the values' puts at once (independent); the Writes object that names them, after all
            puts = await manifests.all_of([blobs.store_value(typed) for _, _, _, typed in serialized])
            for (idx, channel, _, _), (stored, _) in zip(serialized, puts, strict=True):
                entries.append([idx, channel, stored])
        writes_state: JsonDict = {"taskId": task_id, "writes": entries}
        if task_path:
            writes_state["taskPath"] = task_path
        labels = {
            KIND_LABEL: "Writes",
            THREAD_LABEL: _digest(thread_id),
            NAMESPACE_LABEL: _digest(thread_id, ns),
            PARENT_LABEL: _digest(parent),
        }
        body = {
            "apiVersion": API_VERSION,
            "kind": "Checkpoint",
            "metadata": await self._owned_metadata(name, labels),
            "spec": {
                "runName": self.run,
                "id": name,
                "sequence": sequence,
                "parent": parent,
                "attempt": self.attempt,
                "leaseEpoch": self.lease_epoch,
                "kind": CheckpointKind.WRITES.value,
                "thread": {"id": thread_id, "ns": ns},
                # the checkpoint they belong to is spec.parent; no step (the task is): fewer fields
                # than a State checkpoint, each one stored twice (the object and its managedFields)
                "state": writes_state,
            },
        }
        await self._create(body, f"the pending writes of task {task_id} (Checkpoint {name})")
        self._shared.write_bodies.setdefault(parent, {})[name] = body
        self._shared.write_bodies.move_to_end(parent)
        while len(self._shared.write_bodies) > _KNOWN_PARENTS:
            self._shared.write_bodies.popitem(last=False)

    async def _delete_thread(self, thread_id: str) -> None:
        if self._session is not None:
            raise PermanentError(
                "an attempt Pod never deletes Checkpoints: only the operator does (retention)"
            )
        selector = f"{RUN_LABEL}={self.run},{THREAD_LABEL}={_digest(thread_id)}"
        await self.api.request("DELETE", self.collection, query={"labelSelector": selector})
        self._shared.sequences.clear()
        self._shared.seeds.clear()
        self._shared.writes.clear()
        self._shared.epochs.clear()
        self._shared.manifests.clear()
        self._shared.write_bodies.clear()
        self._shared.staged.clear()

    # ---- the async API -------------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        async for found in self._list(config, filter=filter, before=before, limit=limit):
            yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self._put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._delete_thread(thread_id)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """LangGraph's delta-channel history (beta API), walked here over the thread's Checkpoints: a
        missing ancestor or missing Writes raise StateUnverifiable instead of a shorter history."""
        return await self._delta_history(config, channels)

    # ---- the sync API: the same coroutines, on this saver's own event loop ----------------------------

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        with self._shared.loop_lock:
            if self._shared.loop is None:
                self._shared.loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._shared.loop.run_forever, name="agentrun-saver", daemon=True
                ).start()
        return asyncio.run_coroutine_threadsafe(coroutine, self._shared.loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._call(self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self._list(config, filter=filter, before=before, limit=limit)]

        return iter(self._call(collect()))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._call(self._put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._call(self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._call(self._delete_thread(thread_id))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._call(self._delta_history(config, channels))

    def close(self) -> None:
        """Stops the sync API's event loop (the KubeApi stays the caller's)."""
        if self._shared.loop is not None:
            self._shared.loop.call_soon_threadsafe(self._shared.loop.stop)
            self._shared.loop = None
