"""A principal per agent namespace on the bundled object store (versitygw v1.8.0 with its internal IAM,
the real server the local control plane runs), granted in a bucket of the namespace's own: a namespace's
credentials get and put under its own prefix in its own bucket only, are refused (403) on another
namespace's bucket, and cannot delete or list; the read-only principal only reads (and lists its own
bucket). Made idempotently: a rerun keeps the credentials a Secret already holds. No policy grows with
the number of namespaces: far more namespaces than one shared policy held are made, each apart."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrun.core.store_buckets import namespace_bucket
from agentrun.statestore import BlobStore, StoreRefused, StoreTimeouts, parse_store_url
from agentrun.statestore.operatorstore import OperatorStore
from agentrun.statestore.principals import Access, BundledStore, access_key
from devcluster.objectstore import Credentials, ObjectStoreProcess, s3_request

REPO = Path(__file__).resolve().parents[2]
RUN_UID = "5d1c6e0a-2f7b-4f3e-9a51-3c1b0d7e9f42"
QUICK = StoreTimeouts(connect_seconds=1, request_seconds=2, retries=1, retry_budget_seconds=3)
# One policy for every namespace held 12 on ext4 (versitygw keeps it in one extended attribute).
OLD_LIMIT = 12


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


def bundled(server: ObjectStoreProcess) -> BundledStore:
    return BundledStore(parse_store_url(server.url), server.credentials)


def bucket_of(server: ObjectStoreProcess, namespace: str) -> str:
    return namespace_bucket(server.bucket, namespace)


def request(
    server: ObjectStoreProcess,
    method: str,
    key: str,
    credentials: Credentials,
    body: bytes = b"",
    *,
    bucket: str | None = None,
    query: str = "",
) -> int:
    """A request for `key` in `bucket` (by default the bucket of the key's namespace: its first
    segment, or the one after `_archives/`); "" for the bucket itself."""
    if bucket is None:
        parts = key.split("/")
        bucket = bucket_of(server, parts[1] if parts[0] == "_archives" else parts[0])
    path = f"/{bucket}/{key}" if key else f"/{bucket}"
    status, _ = s3_request(method, server.endpoint, path, query=query, body=body, credentials=credentials)
    return status


def test_a_namespaces_credentials_reach_its_own_bucket_and_prefix_only_and_never_delete(
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
    # another namespace's bucket: neither read nor written
    assert request(server, "GET", "team-b/run/sha256/theirs", team_a) == 403
    assert request(server, "PUT", "team-b/run/sha256/planted", team_a, b"forged") == 403
    # nor the base bucket, nor another prefix of its own bucket (archives are the operator's to write)
    own = bucket_of(server, "team-a")
    assert request(server, "PUT", "team-a/run/sha256/x", team_a, b"forged", bucket=server.bucket) == 403
    assert request(server, "PUT", "team-b/run/sha256/x", team_a, b"forged", bucket=own) == 403
    assert request(server, "PUT", "_archives/team-a/forged.json", team_a, b"forged") == 403
    assert request(server, "PUT", "team-ab/run/sha256/x", team_a, b"forged", bucket=own) == 403
    # never delete, never list
    assert request(server, "DELETE", "team-a/run/sha256/mine", team_a) == 403
    assert request(server, "GET", "team-a/run/sha256/mine", root) == 200  # still there
    assert request(server, "GET", "", team_a, bucket=own) == 403
    assert request(server, "GET", "", team_a, bucket=server.bucket) == 403


def test_the_bucket_of_a_namespace_keeps_versions_and_its_policy_only_that_namespace(
    server: ObjectStoreProcess,
) -> None:
    server.namespace_credentials("team-v")
    server.namespace_credentials("team-v", Access.READ)
    status, body = s3_request(
        "GET",
        server.endpoint,
        f"/{bucket_of(server, 'team-v')}",
        query="versioning=",
        credentials=server.credentials,
    )
    assert status == 200 and b"<Status>Enabled</Status>" in body
    statements = bundled(server).policy(bucket_of(server, "team-v"))["Statement"]
    named = {p for s in statements for p in s["Principal"]["AWS"]}
    assert named == {access_key("team-v", access) for access in Access}
    assert bundled(server).policy()["Statement"] == []  # the base bucket grants no namespace anything


def test_the_read_only_principal_reads_its_namespace_and_archives_and_writes_nothing(
    server: ObjectStoreProcess,
) -> None:
    writer = server.namespace_credentials("team-r")
    reader = server.namespace_credentials("team-r", Access.READ)
    server.namespace_credentials("team-s")
    root = server.credentials
    assert request(server, "PUT", "team-r/run/sha256/state", writer, b"state") == 200
    assert request(server, "PUT", "_archives/team-r/run/uid.json", root, b"archive") == 200
    assert request(server, "PUT", "team-s/run/sha256/state", root, b"theirs") == 200

    assert request(server, "GET", "team-r/run/sha256/state", reader) == 200
    assert request(server, "GET", "_archives/team-r/run/uid.json", reader) == 200
    assert request(server, "GET", "", reader, bucket=bucket_of(server, "team-r")) == 200  # `history`
    assert request(server, "PUT", "team-r/run/sha256/other", reader, b"x") == 403
    assert request(server, "PUT", "_archives/team-r/run/forged.json", reader, b"x") == 403
    assert request(server, "DELETE", "team-r/run/sha256/state", reader) == 403
    assert request(server, "GET", "team-s/run/sha256/state", reader) == 403
    assert request(server, "GET", "", reader, bucket=bucket_of(server, "team-s")) == 403


def test_the_blob_store_client_works_with_a_namespaces_credentials_and_is_refused_elsewhere(
    server: ObjectStoreProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an attempt Pod does: obstore, put-if-absent and a verified read, as the namespace, with the
    namespace's own URL (what the operator gives its Pods), or with the store's (it routes by key)."""
    for name, value in server.namespace_credentials("team-c").env().items():
        monkeypatch.setenv(name, value)
    server.namespace_credentials("team-d")  # its bucket exists: refused there (403)

    async def scenario(store: BlobStore) -> None:
        ref = await store.put("team-c", RUN_UID, b"checkpoint of team-c")
        assert await store.put("team-c", RUN_UID, b"checkpoint of team-c") == ref  # 412, then verified
        assert await store.get(ref) == b"checkpoint of team-c"
        with pytest.raises(StoreRefused, match="403"):
            await store.put("team-d", RUN_UID, b"planted in team-d")
        with pytest.raises(StoreRefused):  # a namespace never made (with the store's URL: no bucket)
            await store.put("team-none", RUN_UID, b"planted")

    own = BlobStore.from_url(server.namespace_url("team-c"), timeouts=QUICK)
    assert own.location.bucket == bucket_of(server, "team-c") and not own.location.per_namespace
    asyncio.run(scenario(own))
    asyncio.run(scenario(BlobStore.from_url(server.url, timeouts=QUICK)))


