"""agentrun.integrations.langgraph.ancestry without a cluster: on real graphs run with LangGraph's own
InMemorySaver, the walk answers LangGraph's delta-channel history exactly as InMemorySaver does and the
recorded base is the oldest ancestor that walk reads; with an ancestor or its writes gone, it refuses
(StateUnverifiable) where LangGraph's default walk returns a shorter history."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple, PendingWrite
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, Overwrite, Send, interrupt
from typing_extensions import TypedDict

from agentrun.api import FailureClass
from agentrun.api.run import DEFAULT_RETRY_ON
from agentrun.integrations.langgraph.ancestry import Recorded, Stored, history, record, seed_by_walking
from agentrun.worker.errors import StateUnverifiable
from agentrun.worker.main import _termination


def append(state: list[Any], writes: list[Any]) -> list[Any]:
    return [*state, *(item for write in writes for item in write)]


class Loop(TypedDict, total=False):
    log: Annotated[list[str], DeltaChannel(append, snapshot_frequency=3)]
    other: Annotated[list[str], DeltaChannel(append, snapshot_frequency=5)]
    n: int


class Sparse(TypedDict, total=False):
    """Snapshots so rare that no checkpoint of these tests stores the value: all replay from the root."""

    log: Annotated[list[str], DeltaChannel(append, snapshot_frequency=100)]
    other: Annotated[list[str], DeltaChannel(append, snapshot_frequency=100)]
    n: int


def step(state: Any) -> dict[str, Any]:
    n = state.get("n", 0)
    return {"log": [f"l{n}"], "other": [f"o{n}"] if n % 2 else [], "n": n + 1}


def loop(until: int = 12, reset_every: int = 0, schema: type[Any] = Loop) -> StateGraph[Any]:
    def reset(state: Any) -> dict[str, Any]:
        return {"log": Overwrite(["reset"])} if reset_every and state["n"] % reset_every == 0 else {}

    builder = StateGraph(schema)
    builder.add_node("step", step)
    builder.add_node("reset", reset)
    builder.add_edge(START, "step")
    builder.add_edge("step", "reset")
    builder.add_conditional_edges("reset", lambda s: END if s["n"] >= until else "step")
    return builder


CONFIG: RunnableConfig = {"configurable": {"thread_id": "t"}}


def run_loop(saver: InMemorySaver) -> None:
    graph = loop().compile(checkpointer=saver)
    graph.invoke({"log": ["start"]}, CONFIG)
    graph.update_state(CONFIG, {"log": ["by hand"]})


def run_without_snapshot(saver: InMemorySaver) -> None:
    loop(schema=Sparse).compile(checkpointer=saver).invoke({"log": ["start"]}, CONFIG)


def run_exit_durability(saver: InMemorySaver) -> None:
    graph = loop(schema=Sparse).compile(checkpointer=saver)
    for start in ({"log": ["start"]}, {"n": 0, "log": ["again"]}, {"n": 6, "log": ["third"]}):
        graph.invoke(start, CONFIG, durability="exit")


def run_reset(saver: InMemorySaver) -> None:
    loop(until=10, reset_every=4).compile(checkpointer=saver).invoke({"log": ["start"]}, CONFIG)


def run_fork(saver: InMemorySaver) -> None:
    graph = loop().compile(checkpointer=saver)
    graph.invoke({"log": ["start"]}, CONFIG)
    earlier = list(graph.get_state_history(CONFIG))[7].config
    graph.invoke(None, graph.update_state(earlier, {"log": ["fork"]}))


def run_interrupt(saver: InMemorySaver) -> None:
    def ask(state: Loop) -> dict[str, Any]:
        return {"log": [f"answer {interrupt('which?')}"]}

    builder = StateGraph(Loop)
    builder.add_node("step", step)
    builder.add_node("ask", ask)
    builder.add_edge(START, "step")
    builder.add_edge("step", "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"log": ["in"]}, CONFIG)
    graph.invoke(Command(resume="yes"), CONFIG)


class Job(TypedDict):
    n: int
    i: int


def run_fan_out(saver: InMemorySaver) -> None:
    """Parallel tasks write the same channel in one superstep: replayed in LangGraph's order."""

    def fan(state: Loop) -> list[Send]:
        return [Send("work", {"n": state.get("n", 0), "i": i}) for i in range(3)]

    def work(state: Job) -> dict[str, Any]:
        return {"log": [f"w{state['n']}.{state['i']}"]}

    def gather(state: Any) -> dict[str, Any]:
        return {"n": state.get("n", 0) + 1, "log": ["g"]}

    def again(state: Any) -> dict[str, Any]:
        return {}

    builder = StateGraph(Loop)
    builder.add_node("work", work)
    builder.add_node("gather", gather)
    builder.add_node("again", again)
    builder.add_conditional_edges(START, fan)
    builder.add_edge("work", "gather")
    builder.add_conditional_edges("gather", lambda s: END if s["n"] >= 4 else "again")
    builder.add_conditional_edges("again", fan)
    builder.compile(checkpointer=saver).invoke({"log": []}, CONFIG)


