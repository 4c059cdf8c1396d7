"""A principal per agent namespace on the bundled object store (versitygw v1.8.0 with its internal IAM,
the real server the local control plane runs): a namespace's credentials get and put under its own
prefix only, are refused (403) on another namespace's data, and cannot delete or list; the read-only
principal only reads. Made idempotently: a rerun keeps the credentials a Secret already holds."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun.statestore import BlobStore, StoreRefused, StoreTimeouts, parse_store_url
from agentrun.statestore.principals import Access, BundledStore, access_key
from devcluster.objectstore import Credentials, ObjectStoreProcess, s3_request

REPO = Path(__file__).resolve().parents[2]
RUN_UID = "5d1c6e0a-2f7b-4f3e-9a51-3c1b0d7e9f42"
QUICK = StoreTimeouts(connect_seconds=1, request_seconds=2, retries=1, retry_budget_seconds=3)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStoreProcess]:
    subprocess.run(["bash", str(REPO / "hack/build-versitygw.sh")], check=True, timeout=1800)
    workdir = tmp_path_factory.mktemp("versitygw")
    process = ObjectStoreProcess(workdir / "data", workdir / "versitygw.log")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def request(
    server: ObjectStoreProcess, method: str, key: str, credentials: Credentials, body: bytes = b""
) -> int:
    path = f"/{server.bucket}/{key}" if key else f"/{server.bucket}"
    status, _ = s3_request(method, server.endpoint, path, body=body, credentials=credentials)
    return status


def test_a_namespaces_credentials_reach_its_own_prefix_only_and_never_delete(
    server: ObjectStoreProcess,
) -> None:
    team_a = server.namespace_credentials("team-a")
    server.namespace_credentials("team-b")
    root = server.credentials
    assert team_a.access_key == access_key("team-a", Access.WRITE) != root.access_key
    assert request(server, "PUT", "team-b/run/sha256/theirs", root, b"b's state") == 200

    assert request(server, "PUT", "team-a/run/sha256/mine", team_a, b"a's state") == 200
    assert request(server, "GET", "team-a/run/sha256/mine", team_a) == 200
    assert request(server, "HEAD", "team-a/run/sha256/mine", team_a) == 200
    # another namespace's data: neither read nor written
    assert request(server, "GET", "team-b/run/sha256/theirs", team_a) == 403
    assert request(server, "PUT", "team-b/run/sha256/planted", team_a, b"forged") == 403
    # outside every namespace's prefix, and a prefix that merely starts alike
    assert request(server, "PUT", "archives/forged", team_a, b"forged") == 403
    assert request(server, "PUT", "team-ab/run/sha256/x", team_a, b"forged") == 403
    # never delete, never list
    assert request(server, "DELETE", "team-a/run/sha256/mine", team_a) == 403
    assert request(server, "GET", "team-a/run/sha256/mine", root) == 200  # still there
    assert request(server, "GET", "", team_a) == 403


def test_the_read_only_principal_reads_its_namespace_and_writes_nothing(server: ObjectStoreProcess) -> None:
    writer = server.namespace_credentials("team-r")
    reader = server.namespace_credentials("team-r", Access.READ)
    assert request(server, "PUT", "team-r/run/sha256/state", writer, b"state") == 200

    assert request(server, "GET", "team-r/run/sha256/state", reader) == 200
    assert request(server, "PUT", "team-r/run/sha256/other", reader, b"x") == 403
    assert request(server, "DELETE", "team-r/run/sha256/state", reader) == 403


def test_the_blob_store_client_works_with_a_namespaces_credentials_and_is_refused_elsewhere(
    server: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an attempt Pod does: obstore, put-if-absent and a verified read, as the namespace."""
    for name, value in server.namespace_credentials("team-c").env().items():
        monkeypatch.setenv(name, value)
    store = BlobStore.from_url(server.url, timeouts=QUICK)

    async def scenario() -> None:
        ref = await store.put("team-c", RUN_UID, b"checkpoint of team-c")
        assert await store.put("team-c", RUN_UID, b"checkpoint of team-c") == ref  # 412, then verified
        assert await store.get(ref) == b"checkpoint of team-c"
        with pytest.raises(StoreRefused):
            await store.put("team-d", RUN_UID, b"planted in team-d")

    asyncio.run(scenario())