def test_the_operators_store_spans_the_base_bucket_and_every_namespace_bucket(
    server: ObjectStoreProcess,
) -> None:
    """The operator's client (its root): each key in its namespace's bucket, a listing of the whole
    store across the buckets, a blob's quarantine copy in its own bucket, its versions listed there."""
    for namespace in ("span-a", "span-b"):
        server.namespace_credentials(namespace)
    store = OperatorStore.from_url(server.url, env=server.env(), timeouts=QUICK)

    async def scenario() -> None:
        a = await store.put("span-a", RUN_UID, b"a")
        b = await store.put("span-b", RUN_UID, b"b")
        assert await store.put_new(store.location.key("_archives", "span-a", "x", "u.json"), b"{}")
        assert await store.put_new(store.location.key("_other", "kept"), b"base")
        listed = {blob.key for blob in await store.list_blobs()}
        assert {a.key, b.key, "_archives/span-a/x/u.json", "_other/kept"} <= listed
        assert {blob.key for blob in await store.list_blobs("span-a")} == {a.key}
        # a namespace whose bucket is not made yet (it opts in later) holds nothing: no error
        assert await store.list_blobs("span-later") == []
        assert await store.list_keys("_archives/span-later/_index/") == []
        assert await store.list_folders("_archives/span-later/_index/") == []
        assert "_archives/span-a/" in await store.list_folders("_archives/")  # from span-a's bucket
        assert await store.list_keys("_archives/span-a/") == ["_archives/span-a/x/u.json"]
        assert await store.copy(a.key, f"_quarantine/{a.key}")
        assert request(server, "GET", a.key, server.credentials) == 200
        assert (
            request(
                server, "GET", f"_quarantine/{a.key}", server.credentials, bucket=bucket_of(server, "span-a")
            )
            == 200
        )
        assert request(server, "GET", "_other/kept", server.credentials, bucket=server.bucket) == 200
        versions = await store.versions(b.key)
        assert [v.size for v in versions] == [1]

    asyncio.run(scenario())