def run_subgraph(saver: InMemorySaver) -> None:
    builder = StateGraph(Loop)
    builder.add_node("inner", loop().compile(checkpointer=True))
    builder.add_edge(START, "inner")
    builder.add_edge("inner", END)
    builder.compile(checkpointer=saver).invoke({"log": ["start"]}, CONFIG)


@dataclass
class Thread:
    """One thread namespace as a saver stores it: what the walk reads, and each checkpoint's tuple."""

    ns: str
    states: dict[str, Stored]
    pending: dict[str, list[PendingWrite]]
    tuples: dict[str, CheckpointTuple]


def threads(saver: InMemorySaver) -> list[Thread]:
    found: dict[str, Thread] = {}
    for item in saver.list({"configurable": {"thread_id": "t"}}):
        ns, checkpoint_id = (
            item.config["configurable"]["checkpoint_ns"],
            item.config["configurable"]["checkpoint_id"],
        )
        thread = found.setdefault(ns, Thread(ns, {}, {}, {}))
        thread.tuples[checkpoint_id] = item
        thread.pending[checkpoint_id] = [
            (task, channel, saver.serde.loads_typed(value))
            for task, channel, value, _ in saver._ordered_writes("t", ns, checkpoint_id)
        ]
    for thread in found.values():
        sequences: dict[str, int] = {}
        for checkpoint_id in sorted(thread.tuples):  # ids grow: a parent comes before its children
            item = thread.tuples[checkpoint_id]
            parent = item.parent_config["configurable"]["checkpoint_id"] if item.parent_config else None
            sequences[checkpoint_id] = sequences[parent] + 1 if parent else 1
            thread.states[checkpoint_id] = Stored(
                checkpoint_id,
                sequences[checkpoint_id],
                parent,
                item.checkpoint["channel_values"],
                item.checkpoint["channel_versions"],
            )
    return list(found.values())


def recorded(thread: Thread) -> dict[str, Recorded]:
    """What the saver records when each checkpoint is put, from its parent's record (walking from the
    parent for a channel it recorded nothing of, as the saver does)."""
    records: dict[str, Recorded] = {}
    for checkpoint_id in sorted(thread.tuples):
        item, parent = thread.tuples[checkpoint_id], thread.states[checkpoint_id].parent
        seeds = records[parent].seeds if parent else None
        sequence = thread.states[checkpoint_id].sequence
        found = record(checkpoint_id, sequence, item.checkpoint, item.metadata, seeds)
        if found.unknown and parent:
            walked = {ch: seed_by_walking(parent, ch, thread.states) for ch in found.unknown}
            known = {ch: seed for ch, seed in walked.items() if seed is not None}
            found = record(
                checkpoint_id, sequence, item.checkpoint, item.metadata, {**(seeds or {}), **known}
            )
        records[checkpoint_id] = found
    return records


def replayed(item: CheckpointTuple, found: Recorded) -> list[str]:
    """The channels LangGraph asks the history of when it loads this checkpoint."""
    checkpoint = item.checkpoint
    return sorted(
        k
        for k in found.seeds
        if k in checkpoint["channel_versions"] and k not in checkpoint["channel_values"]
    )


def ancestors_read(thread: Thread, checkpoint_id: str, channels: list[str]) -> list[str]:
    """The ancestors LangGraph's walk reads for these channels (parent first)."""
    read, remaining = [], set(channels)
    cursor = thread.states[checkpoint_id].parent
    while cursor is not None and remaining:
        read.append(cursor)
        remaining -= set(thread.states[cursor].values)
        cursor = thread.states[cursor].parent
    return read


