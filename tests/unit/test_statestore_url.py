"""The state store's one URL: the forms it takes, and the refusal of any URL that carries a credential
(with the credential never repeated in the error or the log)."""

from __future__ import annotations

import logging

import pytest

from agentrun.statestore import BlobStore, StoreConfigError, parse_store_url

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYzEXAMPLEKEY"


def test_an_s3_url_names_bucket_prefix_endpoint_and_region() -> None:
    location = parse_store_url("s3://agent-state/runs/v1?endpoint=http://127.0.0.1:7070&region=eu-west-1")
    assert (location.scheme, location.bucket, location.prefix) == ("s3", "agent-state", "runs/v1")
    assert dict(location.options) == {"endpoint": "http://127.0.0.1:7070", "region": "eu-west-1"}
    assert location.key("ns", "uid", "sha256", "ab") == "runs/v1/ns/uid/sha256/ab"
    # str() is the canonical URL, parsed back to the same location
    assert parse_store_url(str(location)) == location


@pytest.mark.parametrize(
    ("url", "scheme", "bucket", "prefix", "options"),
    [
        ("gs://state-bucket", "gs", "state-bucket", "", {}),
        ("gs://state-bucket/a/b/", "gs", "state-bucket", "a/b", {}),
        ("az://state/agents?account=acme01", "az", "state", "agents", {"account": "acme01"}),
        ("file:///var/lib/agentrun/state", "file", "/var/lib/agentrun/state", "", {}),
        ("file://localhost/srv/state/", "file", "/srv/state", "", {}),
        ("memory://", "memory", "", "", {}),
        ("memory://tests/one", "memory", "", "tests/one", {}),
    ],
)
def test_the_url_forms(url: str, scheme: str, bucket: str, prefix: str, options: dict[str, str]) -> None:
    location = parse_store_url(url)
    assert (location.scheme, location.bucket, location.prefix, dict(location.options)) == (
        scheme,
        bucket,
        prefix,
        options,
    )
    assert parse_store_url(str(location)) == location


@pytest.mark.parametrize(
    "url",
    [
        f"s3://AKIAIOSFODNN7EXAMPLE:{SECRET}@agent-state/runs",
        f"s3://{SECRET}@agent-state",
        f"s3://agent-state?secret_access_key={SECRET}",
        f"s3://agent-state?endpoint=http://127.0.0.1:7070&aws_session_token={SECRET}",
        f"s3://agent-state?endpoint=http://minio:{SECRET}@127.0.0.1:7070",
        f"s3://agent-state?endpoint=http://127.0.0.1:7070/?X-Amz-Signature={SECRET}",
        f"az://state?account=acme01&sig={SECRET}",
        f"az://state?account_key={SECRET}",
        f"gs://state?service_account_key={SECRET}",
        f"gs://state?token={SECRET}",
    ],
)
def test_a_url_with_credentials_is_refused_without_repeating_them(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StoreConfigError, match=r"credential|user info") as refused:
        BlobStore.from_url(url)
    assert SECRET not in str(refused.value)
    assert "AKIAIOSFODNN7EXAMPLE" not in str(refused.value)
    assert SECRET not in caplog.text


def test_opening_a_store_logs_where_it_is_and_no_credential_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    caplog.set_level(logging.DEBUG, logger="agentrun.statestore")
    store = BlobStore.from_url("s3://agent-state/runs?endpoint=http://127.0.0.1:1&region=us-east-1")
    assert store.location.bucket == "agent-state"
    assert "s3://agent-state/runs?endpoint=http" in caplog.text
    assert SECRET not in caplog.text
    assert "AKIAIOSFODNN7EXAMPLE" not in caplog.text


@pytest.mark.parametrize(
    "url",
    [
        "s3://agent-state/runs?endpoint=https://s3.example.internal&region=eu-west-1",
        "gs://state-bucket/runs",
        "az://state/runs?account=acme01&endpoint=http://127.0.0.1:10000/acme01",
        "memory://",
    ],
)
def test_each_scheme_opens_its_client_without_a_request(url: str) -> None:
    store = BlobStore.from_url(url)
    assert str(store.location) == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty"),
        ("ftp://host/dir", "unknown scheme 'ftp'"),
        (
            "s3://agent-state?regoin=us-east-1",
            "unknown option 'regoin' for s3:// \\(it takes: buckets, endpoint, region\\)",
        ),
        ("gs://state?endpoint=http://127.0.0.1:1", "unknown option 'endpoint' for gs://"),
        ("file:///tmp/state?region=x", "unknown option 'region' for file://"),
        ("s3://agent-state?region=a&region=b", "option 'region' twice"),
        ("s3:///runs", "names no valid bucket"),
        ("az:///runs", "names no valid container"),
        ("s3://agent-state/a//b", "invalid key prefix"),
        ("s3://agent-state/a/../b", "invalid key prefix"),
        ("s3://agent-state/a b", "invalid key prefix"),
        ("s3://agent-state?endpoint=127.0.0.1:7070", "endpoint must be an http\\(s\\) URL"),
        ("s3://agent-state?region=us east", "not a region name"),
        ("az://state?account=Not_An_Account", "not a storage account name"),
        ("file://server/share", "on this machine"),
        ("file:relative/dir", "absolute directory"),
        ("file:///srv/../etc", "'\\.' or '\\.\\.'"),
        ("s3://agent-state#frag", "fragment"),
    ],
)
def test_a_malformed_url_gets_a_clear_error(url: str, message: str) -> None:
    with pytest.raises(StoreConfigError, match=message):
        parse_store_url(url)