def test_ensuring_again_keeps_the_held_credentials_and_one_set_of_statements_each(
    server: ObjectStoreProcess,
) -> None:
    first = server.namespace_credentials("team-e")
    again = server.namespace_credentials("team-e", held=first)
    assert again == first
    assert request(server, "PUT", "team-e/run/sha256/x", first, b"x") == 200

    # a Secret whose credentials the server lost (e.g. a crash before the user was made): made to match
    lost = Credentials.new(access_key("team-e", Access.WRITE))
    assert server.namespace_credentials("team-e", held=lost) == lost
    assert request(server, "PUT", "team-e/run/sha256/y", lost, b"y") == 200
    assert request(server, "PUT", "team-e/run/sha256/z", first, b"z") == 403

    statements = bundled(server).policy(bucket_of(server, "team-e"))["Statement"]
    principals = [json.dumps(s["Principal"]) for s in statements]
    assert principals == [json.dumps({"AWS": [access_key("team-e", Access.WRITE)]})]
    assert statements == bundled(server).statements("team-e", Access.WRITE)


def test_a_namespace_that_is_gone_is_granted_nothing_and_its_bucket_keeps_its_objects(
    server: ObjectStoreProcess,
) -> None:
    """A namespace's grant is taken back when it goes; its bucket and objects stay, for the collector."""
    gone = server.namespace_credentials("team-gone")
    server.namespace_credentials("team-gone", Access.READ)
    assert request(server, "PUT", "team-gone/run/sha256/x", gone, b"x") == 200

    server.forget_namespace("team-gone")

    assert request(server, "PUT", "team-gone/run/sha256/y", gone, b"y") == 403
    assert request(server, "GET", "team-gone/run/sha256/x", gone) == 403
    assert bundled(server).policy(bucket_of(server, "team-gone"))["Statement"] == []
    assert request(server, "GET", "team-gone/run/sha256/x", server.credentials) == 200
    server.forget_namespace("team-gone")  # again: nothing to take back


def test_a_namespace_taken_back_loses_its_users_and_statements_and_no_other(
    server: ObjectStoreProcess,
) -> None:
    """What the operator does once a namespace is gone (operator.store_principals): the server's users and
    its policies' principals are read back as core.store_principals reads them; the take-back removes the
    namespace's statements and users, runs again harmlessly, and leaves every other principal alone."""
    store = bundled(server)
    for namespace in ("team-went", "team-kept"):
        for access in Access:
            server.namespace_credentials(namespace, access)
    kept = server.namespace_credentials("team-kept")  # made again: new credentials, the last ones
    went = {access_key("team-went", access) for access in Access}
    held = store.principals()
    assert went <= held.users and went <= held.granted
    assert {"team-went", "team-kept"} <= held.namespaces() and held.complete("team-went")
    assert server.credentials.access_key not in held.users  # the root is no user of the IAM

    store.take_back("team-went")

    after = store.principals()
    assert not went & (after.users | after.granted)
    assert "team-went" not in after.namespaces() and after.complete("team-kept")
    assert request(server, "PUT", "team-kept/run/sha256/x", kept, b"x") == 200
    store.take_back("team-went")  # again: nothing left to take
    assert store.principals() == after


