"""A bucket per agent namespace: which bucket of the state store a key lives in (docs/state-store.md,
"Credentials per namespace").

A store URL with the option `buckets=namespace` (implied with the bundled server) keeps each namespace's
objects in a bucket of its own, so that each bucket's policy names that namespace's principals only: no
policy grows with the number of namespaces. Keys do not change; only the bucket is derived from the key's
namespace:

    <prefix>/<namespace>/<run uid>/sha256/<hex>     the namespace's bucket (blobs, as references name them)
    <prefix>/_quarantine/<namespace>/...            the namespace's bucket (the collector moves a blob there)
    <prefix>/_archives/<namespace>/...              the namespace's bucket (its people read them)
    anything else                                   the base bucket (the URL's)

A namespace's bucket is `<base>-<namespace>` when that fits in 63 characters, else the namespace cut short
and 8 hex digits of a digest of both names, so that it stays unique and is the same on every call. Pure
string functions: the operator (Pod env, routing) and the store's client take them alike.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from agentrun.core.collector import ARCHIVES_SEGMENT, QUARANTINE_SEGMENT

BUCKETS_OPTION: Final = "buckets"
PER_NAMESPACE: Final = "namespace"
# S3's bound on a bucket name; the base is kept whole, so it leaves room for a namespace and the digest.
BUCKET_MAX: Final = 63
BASE_MAX: Final = 40
_DIGEST_LENGTH: Final = 8
_NAMESPACE: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A base bucket that namespace buckets can be named after: lowercase letters, digits and hyphens.
_BASE: Final = re.compile(rf"^[a-z0-9][-a-z0-9]{{1,{BASE_MAX - 2}}}[a-z0-9]$")
# The namespace's own segment comes right after these (a namespace never starts with "_").
_NAMESPACED_FOLDERS: Final = frozenset({QUARANTINE_SEGMENT, ARCHIVES_SEGMENT})


def valid_base(base: str) -> bool:
    """Whether namespace buckets can be named after `base` (3 to 40 lowercase letters, digits, hyphens)."""
    return bool(_BASE.match(base)) and "--" not in base


def namespace_bucket(base: str, namespace: str) -> str:
    """The bucket of `namespace`'s objects: `<base>-<namespace>`, or, when that is longer than 63
    characters, `<base>-<namespace cut short>-<8 hex digits of sha256(base/namespace)>`."""
    if not valid_base(base):
        raise ValueError(f"not a base bucket namespace buckets can be named after: {base!r}")
    if not _NAMESPACE.match(namespace):
        raise ValueError(f"not a namespace name: {namespace!r}")
    whole = f"{base}-{namespace}"
    if len(whole) <= BUCKET_MAX:
        return whole
    digest = hashlib.sha256(f"{base}/{namespace}".encode()).hexdigest()[:_DIGEST_LENGTH]
    room = BUCKET_MAX - len(base) - 1 - 1 - _DIGEST_LENGTH
    return f"{base}-{namespace[:room].rstrip('-')}-{digest}"


def may_be_namespace_bucket(base: str, bucket: str) -> bool:
    """Whether `bucket` is named like a namespace bucket of `base` (what a listing of the server's buckets
    is filtered by; a key found there is still taken only when it routes back to it)."""
    return bucket.startswith(base + "-") and len(bucket) <= BUCKET_MAX


def key_namespace(prefix: str, key: str) -> str | None:
    """The namespace whose bucket holds `key` (a full key, or a listing's prefix, under the store's
    `prefix`); None when it is no namespace's (the base bucket's), or names no namespace yet (a listing
    of every namespace)."""
    rest = key
    if prefix:
        if not key.startswith(prefix + "/"):
            return None
        rest = key[len(prefix) + 1 :]
    parts = rest.split("/")
    candidate = parts[0]
    if candidate in _NAMESPACED_FOLDERS:
        candidate = parts[1] if len(parts) > 1 else ""
    return candidate if _NAMESPACE.match(candidate) else None


def per_namespace(url: str) -> bool:
    """Whether a store URL keeps a bucket per namespace (its option `buckets=namespace`)."""
    return f"{BUCKETS_OPTION}={PER_NAMESPACE}" in _query(url).split("&")


def with_namespace_buckets(url: str) -> str:
    """The URL with `buckets=namespace` (unchanged when it has it)."""
    if per_namespace(url):
        return url
    return url + ("&" if "?" in url else "?") + f"{BUCKETS_OPTION}={PER_NAMESPACE}"


def namespace_url(url: str, namespace: str) -> str:
    """The URL a namespace's own clients (its attempt Pods, its people) are given: for a URL with
    `buckets=namespace`, the same store with the namespace's bucket and without the option (a plain URL
    every SDK reads); any other URL as it is."""
    if not per_namespace(url):
        return url
    scheme, _, rest = url.partition("://")
    location, _, query = rest.partition("?")
    base, slash, path = location.partition("/")
    kept = [item for item in query.split("&") if item and item.partition("=")[0] != BUCKETS_OPTION]
    tail = ("?" + "&".join(kept)) if kept else ""
    return f"{scheme}://{namespace_bucket(base, namespace)}{slash}{path}{tail}"


def _query(url: str) -> str:
    return url.partition("?")[2]
