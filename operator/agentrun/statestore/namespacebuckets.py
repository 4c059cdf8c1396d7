"""The buckets of a store that keeps a bucket per namespace (`buckets=namespace`,
agentrun.core.store_buckets): listed with S3 ListBuckets, signed with the client's own access keys, for a
listing of every namespace (the collector's sweep, the archives of every namespace)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from xml.etree import ElementTree

from .errors import StoreRefused, StoreUnavailable
from .location import StoreLocation
from .sigv4 import DEFAULT_REGION, S3Credentials, signed_request, transient_status, xml_local_name


def signing_region(location: StoreLocation, env: Mapping[str, str]) -> str:
    options = location.options
    return options.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION


def signing_endpoint(location: StoreLocation, env: Mapping[str, str]) -> str:
    return location.options.get("endpoint") or f"https://s3.{signing_region(location, env)}.amazonaws.com"


def list_buckets(location: StoreLocation, env: Mapping[str, str] | None = None) -> list[str]:
    """The names of the buckets the client's credentials (`env`, else the process environment) see on
    the location's server. StoreRefused when it says no (or there are no access keys to sign with),
    StoreUnavailable when it cannot answer now."""
    values = os.environ if env is None else env
    access, secret = values.get("AWS_ACCESS_KEY_ID"), values.get("AWS_SECRET_ACCESS_KEY")
    endpoint = signing_endpoint(location, values)
    if not access or not secret:
        raise StoreRefused("list buckets", endpoint, "no S3 access key to sign ListBuckets with")
    names: list[str] = []
    query: dict[str, str] = {}
    while True:
        status, body = signed_request(
            "GET",
            endpoint,
            "/",
            credentials=S3Credentials(access, secret),
            query=query,
            region=signing_region(location, values),
            session_token=values.get("AWS_SESSION_TOKEN") or None,
        )
        if status != 200:
            detail = f"HTTP {status}: {body[:300]!r}"
            if transient_status(status):
                raise StoreUnavailable("list buckets", endpoint, detail)
            raise StoreRefused("list buckets", endpoint, detail)
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError as error:
            raise StoreUnavailable("list buckets", endpoint, f"an answer that is not XML: {error}") from None
        names += [
            (element.text or "").strip()
            for bucket in root.iter()
            if xml_local_name(bucket.tag) == "Bucket"
            for element in bucket
            if xml_local_name(element.tag) == "Name"
        ]
        tokens = (e for e in root if xml_local_name(e.tag) == "ContinuationToken")
        token = next(((e.text or "").strip() for e in tokens), "")
        if not token or token == query.get("continuation-token"):
            return sorted(names)
        query = {"continuation-token": token}