def test_a_namespace_of_the_one_bucket_layout_is_moved_to_its_own_bucket_and_taken_back_from_both(
    server: ObjectStoreProcess,
) -> None:
    """A statement the base bucket's policy still holds for a namespace (the one-bucket layout) is stale:
    the namespace is not taken as granted, making it removes the statement, and so does its take-back."""
    store = bundled(server)
    stale = {
        "Effect": "Allow",
        "Principal": {"AWS": [access_key("team-old", Access.WRITE)]},
        "Action": ["s3:GetObject", "s3:PutObject"],
        "Resource": [f"arn:aws:s3:::{server.bucket}/team-old/*"],
    }
    store.put_user(Credentials.new(access_key("team-old", Access.WRITE)))  # the server checks principals
    store.put_policy({"Version": "2012-10-17", "Statement": [stale]})
    held = store.principals()
    assert "team-old" in held.namespaces() and not held.complete("team-old")
    for access in Access:
        server.namespace_credentials("team-old", access)
    assert store.policy()["Statement"] == [] and store.principals().complete("team-old")

    store.put_policy({"Version": "2012-10-17", "Statement": [stale]})
    store.take_back("team-old")
    assert store.policy()["Statement"] == [] and "team-old" not in store.principals().namespaces()


def test_far_more_namespaces_than_one_policy_held_each_work_apart_and_are_taken_back(
    server: ObjectStoreProcess,
) -> None:
    """One policy for every namespace held 12 (versitygw keeps a bucket's policy in one extended
    attribute of its directory): with a bucket each, 30 namespaces (one with a name of 63 characters,
    whose bucket is named with a digest) are made, each puts and reads its own objects and is refused
    its neighbour's bucket, delete and listing; each read principal reads only; all are taken back."""
    store = bundled(server)
    namespaces = [f"many-{number:03d}" for number in range(3 * OLD_LIMIT - 7)] + ["m" * 63]
    assert len(namespaces) == 30 and len({bucket_of(server, n) for n in namespaces}) == 30
    writers, readers = {}, {}
    for namespace in namespaces:
        writers[namespace] = server.namespace_credentials(namespace)
        readers[namespace] = server.namespace_credentials(namespace, Access.READ)
    held = store.principals()
    assert all(held.complete(n) for n in namespaces)

    for index, namespace in enumerate(namespaces):
        neighbour = namespaces[(index + 1) % len(namespaces)]
        writer, reader = writers[namespace], readers[namespace]
        key = f"{namespace}/run/sha256/state"
        assert request(server, "PUT", key, writer, namespace.encode()) == 200
        assert request(server, "GET", key, writer) == 200
        assert request(server, "GET", key, reader) == 200
        assert request(server, "PUT", f"{namespace}/run/sha256/other", reader, b"x") == 403
        assert request(server, "PUT", f"{neighbour}/run/sha256/planted", writer, b"x") == 403
        assert request(server, "DELETE", key, writer) == 403
        assert request(server, "GET", "", writer, bucket=bucket_of(server, namespace)) == 403
        assert request(server, "GET", "", reader, bucket=bucket_of(server, neighbour)) == 403
    for index, namespace in enumerate(namespaces):  # every object is written now: 403, never 404
        neighbour = namespaces[(index + 1) % len(namespaces)]
        assert request(server, "GET", f"{neighbour}/run/sha256/state", writers[namespace]) == 403
        assert request(server, "GET", f"{neighbour}/run/sha256/state", readers[namespace]) == 403

    for namespace in namespaces:
        server.forget_namespace(namespace)
    after = store.principals()
    assert not set(namespaces) & after.namespaces()
    assert request(server, "PUT", f"{namespaces[0]}/run/sha256/y", writers[namespaces[0]], b"y") == 403
