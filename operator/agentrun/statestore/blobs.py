"""Immutable, content-addressed blobs: written put-if-absent, verified on every read.

A blob's key is `<prefix>/<namespace>/<run uid>/sha256/<hex>`; the object that references it records a
`BlobRef {key, sha256, size}`. A put sends `If-None-Match: *` (put-if-absent): when the key is taken,
the writer reads what is there and checks it is exactly its content before handing out the reference,
so a blob planted at a predictable key is never referenced. A get checks size and sha256 of the bytes
it received against the reference, every time.

With `buckets=namespace` in its URL (agentrun.core.store_buckets) the store spans a bucket per namespace:
each key is read and written in the bucket its namespace names, and a listing that names no namespace
reads the URL's bucket and every namespace's. The worker and the CLI are given their namespace's own
bucket instead (a plain URL), so only the operator's client spans them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, Self

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    GenericError,
    InvalidPathError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)

from agentrun.core.store_buckets import key_namespace, may_be_namespace_bucket, namespace_bucket

from .errors import StateStoreError, StateUnverifiable, StoreConfigError, StoreRefused, StoreUnavailable
from .location import StoreLocation, parse_store_url
from .namespacebuckets import list_buckets
from .observe import Observer, Operation, Outcome, StoreRequest

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

log = logging.getLogger("agentrun.statestore")

_SHA256_HEX: Final = re.compile(r"^[0-9a-f]{64}$")
# A namespace is a DNS-1123 label; a run uid is what the API server assigns (a UUID), kept to a safe set.
_NAMESPACE: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_RUN_UID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")
# A 4xx in an HTTP error is the store refusing the request, except timeouts and throttling (408, 429).
_CLIENT_ERROR: Final = re.compile(r"\b4(?!08|29)\d\d\b")
# Environment variables holding secrets the object store client reads: scrubbed from error messages.
_SECRET_ENV: Final = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_SAS_KEY",
    "AZURE_STORAGE_TOKEN",
    "AZURE_CLIENT_SECRET",
    "GOOGLE_SERVICE_ACCOUNT_KEY",
)
_DETAIL_LIMIT: Final = 600
_NO_SUCH_BUCKET: Final = "NoSuchBucket"


@dataclass(frozen=True)
class BlobRef:
    """What a fenced object records about a blob it references: its key, sha256 (hex) and size; `links`
    when the blob is a document naming further blobs (statestore.documents), which the collector follows."""

    key: str
    sha256: str
    size: int
    links: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError("a blob reference needs a key")
        if not isinstance(self.sha256, str) or not _SHA256_HEX.match(self.sha256):
            raise ValueError(f"blob reference {self.key}: sha256 must be 64 lowercase hex digits")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise ValueError(f"blob reference {self.key}: size must be a non-negative integer")

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {"key": self.key, "sha256": self.sha256, "size": self.size}
        if self.links:
            value["links"] = True
        return value

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> BlobRef:
        """A reference as recorded ({key, sha256, size[, links]}); ValueError when it is not one."""
        unknown = set(value) - {"key", "sha256", "size", "links"}
        if unknown:
            raise ValueError(f"a blob reference has unknown fields {sorted(unknown)}")
        links = value.get("links", False)
        if not isinstance(links, bool):
            raise ValueError("a blob reference's links is true or false")
        return cls(value.get("key", ""), value.get("sha256", ""), value.get("size", -1), links)


@dataclass(frozen=True)
class StoreTimeouts:
    """How long a request may take and how often the client retries a transient failure by itself
    (5xx, connection errors, timeouts) before the error reaches the caller as StoreUnavailable."""

    connect_seconds: float = 5.0
    request_seconds: float = 30.0
    retries: int = 3
    retry_budget_seconds: float = 30.0
    first_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 2.0


class BlobStore:
    """The agent-state store: content-addressed blobs under one location, through obstore's async API."""

    def __init__(
        self,
        store: ObjectStore,
        location: StoreLocation,
        observer: Observer | None = None,
        *,
        open_bucket: Callable[[str], ObjectStore] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """store: the client of the location's bucket; open_bucket: a client of another bucket of the
        same store (a namespace's, with `buckets=namespace`); env: the credentials, when not the process
        environment's (listing the buckets signs with them)."""
        self._store = store
        self.location = location
        self._observer = observer
        self._stores: dict[str, ObjectStore] = {location.bucket: store}
        self._open_bucket = open_bucket
        self._env = env

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        observer: Observer | None = None,
        timeouts: StoreTimeouts | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Self:
        """The store a state store URL names. Credentials come from the process environment (see
        location.py), or from `env` when given: a host running attempts in-process passes each
        container's own environment, so one Attempt never uses another namespace's credentials."""
        location = parse_store_url(url)
        limits = timeouts or StoreTimeouts()
        store = open_object_store(location, limits, env)
        log.info("state store at %s", location)

        def open_bucket(bucket: str) -> ObjectStore:
            return open_object_store(replace(location, bucket=bucket), limits, env)

        return cls(store, location, observer, open_bucket=open_bucket, env=env)

    # ---- which bucket a key is in (one, unless the URL says `buckets=namespace`) -------------------------

    def bucket_for(self, key: str) -> str:
        """The bucket holding `key` (a full key, or a listing's prefix naming a namespace)."""
        if not self.location.per_namespace:
            return self.location.bucket
        namespace = key_namespace(self.location.prefix, key)
        return namespace_bucket(self.location.bucket, namespace) if namespace else self.location.bucket

    def _store_for(self, key: str) -> ObjectStore:
        return self._bucket_store(self.bucket_for(key))

    def _bucket_store(self, bucket: str) -> ObjectStore:
        found = self._stores.get(bucket)
        if found is None:
            if self._open_bucket is None:
                raise StoreConfigError(f"this client of {self.location} opens no other bucket ({bucket})")
            found = self._stores[bucket] = self._open_bucket(bucket)
        return found

    async def _stores_under(self, prefix: str) -> list[tuple[str, ObjectStore]]:
        """The buckets (name and client) a listing under `prefix` reads: the one its namespace names; for
        a listing of every namespace, the URL's bucket and every namespace bucket the server lists."""
        if not self.location.per_namespace or key_namespace(self.location.prefix, prefix) is not None:
            bucket = self.bucket_for(prefix)
            return [(bucket, self._bucket_store(bucket))]
        base = self.location.bucket
        listed = await asyncio.to_thread(list_buckets, self.location, self._env)
        found = sorted(b for b in listed if b != base and may_be_namespace_bucket(base, b))
        return [(bucket, self._bucket_store(bucket)) for bucket in (base, *found)]

    def _not_made(self, bucket: str, error: BaseException) -> bool:
        """Whether a listing failed only because a namespace's bucket is not made yet (a namespace that
        opted in after the listing started, or never): it holds nothing then."""
        return bucket != self.location.bucket and _NO_SUCH_BUCKET in str(error)

    def _listed_here(self, bucket: str, key: str) -> bool:
        """Whether a key a listing of `bucket` found belongs there (a bucket only named like a namespace's,
        or an object at another bucket's key, is not this store's)."""
        return self.bucket_for(key) == bucket

    def key_for(self, namespace: str, run_uid: str, sha256: str) -> str:
        """`<prefix>/<namespace>/<run uid>/sha256/<hex>`: the content address of a Run's blob."""
        if not _NAMESPACE.match(namespace):
            raise ValueError(f"not a namespace name: {namespace!r}")
        if not _RUN_UID.match(run_uid):
            raise ValueError(f"not a run uid: {run_uid!r}")
        if not _SHA256_HEX.match(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self.location.key(namespace, run_uid, "sha256", sha256)

    async def put(self, namespace: str, run_uid: str, data: bytes) -> BlobRef:
        """Stores data as the Run's blob, put-if-absent, and returns its reference. When the key is taken,
        the blob there is read and verified first: StateUnverifiable if it is not this content.

        A key that refuses put-if-absent yet holds nothing (collected between our put and our read, or,
        on versitygw v1.8.0 with versioning, a key whose current version is a delete marker: it answers
        412 where S3 treats the key as absent) is written again unconditionally: its address is the
        sha256 of this very content, so nothing else may stand there, and every reader verifies it."""
        payload = bytes(data)
        digest = hashlib.sha256(payload).hexdigest()
        ref = BlobRef(self.key_for(namespace, run_uid, digest), digest, len(payload))
        with self._request("put", ref.key) as request:
            try:
                await obstore.put_async(
                    self._store_for(ref.key), ref.key, payload, mode="create", use_multipart=False
                )
            except (AlreadyExistsError, PreconditionError):
                request.outcome = "exists"
            else:
                request.outcome, request.size = "created", ref.size
                return ref
        try:
            await self._read_verified(ref, "verify")
            return ref
        except StateUnverifiable as error:
            if not error.missing:
                raise
        with self._request("put", ref.key) as request:
            await obstore.put_async(
                self._store_for(ref.key), ref.key, payload, mode="overwrite", use_multipart=False
            )
            request.outcome, request.size = "created", ref.size
        return ref

    async def get(self, ref: BlobRef) -> bytes:
        """The blob's bytes, after checking their size and sha256 against the reference. StateUnverifiable
        when it is missing or differs; StoreUnavailable when the store cannot answer now."""
        return await self._read_verified(ref, "get")

    async def _read_verified(self, ref: BlobRef, operation: Operation) -> bytes:
        self._check_address(ref)
        with self._request(operation, ref.key) as request:
            try:
                result = await obstore.get_async(self._store_for(ref.key), ref.key)
            except FileNotFoundError:
                request.outcome = "missing"
                raise StateUnverifiable(
                    ref.key, "no object at this key (deleted or never written)", missing=True
                ) from None
            stored_size = int(result.meta["size"])
            if stored_size != ref.size:
                request.outcome = "mismatch"
                raise StateUnverifiable(
                    ref.key, f"the object is {stored_size} bytes, the reference {ref.size}"
                )
            data = bytes(await result.bytes_async())
            request.size = len(data)
            digest = hashlib.sha256(data).hexdigest()
            if len(data) != ref.size or digest != ref.sha256:
                request.outcome = "mismatch"
                raise StateUnverifiable(
                    ref.key,
                    f"received {len(data)} bytes with sha256 {digest}, the reference names {ref.sha256}",
                )
            request.outcome = "ok"
            return data

    # ---- documents at keys their writer names (archives and their index: statestore.archives) ----------
    # Not content addresses, so a reader verifies them against a digest recorded elsewhere.

    async def put_new(self, key: str, data: bytes) -> bool:
        """Writes data at `key` if nothing is there (put-if-absent): True when written now, False when
        the key was taken (what is there is left alone, for the caller to read and judge)."""
        self._check_inside(key)
        created = False
        with self._request("put", key) as request:
            try:
                await obstore.put_async(
                    self._store_for(key), key, bytes(data), mode="create", use_multipart=False
                )
            except (AlreadyExistsError, PreconditionError):
                request.outcome = "exists"
            else:
                request.outcome, request.size, created = "created", len(data), True
        return created

    async def read_key(self, key: str) -> bytes | None:
        """The bytes at `key`, unverified (the caller checks them); None when nothing is there."""
        self._check_inside(key)
        with self._request("get", key) as request:
            try:
                result = await obstore.get_async(self._store_for(key), key)
            except FileNotFoundError:
                request.outcome = "missing"
                return None
            data = bytes(await result.bytes_async())
            request.outcome, request.size = "ok", len(data)
            return data

    async def list_keys(self, prefix: str) -> list[str]:
        """Every key under `prefix` (a folder: ends with '/'), in pages, sorted."""
        self._check_inside(prefix)
        keys: list[str] = []
        try:
            for bucket, store in await self._stores_under(prefix):
                try:
                    async for page in obstore.list(store, prefix, chunk_size=1000):
                        keys.extend(k for k in (str(m["path"]) for m in page) if self._listed_here(bucket, k))
                except Exception as exc:
                    if not self._not_made(bucket, exc):
                        raise
        except StateStoreError:
            raise
        except Exception as exc:
            raise _store_error("list", prefix, exc) from None
        return sorted(keys)

    async def list_folders(self, prefix: str) -> list[str]:
        """The folders right under `prefix` (ends with '/'), as keys ending with '/'."""
        self._check_inside(prefix)
        folders: set[str] = set()
        try:
            for bucket, store in await self._stores_under(prefix):
                try:
                    found = await obstore.list_with_delimiter_async(store, prefix)
                except Exception as exc:
                    if not self._not_made(bucket, exc):
                        raise
                    continue
                named = (str(folder).rstrip("/") + "/" for folder in found["common_prefixes"])
                folders.update(f for f in named if self._listed_here(bucket, f))
        except StateStoreError:
            raise
        except Exception as exc:
            raise _store_error("list", prefix, exc) from None
        return sorted(folders)

    async def delete_key(self, key: str) -> None:
        """Deletes the object at `key`; nothing there is no error (a delete repeated after a crash)."""
        self._check_inside(key)
        try:
            await obstore.delete_async(self._store_for(key), key)
        except FileNotFoundError:
            return
        except Exception as exc:
            raise _store_error("delete", key, exc) from None

    def _check_inside(self, key: str) -> None:
        if self.location.prefix and not key.startswith(self.location.prefix + "/"):
            raise ValueError(f"{key!r} is not under the store's prefix {self.location.prefix!r}")

    def _check_address(self, ref: BlobRef) -> None:
        # A reference whose key is not its own content address under this store is not trusted either.
        expected_tail = f"sha256/{ref.sha256}"
        inside = not self.location.prefix or ref.key.startswith(self.location.prefix + "/")
        if not ref.key.endswith("/" + expected_tail) or not inside:
            raise StateUnverifiable(
                ref.key, f"the key is not a content address ({expected_tail}) in this store"
            )

    @contextmanager
    def _request(self, operation: Operation, key: str) -> Iterator[_Request]:
        request = _Request()
        started = time.perf_counter()  # clock-exempt: a request duration, for a metric
        try:
            yield request
        except StateStoreError:
            raise
        except Exception as exc:
            error = classify(operation, key, exc)
            if error is None:
                raise
            request.outcome = "refused" if isinstance(error, StoreRefused) else "unavailable"
            raise error from None
        finally:
            if self._observer is not None and request.outcome is not None:
                seconds = time.perf_counter() - started  # clock-exempt: a request duration, for a metric
                self._observer(StoreRequest(operation, request.outcome, seconds, request.size))


@dataclass
class _Request:
    outcome: Outcome | None = None
    size: int = 0


def classify(operation: str, key: str, exc: BaseException) -> StoreUnavailable | StoreRefused | None:
    """A client error as the store's own: refused (credentials, permissions, a 4xx, an unsupported
    request) or unavailable (anything else the client or the network raised). None: not a store error."""
    detail = scrub(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError | NotSupportedError | InvalidPathError):
        return StoreRefused(operation, key, detail)
    if isinstance(exc, FileNotFoundError) and operation == "put":
        # a put's 404 is the bucket's (NoSuchBucket: e.g. a namespace's bucket nobody made), never the key's
        return StoreRefused(operation, key, detail)
    if isinstance(exc, GenericError) and _CLIENT_ERROR.search(_status_part(str(exc))):
        return StoreRefused(operation, key, detail)
    if isinstance(exc, BaseError | OSError | TimeoutError):
        return StoreUnavailable(operation, key, detail)
    return None


def _store_error(operation: str, key: str, exc: BaseException) -> StateStoreError | BaseException:
    """A client error as the store's own (classify), else the error itself."""
    return classify(operation, key, exc) or exc


def _status_part(message: str) -> str:
    # object_store says "...status code: 403 Forbidden..." or "...returned non-2xx status code: 412 ...".
    found = re.search(r"status(?: code)?:?\s*(\d{3})", message, re.IGNORECASE)
    return found.group(1) if found else ""


def scrub(message: str) -> str:
    """message without any secret the client could have read from the environment, and bounded."""
    # obstore appends the Rust error's debug dump after the message: long, and nothing the message lacks.
    message = message.split("\n\nDebug source:", 1)[0].strip()
    for name in _SECRET_ENV:
        value = os.environ.get(name, "")
        if len(value) >= 4:
            message = message.replace(value, "***")
    return message if len(message) <= _DETAIL_LIMIT else message[:_DETAIL_LIMIT] + "..."


# S3 credentials as the client's configuration names them, by the environment variable holding each.
_S3_CREDENTIALS: Final = {
    "AWS_ACCESS_KEY_ID": "access_key_id",
    "AWS_SECRET_ACCESS_KEY": "secret_access_key",
    "AWS_SESSION_TOKEN": "session_token",
}


def open_object_store(
    location: StoreLocation, timeouts: StoreTimeouts, env: Mapping[str, str] | None = None
) -> ObjectStore:
    """The obstore client for a location; credentials come from the process environment (the client
    reads it), or for s3:// from `env` when given."""
    from obstore.store import AzureStore, GCSStore, LocalStore, MemoryStore, S3Store  # noqa: PLC0415

    client: ClientConfig = {
        "connect_timeout": timedelta(seconds=timeouts.connect_seconds),
        "timeout": timedelta(seconds=timeouts.request_seconds),
    }
    retry: RetryConfig = {
        "max_retries": timeouts.retries,
        "retry_timeout": timedelta(seconds=timeouts.retry_budget_seconds),
        "backoff": {
            "init_backoff": timedelta(seconds=timeouts.first_backoff_seconds),
            "max_backoff": timedelta(seconds=timeouts.max_backoff_seconds),
            "base": 2,
        },
    }
    endpoint = location.options.get("endpoint")
    if endpoint is not None and endpoint.startswith("http://"):
        client["allow_http"] = True
    try:
        if location.scheme == "s3":
            s3: dict[str, Any] = {"conditional_put": "etag"}
            if endpoint is not None:
                s3["endpoint"] = endpoint
            if "region" in location.options:
                s3["region"] = location.options["region"]
            for variable, option in _S3_CREDENTIALS.items():
                if env is not None and env.get(variable):
                    s3[option] = env[variable]
            return S3Store(location.bucket, config=s3, client_options=client, retry_config=retry)  # type: ignore[arg-type]
        if location.scheme == "gs":
            return GCSStore(location.bucket, client_options=client, retry_config=retry)
        if location.scheme == "az":
            azure: dict[str, Any] = {}
            if "account" in location.options:
                azure["account_name"] = location.options["account"]
            if endpoint is not None:
                azure["endpoint"] = endpoint
            return AzureStore(location.bucket, config=azure, client_options=client, retry_config=retry)  # type: ignore[arg-type]
        if location.scheme == "file":
            return LocalStore(location.bucket, mkdir=True)
        return MemoryStore()
    except (BaseError, ValueError, OSError) as exc:
        raise StoreConfigError(f"cannot open the state store at {location}: {scrub(str(exc))}") from None
