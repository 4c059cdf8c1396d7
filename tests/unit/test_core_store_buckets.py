"""A bucket per agent namespace: the naming rule, which bucket a key is in, and the URL a namespace's own
clients are given (agentrun.core.store_buckets), and the operator's store routing by it."""

from __future__ import annotations

import re

import pytest

from agentrun.core.pods import StateStorePodEnv
from agentrun.core.store_buckets import (
    key_namespace,
    may_be_namespace_bucket,
    namespace_bucket,
    namespace_url,
    per_namespace,
    with_namespace_buckets,
)
from agentrun.statestore import BlobStore, StoreConfigError, parse_store_url

S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
LONG_NS = "a" * 63
URL = "s3://agentrun/runs?endpoint=http://127.0.0.1:7070&region=us-east-1&buckets=namespace"


@pytest.mark.parametrize(
    ("base", "namespace", "bucket"),
    [
        ("agentrun", "team-a", "agentrun-team-a"),
        ("agentrun", "a", "agentrun-a"),
        ("state", "x" * 57, "state-" + "x" * 57),  # exactly 63: kept whole
        # 64 and more: the namespace cut short, and 8 hex digits of sha256("base/namespace")
        ("state", "x" * 58, "state-" + "x" * 48 + "-" + "b988a2b9"),
        ("agentrun", LONG_NS, "agentrun-" + "a" * 45 + "-" + "a1df6682"),
        # a cut that ends on a hyphen drops it: no "--" in the name
        ("agentrun", "b" * 44 + "-" + "c" * 18, "agentrun-" + "b" * 44 + "-" + "d17a1763"),
    ],
)
def test_a_namespace_bucket_is_named_after_the_base_and_the_namespace(
    base: str, namespace: str, bucket: str
) -> None:
    named = namespace_bucket(base, namespace)
    assert named == bucket
    assert S3_BUCKET.match(named) and "--" not in named
    assert named == namespace_bucket(base, namespace)  # the same on every call
    assert may_be_namespace_bucket(base, named)


def test_long_namespaces_that_share_their_start_get_different_buckets() -> None:
    first, second = "a" * 62 + "b", "a" * 62 + "c"
    assert namespace_bucket("agentrun", first) != namespace_bucket("agentrun", second)
    assert len(namespace_bucket("agentrun", first)) == 63


@pytest.mark.parametrize(
    ("base", "namespace"),
    [
        ("Agentrun", "team-a"),  # uppercase: no S3 bucket
        ("agent.run", "team-a"),  # dots: not kept in namespace buckets
        ("ab", "team-a"),  # too short a base
        ("a" * 41, "team-a"),  # a base over 40 leaves no room for a namespace and a digest
        ("agentrun", "Team-A"),  # not a namespace name
        ("agentrun", "_archives"),
        ("agentrun", ""),
    ],
)
def test_a_name_that_cannot_make_a_valid_bucket_is_refused(base: str, namespace: str) -> None:
    with pytest.raises(ValueError):
        namespace_bucket(base, namespace)


@pytest.mark.parametrize(
    ("prefix", "key", "namespace"),
    [
        ("runs", "runs/team-a/uid-1/sha256/" + "0" * 64, "team-a"),  # a blob
        ("", "team-a/uid-1/sha256/" + "0" * 64, "team-a"),
        ("runs", "runs/_quarantine/team-a/uid-1/sha256/" + "0" * 64, "team-a"),  # its quarantine copy
        ("runs", "runs/_archives/team-a/triage/uid-1.json", "team-a"),  # an archive
        ("runs", "runs/_archives/team-a/_index/", "team-a"),  # a listing of one namespace's index
        ("runs", "runs/team-a", "team-a"),  # a listing of one namespace
        ("runs", "runs/_archives/", None),  # a listing of every namespace's archives
        ("runs", "runs/_archives", None),
        ("runs", "runs", None),  # the whole store
        ("", "", None),
        ("runs", "runs/_other/x", None),  # not a namespace's: the base bucket
        ("runs", "other/team-a/x", None),  # outside the prefix
        ("runs", "runs/Team-A/x", None),
    ],
)
def test_a_key_is_in_its_namespace_s_bucket(prefix: str, key: str, namespace: str | None) -> None:
    assert key_namespace(prefix, key) == namespace


@pytest.mark.parametrize(
    ("url", "namespace", "expected"),
    [
        (URL, "team-a", "s3://agentrun-team-a/runs?endpoint=http://127.0.0.1:7070&region=us-east-1"),
        ("s3://agentrun?buckets=namespace", "team-a", "s3://agentrun-team-a"),
        ("s3://agentrun?buckets=namespace&region=eu-west-1", "b", "s3://agentrun-b?region=eu-west-1"),
        # one bucket: every namespace is given the store's own URL
        ("s3://agentrun/runs?region=eu-west-1", "team-a", "s3://agentrun/runs?region=eu-west-1"),
        ("file:///srv/state", "team-a", "file:///srv/state"),
    ],
)
def test_a_namespace_is_given_its_own_bucket_s_plain_url(url: str, namespace: str, expected: str) -> None:
    assert namespace_url(url, namespace) == expected
    assert not per_namespace(expected)
    assert StateStorePodEnv(url, "agentrun-state-store").env(namespace)[0] == {
        "name": "AGENTRUN_STATE_STORE_URL",
        "value": expected,
    }


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://agentrun?endpoint=http://h:1", "s3://agentrun?endpoint=http://h:1&buckets=namespace"),
        ("s3://agentrun", "s3://agentrun?buckets=namespace"),
        ("s3://agentrun?buckets=namespace", "s3://agentrun?buckets=namespace"),
    ],
)
def test_the_option_is_added_once(url: str, expected: str) -> None:
    assert with_namespace_buckets(url) == expected
    assert parse_store_url(expected).per_namespace


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://agentrun?buckets=one", "takes 'namespace'"),
        ("s3://Agent.Run?buckets=namespace", "names the namespaces' buckets"),
        ("gs://agentrun?buckets=namespace", "unknown option 'buckets' for gs://"),
    ],
)
def test_a_url_whose_buckets_option_cannot_work_is_refused(url: str, message: str) -> None:
    with pytest.raises(StoreConfigError, match=message):
        parse_store_url(url)


@pytest.mark.parametrize(
    ("key", "bucket"),
    [
        ("runs/team-a/uid-1/sha256/" + "0" * 64, "agentrun-team-a"),
        ("runs/_quarantine/team-a/uid-1/sha256/" + "0" * 64, "agentrun-team-a"),
        ("runs/_archives/team-b/triage/uid-1.json", "agentrun-team-b"),
        ("runs/_archives/", "agentrun"),
        ("runs/_other/x", "agentrun"),
    ],
)
def test_the_store_reads_and_writes_a_key_in_its_namespace_s_bucket(key: str, bucket: str) -> None:
    routed = BlobStore.from_url(URL, env={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"})
    assert routed.bucket_for(key) == bucket
    single = BlobStore.from_url(URL.removesuffix("&buckets=namespace"), env={})
    assert single.bucket_for(key) == "agentrun"  # one bucket: every key in it
