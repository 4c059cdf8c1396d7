"""The state store's one URL, parsed and checked: where the blobs live, never who may write them.

    s3://<bucket>[/<prefix>][?endpoint=<http(s) URL>&region=<region>&buckets=namespace]
    gs://<bucket>[/<prefix>]
    az://<container>[/<prefix>][?account=<storage account>&endpoint=<http(s) URL>]
    file:///<absolute directory>          one machine
    memory://[<prefix>]                   one process (unit tests)

Credentials never come from the URL: they are read from the environment (AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, GOOGLE_SERVICE_ACCOUNT, AZURE_STORAGE_ACCOUNT_KEY, ..., put there from a Secret).
A URL that carries any (user info before '@', a credential-like option, a query string in the endpoint)
is refused, and the refusal does not repeat it. An unknown option is refused too: a typo must not
silently configure nothing. `buckets=namespace` keeps each namespace's objects in a bucket of its own
(agentrun.core.store_buckets), named after the URL's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal, cast
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlencode, urlsplit

from agentrun.core.store_buckets import BASE_MAX, BUCKETS_OPTION, PER_NAMESPACE, valid_base

from .errors import StoreConfigError

Scheme = Literal["s3", "gs", "az", "file", "memory"]

# The options each scheme takes in the query string; anything else is refused.
OPTIONS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "s3": frozenset({"endpoint", "region", BUCKETS_OPTION}),
        "gs": frozenset(),
        "az": frozenset({"account", "endpoint"}),
        "file": frozenset(),
        "memory": frozenset(),
    }
)
# Option names that name a secret: refused with a pointer to the environment, the value never repeated.
_CREDENTIAL_WORDS: Final = re.compile(
    r"key|secret|token|password|passwd|credential|signature|sig$|^sv$|^se$|^sp$|auth", re.IGNORECASE
)
_BUCKET: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
_SEGMENT: Final = re.compile(r"^[A-Za-z0-9._=+-]+$")
_REGION: Final = re.compile(r"^[A-Za-z0-9-]{1,64}$")
_ACCOUNT: Final = re.compile(r"^[a-z0-9]{3,24}$")
_ENV_HINT: Final = (
    "give credentials in the environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
    "GOOGLE_SERVICE_ACCOUNT, AZURE_STORAGE_ACCOUNT_KEY, ...), from a Secret"
)


@dataclass(frozen=True)
class StoreLocation:
    """Where the blobs are: a scheme, a bucket (container; for file://, the directory), a key prefix
    and the scheme's options (endpoint, region, account). Holds no credential, so str() is safe to log."""

    scheme: Scheme
    bucket: str
    prefix: str = ""
    options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __str__(self) -> str:
        if self.scheme == "file":
            base = "file://" + quote(self.bucket)
        elif self.scheme == "memory":
            base = "memory://"
        else:
            base = f"{self.scheme}://{self.bucket}"
        if self.prefix:
            base += ("" if base.endswith("/") else "/") + quote(self.prefix)
        query = urlencode(sorted(self.options.items()), safe=":/")
        return f"{base}?{query}" if query else base

    @property
    def per_namespace(self) -> bool:
        """Whether each namespace's objects are in a bucket of their own (`buckets=namespace`)."""
        return self.options.get(BUCKETS_OPTION) == PER_NAMESPACE

    def key(self, *segments: str) -> str:
        """The object key of segments under the prefix."""
        return "/".join(part for part in (self.prefix, *segments) if part)


def parse_store_url(url: str) -> StoreLocation:
    """The location a state store URL names. Raises StoreConfigError, which never repeats a credential."""
    if not isinstance(url, str) or not url.strip():
        raise StoreConfigError("the state store URL is empty")
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if "@" in parts.netloc:
        raise StoreConfigError(
            f"the state store URL ({scheme}://...) carries credentials (user info before '@'): "
            f"remove them and {_ENV_HINT}"
        )
    options = _options(scheme, parts.query)
    if parts.fragment:
        raise StoreConfigError(f"the state store URL {_shown(parts)} has a fragment ('#...'): remove it")
    if scheme == "file":
        return _file_location(parts.netloc, parts.path, options)
    if scheme == "memory":
        prefix = _prefix(parts.netloc + parts.path, parts)
        return StoreLocation("memory", "", prefix)
    if scheme in ("s3", "gs", "az"):
        bucket = unquote(parts.netloc)
        if not _BUCKET.match(bucket):
            noun = "container" if scheme == "az" else "bucket"
            raise StoreConfigError(f"the state store URL {_shown(parts)} names no valid {noun}: {bucket!r}")
        location = StoreLocation(
            cast(Scheme, scheme), bucket, _prefix(parts.path, parts), MappingProxyType(options)
        )
        _check_options(location)
        return location
    known = ", ".join(f"{name}://" for name in OPTIONS)
    raise StoreConfigError(f"the state store URL has an unknown scheme {scheme!r}: use one of {known}")


def _options(scheme: str, query: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise StoreConfigError("the state store URL's query string is malformed (name=value&...)") from None
    found: dict[str, str] = {}
    for name, value in pairs:
        if _CREDENTIAL_WORDS.search(name):
            raise StoreConfigError(
                f"the state store URL carries a credential-like option {name!r}: remove it and {_ENV_HINT}"
            )
        allowed = OPTIONS.get(scheme)
        if allowed is not None and name not in allowed:
            takes = ", ".join(sorted(allowed)) or "none"
            raise StoreConfigError(
                f"the state store URL has an unknown option {name!r} for {scheme}:// (it takes: {takes})"
            )
        if name in found:
            raise StoreConfigError(f"the state store URL gives the option {name!r} twice")
        found[name] = value
    return found


def _file_location(host: str, path: str, options: Mapping[str, str]) -> StoreLocation:
    if host not in ("", "localhost"):
        raise StoreConfigError(
            f"a file:// state store is on this machine: use file:///<dir>, not host {host!r}"
        )
    directory = unquote(path)
    if not directory.startswith("/"):
        raise StoreConfigError("a file:// state store needs an absolute directory: file:///<dir>")
    if any(part in (".", "..") for part in directory.split("/")):
        raise StoreConfigError(f"the file:// state store directory {directory!r} has '.' or '..' in it")
    return StoreLocation("file", directory.rstrip("/") or "/", "", MappingProxyType(dict(options)))


def _prefix(path: str, parts: SplitResult) -> str:
    prefix = unquote(path).strip("/")
    if not prefix:
        return ""
    for segment in prefix.split("/"):
        if segment in ("", ".", "..") or not _SEGMENT.match(segment):
            raise StoreConfigError(
                f"the state store URL {_shown(parts)} has an invalid key prefix {prefix!r}: "
                "segments of letters, digits and ._=+- separated by single '/'"
            )
    return prefix


def _check_options(location: StoreLocation) -> None:
    endpoint = location.options.get("endpoint")
    if endpoint is not None:
        target = urlsplit(endpoint)
        if target.scheme not in ("http", "https") or not target.hostname:
            raise StoreConfigError(f"the state store endpoint must be an http(s) URL, not {endpoint!r}")
        if "@" in target.netloc or target.query or target.fragment:
            raise StoreConfigError(
                "the state store endpoint carries user info or a query string (credentials?): "
                f"give scheme://host[:port][/path] only and {_ENV_HINT}"
            )
    region = location.options.get("region")
    if region is not None and not _REGION.match(region):
        raise StoreConfigError(f"the state store region {region!r} is not a region name")
    buckets = location.options.get(BUCKETS_OPTION)
    if buckets is not None:
        if buckets != PER_NAMESPACE:
            raise StoreConfigError(f"the state store option buckets takes {PER_NAMESPACE!r}, not {buckets!r}")
        if not valid_base(location.bucket):
            raise StoreConfigError(
                f"with buckets={PER_NAMESPACE} the bucket {location.bucket!r} names the namespaces' buckets: "
                f"3 to {BASE_MAX} lowercase letters, digits and single hyphens"
            )
    account = location.options.get("account")
    if account is not None and not _ACCOUNT.match(account):
        raise StoreConfigError(f"the state store account {account!r} is not a storage account name")


def _shown(parts: SplitResult) -> str:
    """The URL for an error message, once user info has been refused: scheme, host and path only."""
    return f"{parts.scheme}://{parts.netloc}{parts.path}"
