"""`kubectl agentrun history` and `describe --archived` on a file:// store: the archive index listed, an
archived Run's timeline rendered as `describe` renders a live one, and clear errors when the Run was
never archived or its archive was changed. Without AGENTRUN_STATE_STORE_URL the CLI reads the
namespace's read-only Secret from the API server, or says what to set and which Secret and verb it
lacks: tests/integration/test_state_store_worker.py and test_devcluster_store.py."""

from __future__ import annotations

import argparse
import asyncio
import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from agentrun.cli import timeline
from agentrun.cli.cluster import Cluster
from agentrun.cli.commands import history, inspect
from agentrun.cli.context import Context
from agentrun.cli.errors import CliError
from agentrun.cli.output import Output
from agentrun.core import archive
from agentrun.core.runs import World
from agentrun.statestore import BlobStore
from agentrun.statestore import archives as stored
from support.clock import FakeClock
from unit.factories import NAMESPACE, NOW, RUN, RUN_UID, make_attempt, make_run, make_side_effect, run_status

ARCHIVED = datetime(2026, 3, 1, 13, 0, tzinfo=UTC)


def finished_world() -> World:
    status = run_status("Succeeded", current=1, lease_epoch=1, usage={"inputTokens": 1200, "modelCalls": 3})
    return World(
        run=make_run(status),
        attempts={1: make_attempt(1, phase="Succeeded")},
        pods={},
        lease=None,
        now=NOW,
        side_effects=(make_side_effect("k1"),),
    )


def archive_it(url: str, world: World, uid: str = RUN_UID) -> stored.ArchiveEntry:
    async def write() -> stored.ArchiveEntry:
        store = BlobStore.from_url(url)
        fields = archive.run_summary(world, NOW)
        summary = stored.RunSummary(
            NAMESPACE,
            RUN,
            uid,
            fields["phase"],
            fields["createdTime"],
            fields["finishedTime"],
            fields["attempts"],
            fields["usage"],
        )
        entry = await stored.write_archive(store, summary, "42", archive.archive_document(world), ARCHIVED)
        await stored.index_archive(store, entry)
        return entry

    return asyncio.run(write())


def run_command(command: str, fmt: str = "table", **options: object) -> str:
    out = io.StringIO()
    output = Output(fmt, out=out, err=io.StringIO())
    ctx = Context(Cluster(None, NAMESPACE, FakeClock(NOW)), output)  # type: ignore[arg-type]
    given = {"run": RUN, "archived": True, "uid": None, "all_namespaces": False, **options}
    args = argparse.Namespace(**given)
    call = history.history if command == "history" else inspect.describe
    asyncio.run(call(ctx, args))
    return out.getvalue()


@pytest.fixture
def store_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"file://{tmp_path}/store"
    monkeypatch.setenv("AGENTRUN_STATE_STORE_URL", url)
    return url


def test_history_lists_archived_runs_from_the_index(store_url: str) -> None:
    archive_it(store_url, finished_world())
    archive_it(store_url, finished_world(), uid="9d1e0c3b-recreated")
    lines = run_command("history").splitlines()
    assert lines[0].split() == [
        "NAMESPACE", "NAME", "UID", "PHASE", "CREATED", "FINISHED", "ARCHIVED", "ATTEMPTS", "USAGE"
    ]  # fmt: skip
    assert [line.split()[2] for line in lines[1:]] == [RUN_UID, "9d1e0c3b-recreated"], "both archives"
    assert "1200 input" in lines[1]


def test_describe_archived_shows_the_timeline_describe_shows_for_the_live_run(store_url: str) -> None:
    world = finished_world()
    entry = archive_it(store_url, world)
    shown = run_command("describe")
    assert f"Archived:      2026-03-01T13:00:00Z (uid {RUN_UID}; sha256 {entry.sha256}, verified)" in shown
    live = timeline.describe(world.run, list(world.attempts.values()), [], list(world.side_effects), NOW)
    for section in ("Timeline (UTC)", "Usage", "Side effects"):
        assert section in live
        assert live.split(section, 1)[1].split("\n\n")[0] in shown, section
    assert "Next" not in shown, "no command is suggested for a Run that is gone"


def test_describe_archived_by_uid_and_its_errors(store_url: str, tmp_path: Path) -> None:
    entry = archive_it(store_url, finished_world())
    with pytest.raises(CliError, match="no archive of Run triage with uid nope"):
        run_command("describe", uid="nope")
    archived_file = tmp_path / "store" / entry.key
    archived_file.write_bytes(archived_file.read_bytes().replace(b"Succeeded", b"Sucseeded"))
    with pytest.raises(CliError, match="cannot be verified"):
        run_command("describe")