def config_of(thread: Thread, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": "t", "checkpoint_ns": thread.ns, "checkpoint_id": checkpoint_id}}


SCENARIOS: dict[str, Callable[[InMemorySaver], None]] = {
    "loop-with-snapshots-and-update-state": run_loop,
    "no-snapshot-yet": run_without_snapshot,
    "exit-durability": run_exit_durability,
    "overwrite": run_reset,
    "fork-from-an-earlier-checkpoint": run_fork,
    "interrupt-answered": run_interrupt,
    "parallel-tasks-write-one-channel": run_fan_out,
    "subgraph": run_subgraph,
}


@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_the_walk_answers_as_langgraph_and_the_base_is_the_oldest_ancestor_read(
    scenario: Callable[[InMemorySaver], None],
) -> None:
    saver = InMemorySaver()
    scenario(saver)
    walked = 0
    for thread in threads(saver):
        records = recorded(thread)
        for checkpoint_id, found in records.items():
            assert not found.unknown
            channels = replayed(thread.tuples[checkpoint_id], found)
            expected = saver.get_delta_channel_history(
                config=config_of(thread, checkpoint_id), channels=channels
            )
            assert history(checkpoint_id, thread.states, thread.pending, channels) == expected
            read = ancestors_read(thread, checkpoint_id, channels)
            assert (found.base.checkpoint if found.base else None) == (read[-1] if read else None)
            walked += len(read)
    assert walked > 0  # the scenario did replay delta channels


def test_a_parent_without_a_record_is_walked_to_the_same_seeds() -> None:
    saver = InMemorySaver()
    run_loop(saver)
    [thread] = threads(saver)
    unknown = 0
    for checkpoint_id, found in recorded(thread).items():
        parent, sequence = thread.states[checkpoint_id].parent, thread.states[checkpoint_id].sequence
        if parent is None:
            continue
        item = thread.tuples[checkpoint_id]
        blind = record(checkpoint_id, sequence, item.checkpoint, item.metadata, {})  # saved before deltaSeeds
        walked = {ch: seed_by_walking(parent, ch, thread.states) for ch in blind.unknown}
        assert walked == {ch: found.seeds[ch] for ch in blind.unknown}
        unknown += len(blind.unknown)
    assert unknown > 0


def latest(thread: Thread) -> str:
    return max(thread.tuples)


class ShortWalk(BaseCheckpointSaver[int]):
    """LangGraph's default walk (BaseCheckpointSaver.get_delta_channel_history) over a thread."""

    def __init__(self, thread: Thread) -> None:
        super().__init__()
        self.thread = thread

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        checkpoint_id = config["configurable"]["checkpoint_id"]
        if checkpoint_id not in self.thread.states:
            return None
        return self.thread.tuples[checkpoint_id]._replace(pending_writes=self.thread.pending[checkpoint_id])


def test_a_missing_ancestor_is_state_unverifiable_where_langgraph_returns_a_shorter_history() -> None:
    saver = InMemorySaver()
    run_without_snapshot(saver)  # the last checkpoint replays every ancestor's writes, from the root
    [thread] = threads(saver)
    records = recorded(thread)
    target = latest(thread)
    channels = replayed(thread.tuples[target], records[target])
    read = ancestors_read(thread, target, channels)
    assert len(read) == len(thread.states) - 1 > 20
    whole = history(target, thread.states, thread.pending, channels)
    gone = read[20]  # what retention used to prune: the 21st newest checkpoint
    del thread.states[gone]

    shorter = ShortWalk(thread).get_delta_channel_history(config=config_of(thread, target), channels=channels)
    assert len(shorter["log"]["writes"]) < len(whole["log"]["writes"])  # LangGraph's walk: silently shorter
    with pytest.raises(StateUnverifiable, match=f"its ancestor {gone} is missing"):
        history(target, thread.states, thread.pending, channels)


def test_missing_writes_of_an_ancestor_are_state_unverifiable() -> None:
    saver = InMemorySaver()
    run_loop(saver)
    [thread] = threads(saver)
    records = recorded(thread)
    target = latest(thread)
    channels = replayed(thread.tuples[target], records[target])
    parent = thread.states[target].parent
    assert parent is not None and any(w[1] in channels for w in thread.pending[parent])
    thread.pending[parent] = []
    with pytest.raises(StateUnverifiable, match=f"no write of it is stored for {parent}"):
        history(target, thread.states, thread.pending, channels)


def test_a_missing_target_is_state_unverifiable_and_no_channel_asks_nothing() -> None:
    saver = InMemorySaver()
    run_loop(saver)
    [thread] = threads(saver)
    assert history("absent", thread.states, thread.pending, []) == {}
    with pytest.raises(StateUnverifiable, match="absent is missing"):
        history("absent", thread.states, thread.pending, ["log"])


def test_state_unverifiable_is_reported_deterministic_with_its_reason_never_transient() -> None:
    report, code = _termination(StateUnverifiable("the state of checkpoint c-9 cannot be rebuilt"))
    assert (report["class"], report["reason"], code) == ("deterministic", "StateUnverifiable", 1)
    assert FailureClass.DETERMINISTIC not in DEFAULT_RETRY_ON