def test_ensuring_again_keeps_the_held_credentials_and_one_statement_each(server: ObjectStoreProcess) -> None:
    first = server.namespace_credentials("team-e")
    again = server.namespace_credentials("team-e", held=first)
    assert again == first
    assert request(server, "PUT", "team-e/run/sha256/x", first, b"x") == 200

    # a Secret whose credentials the server lost (e.g. a crash before the user was made): made to match
    lost = Credentials.new(access_key("team-e", Access.WRITE))
    assert server.namespace_credentials("team-e", held=lost) == lost
    assert request(server, "PUT", "team-e/run/sha256/y", lost, b"y") == 200
    assert request(server, "PUT", "team-e/run/sha256/z", first, b"z") == 403

    bundled = BundledStore(parse_store_url(server.url), server.credentials)
    statements = bundled.policy()["Statement"]
    principals = [json.dumps(s["Principal"]) for s in statements]
    assert len(principals) == len(set(principals))
    assert bundled.statement("team-e", Access.WRITE) in statements


def test_a_namespace_that_is_gone_is_granted_nothing_and_the_policy_stays_small(
    server: ObjectStoreProcess,
) -> None:
    """The bucket policy holds a statement per principal and the server bounds its size (versitygw keeps
    it in one extended attribute): a namespace's grant is taken back when it goes."""
    bundled = BundledStore(parse_store_url(server.url), server.credentials)
    before = bundled.policy()["Statement"]
    gone = server.namespace_credentials("team-gone")
    server.namespace_credentials("team-gone", Access.READ)
    assert request(server, "PUT", "team-gone/run/sha256/x", gone, b"x") == 200

    server.forget_namespace("team-gone")

    assert request(server, "PUT", "team-gone/run/sha256/y", gone, b"y") == 403
    assert bundled.policy()["Statement"] == before
    server.forget_namespace("team-gone")  # again: nothing to take back


def test_a_namespace_taken_back_loses_its_users_and_statements_and_no_other(
    server: ObjectStoreProcess,
) -> None:
    """What the operator does once a namespace is gone (operator.store_principals): the server's users and
    its policy's principals are read back as core.store_principals reads them; the take-back removes the
    namespace's statements and users, runs again harmlessly, and leaves every other principal alone."""
    bundled = BundledStore(parse_store_url(server.url), server.credentials)
    for namespace in ("team-went", "team-kept"):
        for access in Access:
            server.namespace_credentials(namespace, access)
    kept = server.namespace_credentials("team-kept")  # made again: new credentials, the last ones
    went = {access_key("team-went", access) for access in Access}
    held = bundled.principals()
    assert went <= held.users and went <= held.granted
    assert {"team-went", "team-kept"} <= held.namespaces() and held.complete("team-went")
    assert server.credentials.access_key not in held.users  # the root is no user of the IAM

    bundled.take_back("team-went")

    after = bundled.principals()
    assert not went & (after.users | after.granted)
    assert "team-went" not in after.namespaces() and after.complete("team-kept")
    assert request(server, "PUT", "team-kept/run/sha256/x", kept, b"x") == 200
    bundled.take_back("team-went")  # again: nothing left to take
    assert bundled.principals() == after


def test_a_full_bucket_policy_is_a_named_refusal_and_a_namespace_taken_back_makes_room(
    server: ObjectStoreProcess,
) -> None:
    """versitygw's posix backend keeps the bucket policy in one extended attribute of the bucket
    directory, whose size the filesystem bounds (4 KiB on ext4; 64 KiB on any Linux filesystem): namespaces
    are made until the server refuses the policy. The refusal names the policy and its size, the
    namespaces made before keep their principals apart, and taking a gone namespace's principals back
    makes room for the refused one."""
    bundled = BundledStore(parse_store_url(server.url), server.credentials)
    made: list[str] = []
    refused: StoreRefused | None = None
    for number in range(400):  # 64 KiB hold fewer than 220 namespaces on any filesystem
        namespace = f"full-{number:03d}"
        try:
            for access in Access:
                server.namespace_credentials(namespace, access)
        except StoreRefused as error:
            refused = error
            break
        made.append(namespace)
    assert refused is not None, "the bucket policy grew past any extended attribute's size"
    assert refused.operation == "put-bucket-policy" and "bytes" in str(refused)
    assert len(made) >= 2
    first, last, waiting = made[0], made[-1], f"full-{len(made):03d}"
    assert waiting not in bundled.principals().namespaces() or not bundled.principals().complete(waiting)

    credentials = server.namespace_credentials(first)
    assert request(server, "PUT", f"{first}/run/sha256/x", credentials, b"x") == 200
    assert request(server, "GET", f"{first}/run/sha256/x", credentials) == 200
    assert request(server, "PUT", f"{last}/run/sha256/x", credentials, b"x") == 403
    assert request(server, "DELETE", f"{first}/run/sha256/x", credentials) == 403
    assert request(server, "GET", "", credentials) == 403

    server.forget_namespace(last)  # gone: its statements leave the policy
    for access in Access:
        server.namespace_credentials(waiting, access)
    after = bundled.principals()
    assert after.complete(waiting) and last not in after.namespaces()
    for namespace in [*made[:-1], waiting]:
        server.forget_namespace(namespace)
