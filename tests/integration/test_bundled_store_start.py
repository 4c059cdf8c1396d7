"""The operator's start with the bundled state store (AGENTRUN_STATE_STORE_PROVISION=versitygw), against
the real server (versitygw, started as the chart starts it: without its bucket): the operator creates the
bucket with versioning on, again harmlessly at each start, waits for a server that is still starting (its
StatefulSet comes up beside the operator), and stops its start with a clear error when the server refuses
its root credentials or never answers."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun.operator.__main__ import BUNDLED_STORE_WAIT_ENV, require_bundled_bucket
from agentrun.operator.settings import OperatorSettings
from agentrun.operator.store_credentials import BucketNotReady, bundled_store, prepare_bucket
from agentrun.statestore.principals import BundledStore
from devcluster.objectstore import Credentials, ObjectStoreProcess, s3_request
from devcluster.processes import free_port
from support.clock import FakeClock

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def versitygw_built() -> None:
    subprocess.run(["bash", str(REPO / "hack/build-versitygw.sh")], check=True, timeout=1800)


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[ObjectStoreProcess]:
    """A server with no bucket yet, as the chart's StatefulSet starts it."""
    process = ObjectStoreProcess(tmp_path / "data", tmp_path / "versitygw.log", prepare_at_start=False)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def operator_store(server: ObjectStoreProcess, credentials: Credentials | None = None) -> BundledStore:
    """The bundled store as the operator configured by the chart sees it: its URL, told to provision, the
    server's root in its AWS_* environment."""
    config = OperatorSettings(state_store_url=server.url, state_store_provision=True)
    bundled = bundled_store(config, (credentials or server.credentials).env())
    assert bundled is not None
    return bundled


def root_request(server: ObjectStoreProcess, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """A request as the server's root; `path` may end with ?versions or ?versioning."""
    path, _, sub = path.partition("?")
    query = f"{sub}=" if sub else ""
    return s3_request(method, server.endpoint, path, query=query, body=body, credentials=server.credentials)


def test_the_operator_creates_the_bucket_with_versioning_on_at_each_start(
    fresh: ObjectStoreProcess, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = f"/{fresh.bucket}"
    status, body = root_request(fresh, "GET", f"{bucket}?versioning")
    assert status == 404 and b"NoSuchBucket" in body, "a fresh server has no bucket"
    clock = FakeClock()
    started = clock.monotonic()
    with caplog.at_level(logging.INFO, logger="agentrun.operator"):
        asyncio.run(prepare_bucket(operator_store(fresh), clock, within=60))
        asyncio.run(prepare_bucket(operator_store(fresh), clock, within=60))  # a restart: the same, no error
    assert clock.monotonic() == started, "no waiting for a server that answers"
    status, body = root_request(fresh, "GET", f"{bucket}?versioning")
    assert status == 200 and b"<Status>Enabled</Status>" in body
    ready = [r.getMessage() for r in caplog.records if "versioning Enabled" in r.getMessage()]
    said = f"state store bucket {fresh.bucket} at {fresh.endpoint} is there with versioning Enabled"
    assert ready == [said, said]
    # versioning is really on: a key written twice keeps both versions
    for content in (b"first", b"second"):
        assert root_request(fresh, "PUT", f"{bucket}/team-a/key", content)[0] == 200
    status, listing = root_request(fresh, "GET", f"{bucket}?versions")
    assert status == 200
    assert len(re.findall(rb"<Version>", listing)) == 2, listing[:600]


def test_the_operator_waits_for_a_server_that_is_still_starting(tmp_path: Path) -> None:
    """Its first request finds nothing listening; the server starts during the operator's wait (its
    clock's sleep starts it, so nothing depends on timing); the bucket is then made."""
    server = ObjectStoreProcess(tmp_path / "data", tmp_path / "versitygw.log", prepare_at_start=False)
    slept: list[float] = []

    class StartingServer(FakeClock):
        async def sleep(self, seconds: float) -> None:
            slept.append(seconds)
            if not server.alive():
                server.start()
            await super().sleep(seconds)

    try:
        asyncio.run(prepare_bucket(operator_store(server), StartingServer(), within=60))
        assert slept == [1.0], "one wait, then the server answered"
        status, body = root_request(server, "GET", f"/{server.bucket}?versioning")
        assert status == 200 and b"<Status>Enabled</Status>" in body
    finally:
        server.stop()


def test_a_server_that_refuses_the_root_credentials_stops_the_start_at_once(
    fresh: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = Credentials.new()
    clock = FakeClock()
    with pytest.raises(BucketNotReady) as refused:
        asyncio.run(prepare_bucket(operator_store(fresh, wrong), clock, within=60))
    assert clock.monotonic() == FakeClock().monotonic(), "not retried: the same credentials cannot pass"
    message = str(refused.value)
    assert f"refused to prepare bucket {fresh.bucket}" in message
    assert "must be the server's root" in message
    assert wrong.secret_key not in message
    # the operator's start: the reason logged, exit code 2
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", wrong.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong.secret_key)
    config = OperatorSettings(state_store_url=fresh.url, state_store_provision=True)
    with caplog.at_level(logging.ERROR, logger="agentrun.operator"), pytest.raises(SystemExit) as exited:
        asyncio.run(require_bundled_bucket(config, FakeClock()))
    assert exited.value.code == 2
    assert any("refused to prepare bucket" in r.getMessage() for r in caplog.records)
    status, _ = root_request(fresh, "GET", f"/{fresh.bucket}?versioning")
    assert status == 404, "nothing was made with the wrong credentials"


def test_a_server_that_never_answers_stops_the_start_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    nobody = f"s3://agentrun?endpoint=http://127.0.0.1:{free_port()}&region=us-east-1"
    root = Credentials.new()
    config = OperatorSettings(state_store_url=nobody, state_store_provision=True)
    bundled = bundled_store(config, root.env())
    assert bundled is not None
    clock = FakeClock()
    started = clock.monotonic()
    with pytest.raises(BucketNotReady) as waited:
        asyncio.run(prepare_bucket(bundled, clock, within=5))
    assert clock.monotonic() - started == 5.0, "waited the whole time given, one second at a time"
    assert "did not answer within 5 s" in str(waited.value)
    assert "app.kubernetes.io/component=state-store" in str(waited.value)
    # an operator without the bundled store does not ask at all
    monkeypatch.setenv(BUNDLED_STORE_WAIT_ENV, "0")
    asyncio.run(require_bundled_bucket(OperatorSettings(state_store_url=nobody), FakeClock()))
    # one told to provision without the server's root credentials stops at once, saying so
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(SystemExit) as exited:
        asyncio.run(require_bundled_bucket(config, FakeClock()))
    assert exited.value.code == 2
