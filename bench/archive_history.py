"""`kubectl agentrun history` and `describe --archived` with 10,000 archives, on the local control plane's
object store (versitygw, started alone here): how long listing a namespace's archived Runs and reading
one archive take, and what an index append costs at that size.

    PYTHONPATH=hack .venv/bin/python bench/archive_history.py [--archives 10000]

The index is seeded in its own format (full chains of statestore.archives.CHAIN_LENGTH entries, as
index_archive leaves them) rather than by 10,000 appends, so the seeding takes seconds; then appends,
`history` and `describe --archived` go through the same functions the operator and the CLI use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path

from agentrun.statestore import BlobStore
from agentrun.statestore import archives as stored
from agentrun.statestore.documents import encode_document
from devcluster.objectstore import ObjectStoreProcess

NS = "team-a"
DAY = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


def entry(number: int, store: BlobStore) -> stored.ArchiveEntry:
    uid = f"00000000-0000-4000-8000-{number:012d}"
    name = f"run-{number}"
    return stored.ArchiveEntry(
        NS,
        name,
        uid,
        "Succeeded",
        "2026-12-02T08:00:00Z",
        "2026-12-02T08:01:00Z",
        f"2026-12-02T09:{number // 600 % 60:02d}:{number % 60:02d}Z",
        stored.archive_key(store, NS, name, uid),
        "0" * 64,
        4096,
        1,
        {"inputTokens": 1200, "outputTokens": 300, "modelCalls": 3},
    )


async def seed(store: BlobStore, count: int) -> None:
    prefix = stored.index_prefix(store, NS) + DAY.strftime("%Y-%m-%d") + "/"
    entries = [entry(n, store) for n in range(count)]
    chains = [entries[i : i + stored.CHAIN_LENGTH] for i in range(0, count, stored.CHAIN_LENGTH)]
    for chain, members in enumerate(chains):
        body = {"namespace": NS, "entries": [e.to_json() for e in members]}
        key = f"{prefix}{chain:06d}-{len(members) - 1:06d}.json"
        await store.put_new(key, encode_document(stored.INDEX_KIND, [], body))


async def timed(job: Awaitable[object]) -> float:
    started = time.perf_counter()
    await job
    return time.perf_counter() - started


async def measure(store: BlobStore, count: int, repeats: int) -> dict[str, object]:
    await seed(store, count)
    # one real archive, appended on top of the seeded index, for describe --archived
    summary = stored.RunSummary(NS, "described", "described-uid", "Succeeded", None, None, 1, None)
    document = {"attempts": [{"metadata": {"name": "described-a1"}}], "story": []}
    written = await stored.write_archive(store, summary, "1", document, DAY)
    append = [await timed(stored.index_archive(store, written))]
    for number in range(count, count + repeats):
        append.append(await timed(stored.index_archive(store, entry(number, store))))
    history = [await timed(stored.archived_runs(store, NS)) for _ in range(repeats)]
    listed = await stored.archived_runs(store, NS)
    describe = [await timed(stored.read_archive(store, NS, "described")) for _ in range(repeats)]
    return {
        "archives": len(listed),
        "chains": -(-len(listed) // stored.CHAIN_LENGTH),
        "history_seconds_median": round(statistics.median(history), 3),
        "history_seconds_max": round(max(history), 3),
        "describe_archived_seconds_median": round(statistics.median(describe), 3),
        "index_append_seconds_median": round(statistics.median(append), 3),
        "index_append_seconds_max": round(max(append), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archives", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        server = ObjectStoreProcess(Path(work) / "store", Path(work) / "store.log")
        server.make_dirs()
        server.start()
        try:
            store = BlobStore.from_url(server.url, env=server.env())
            results = asyncio.run(measure(store, args.archives, args.repeats))
        finally:
            server.stop()
    json.dump(results, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
