"""The operator process's own set-up (python -m agentrun.operator)."""

from __future__ import annotations

import gc
import weakref

from agentrun.operator.__main__ import freeze_startup_objects


class Node:
    peer: Node | None = None


def test_startup_objects_leave_the_collectors_generations_but_garbage_is_collected_first() -> None:
    garbage = Node()
    garbage.peer = garbage  # a cycle: only the collector frees it
    collected = weakref.ref(garbage)
    del garbage
    kept = Node()
    kept.peer = Node()
    try:
        freeze_startup_objects()

        assert collected() is None  # not frozen for the life of the process
        assert gc.get_freeze_count() > 0
        assert not any(obj is kept for obj in gc.get_objects())  # no collection scans it again
    finally:
        gc.unfreeze()
