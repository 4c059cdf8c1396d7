"""A principal per agent namespace on the bundled object store (versitygw with its internal IAM), each
granted in a bucket of the namespace's own.

Each namespace gets two users of role `user`: one that may get and put objects under the namespace's
prefix (`<prefix>/<namespace>/`), for its attempt Pods, and one that may only read, for people who read
the namespace's state and archives. Neither may delete, nor reach another namespace's objects. Each
namespace's objects are in a bucket of its own (`<base>-<namespace>`, agentrun.core.store_buckets), made
with versioning Enabled when the namespace is, and the grant is that bucket's policy: two principals,
three statements, whatever the number of namespaces. (versitygw v1.8.0's posix backend keeps a bucket's
policy in one extended attribute of its directory, about 4 KiB on ext4: one policy for every namespace
held 12 of them.) versitygw consults only the policy once a bucket has one (its ACL no longer), and lets
its root (the operator) do anything.

Crash-safe and idempotent: `ensure` may run again at any point. It takes the credentials a Secret of the
namespace already holds (so a rerun never orphans them), creates the user or resets its secret to them,
creates the bucket (or finds it) and puts the policy when it is not as it should be. `take_back` (a
namespace that is gone) removes the bucket's policy, then deletes the users, and leaves the bucket and
its objects to the collector; `principals` reads back what the server holds, for the operator's sweep
(agentrun.core.store_principals decides).
"""

from __future__ import annotations

import json
import threading
import xml.etree.ElementTree
import xml.sax.saxutils
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from agentrun.core.collector import ARCHIVES_SEGMENT
from agentrun.core.store_buckets import may_be_namespace_bucket, namespace_bucket
from agentrun.core.store_principals import ServerPrincipals, principal_name, principal_namespace

from .errors import StoreRefused
from .location import StoreLocation
from .namespacebuckets import list_buckets
from .sigv4 import DEFAULT_REGION, S3Credentials, signed_request, xml_local_name

POLICY_VERSION: Final = "2012-10-17"
_VERSIONING_ON: Final = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b'<VersioningConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<Status>Enabled</Status></VersioningConfiguration>"
)
_BUCKET_OWNED: Final = b"BucketAlreadyOwnedByYou"
# What versitygw's admin API answers to creating a user whose access key is taken.
_USER_EXISTS: Final = b"XAdminUserExists"
_NO_POLICY: Final = (b"NoSuchBucketPolicy", b"NoSuchBucket")
# ... and to deleting a user that does not exist (already deleted: a take-back run again).
_NO_USER: Final = (b"XAdminUserNotFound", b"user not found")


class Access(Enum):
    """What a namespace's principal may do with the objects under the namespace's prefix."""

    WRITE = ("s3:GetObject", "s3:PutObject")  # attempt Pods: never s3:DeleteObject, never a listing
    READ = ("s3:GetObject",)  # people reading the namespace's state and archives (and listing them)

    @property
    def actions(self) -> list[str]:
        return list(self.value)


def access_key(namespace: str, access: Access) -> str:
    """The principal's access key: fixed by namespace and access, so a rerun finds the same user
    (agentrun.core.store_principals names them, and reads them back)."""
    return principal_name(namespace, read=access is Access.READ)


@dataclass(frozen=True)
class BundledStore:
    """The bucket of `location` on the bundled server at its endpoint, administered as `admin` (its root)."""

    location: StoreLocation
    admin: S3Credentials

    def __post_init__(self) -> None:
        if self.location.scheme != "s3" or "endpoint" not in self.location.options:
            raise ValueError(f"the bundled store is an s3:// URL with an endpoint, not {self.location}")

    @property
    def endpoint(self) -> str:
        return self.location.options["endpoint"]

    @property
    def region(self) -> str:
        return self.location.options.get("region", DEFAULT_REGION)

    def bucket(self, namespace: str) -> str:
        """The bucket of the namespace's objects."""
        return namespace_bucket(self.location.bucket, namespace)

    def namespace_resource(self, namespace: str) -> str:
        """The policy Resource of every object under the namespace's prefix, in its bucket."""
        return f"arn:aws:s3:::{self.bucket(namespace)}/{self.location.key(namespace)}/*"

    def statements(self, namespace: str, access: Access) -> list[dict[str, Any]]:
        """The principal's statements: get (and put) under the namespace's prefix; the read principal
        also reads the namespace's archives (written by the operator alone) and lists the bucket (what
        `kubectl agentrun history` does: it holds this namespace's objects only)."""
        principal = {"AWS": [access_key(namespace, access)]}
        objects = [self.namespace_resource(namespace)]
        if access is Access.WRITE:
            return [
                {"Effect": "Allow", "Principal": principal, "Action": access.actions, "Resource": objects}
            ]
        archives = f"arn:aws:s3:::{self.bucket(namespace)}/{self.location.key(ARCHIVES_SEGMENT, namespace)}/*"
        return [
            {
                "Effect": "Allow",
                "Principal": principal,
                "Action": access.actions,
                "Resource": [*objects, archives],
            },
            {
                "Effect": "Allow",
                "Principal": principal,
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{self.bucket(namespace)}"],
            },
        ]

    def ensure(self, namespace: str, access: Access, held: S3Credentials | None) -> S3Credentials:
        """The namespace's principal for `access` exists with `held` (the credentials its Secret holds;
        None: none yet, new ones are made) and is granted exactly its statement. Returns the credentials."""
        credentials = held or S3Credentials.new(access_key(namespace, access))
        if credentials.access_key != access_key(namespace, access):
            raise ValueError(f"{namespace}'s Secret names access key {credentials.access_key!r}, not ours")
        self.put_user(credentials)
        self.prepare_bucket(self.bucket(namespace))
        self.grant(namespace, access)
        self.revoke_in(self.location.bucket, namespace)  # a statement of the one-bucket layout, if any
        return credentials

    # ---- the bucket ------------------------------------------------------------------------------------

    def prepare_bucket(self, bucket: str | None = None) -> None:
        """The bucket (the URL's, or a namespace's) exists and its versioning is Enabled (idempotent: a
        bucket already there is fine, a versioning already on is put again). Read back: a server that does
        not report it Enabled raises StoreRefused, as does one that refuses a request; one that does not
        answer, StoreUnavailable."""
        bucket = bucket or self.location.bucket
        status, body = self._request("PUT", f"/{bucket}")
        if status != 200 and _BUCKET_OWNED not in body:
            raise StoreRefused("create-bucket", bucket, f"HTTP {status}: {_short(body)}")
        status, body = self._request("PUT", f"/{bucket}", query={"versioning": ""}, body=_VERSIONING_ON)
        if status != 200:
            raise StoreRefused("put-bucket-versioning", bucket, f"HTTP {status}: {_short(body)}")
        status, body = self._request("GET", f"/{bucket}", query={"versioning": ""})
        if status != 200 or b"<Status>Enabled</Status>" not in body:
            detail = f"versioning not reported Enabled: HTTP {status}: {_short(body)}"
            raise StoreRefused("get-bucket-versioning", bucket, detail)

    # ---- the admin API: users ---------------------------------------------------------------------------

    def put_user(self, credentials: S3Credentials) -> None:
        """Creates the user (role `user`), or sets its secret when it exists."""
        account = (
            f"<Account><Access>{_xml(credentials.access_key)}</Access>"
            f"<Secret>{_xml(credentials.secret_key)}</Secret><Role>user</Role></Account>"
        ).encode()
        status, body = self._request("PATCH", "/create-user", body=account)
        if status in (200, 201):
            return
        if _USER_EXISTS not in body:
            raise StoreRefused("create-user", credentials.access_key, f"HTTP {status}: {_short(body)}")
        update = f"<MutableProps><Secret>{_xml(credentials.secret_key)}</Secret></MutableProps>".encode()
        query = {"access": credentials.access_key}
        status, body = self._request("PATCH", "/update-user", query=query, body=update)
        if status not in (200, 201):
            raise StoreRefused("update-user", credentials.access_key, f"HTTP {status}: {_short(body)}")

    def users(self) -> frozenset[str]:
        """The access keys of the server's users (its root is none of them)."""
        status, body = self._request("PATCH", "/list-users")
        if status != 200:
            raise StoreRefused("list-users", self.endpoint, f"HTTP {status}: {_short(body)}")
        try:
            root = xml.etree.ElementTree.fromstring(body)
        except xml.etree.ElementTree.ParseError as exc:
            raise StoreRefused(
                "list-users", self.endpoint, f"unreadable answer ({exc}): {_short(body)}"
            ) from None
        return frozenset((e.text or "").strip() for e in root.iter() if xml_local_name(e.tag) == "Access")

    def delete_user(self, access: str) -> None:
        """Deletes the user; one that does not exist is fine (a take-back run again)."""
        status, body = self._request("PATCH", "/delete-user", query={"access": access})
        if status in (200, 204) or any(marker in body for marker in _NO_USER):
            return
        raise StoreRefused("delete-user", access, f"HTTP {status}: {_short(body)}")

    def namespace_buckets(self) -> list[str]:
        """The server's buckets named like a namespace's (ListBuckets, as its root)."""
        base = self.location.bucket
        listed = list_buckets(self.location, self.admin.env())
        return [b for b in listed if b != base and may_be_namespace_bucket(base, b)]

    def principals(self) -> ServerPrincipals:
        """The users, and the principals each namespace bucket's policy names: what a sweep compares with
        the namespaces (the users first, as a sweep lists the server before the namespaces). A principal
        counts as granted only in its own namespace's bucket; one the base bucket's policy still names
        (the one-bucket layout) is stale: taken back with its namespace, never taken as granted."""
        users = self.users()
        granted: set[str] = set()
        for bucket in self.namespace_buckets():
            for name in _principals(self.policy(bucket).get("Statement") or []):
                namespace = principal_namespace(name)
                if namespace is not None and self.bucket(namespace) == bucket:
                    granted.add(name)
        stale = _principals(self.policy().get("Statement") or [])
        return ServerPrincipals(users=users, granted=frozenset(granted), stale=frozenset(stale))

    def take_back(self, namespace: str) -> None:
        """The namespace's principals lose their statements, then their users (a namespace that is gone).
        The bucket and its objects stay: the collector takes what nothing references any more (an
        archive of the namespace keeps what it names until its retention). Idempotent: a take-back
        interrupted half-way is found by the next sweep (a statement or a user left names the namespace)
        and run again."""
        self.revoke(namespace)
        self.revoke_in(self.location.bucket, namespace)
        for access in Access:
            self.delete_user(access_key(namespace, access))

    # ---- the bucket's policy ----------------------------------------------------------------------------

    def grant(self, namespace: str, access: Access) -> None:
        """The namespace bucket's policy holds the principal's statements (and no other for it); put only
        on change. One read-modify-write at a time in this process (the operator is the policy's one
        writer)."""
        wanted = self.statements(namespace, access)
        principal = access_key(namespace, access)
        bucket = self.bucket(namespace)
        with _POLICY_LOCK:
            statements = self.policy(bucket).get("Statement") or []
            if [s for s in statements if _names(s, principal)] == wanted:
                return
            others = [s for s in statements if not _names(s, principal)]
            self.put_policy({"Version": POLICY_VERSION, "Statement": [*others, *wanted]}, bucket)

    def revoke(self, namespace: str) -> None:
        """The namespace bucket's policy no longer grants the namespace's principals anything (a namespace
        that is gone)."""
        self.revoke_in(self.bucket(namespace), namespace)

    def revoke_in(self, bucket: str, namespace: str) -> None:
        """`bucket`'s policy names the namespace's principals no more (a bucket without a policy, or no
        bucket at all, is fine)."""
        principals = {access_key(namespace, access) for access in Access}
        with _POLICY_LOCK:
            statements = self.policy(bucket).get("Statement") or []
            kept = [s for s in statements if not any(_names(s, p) for p in principals)]
            if not kept and statements:
                self.delete_policy(bucket)  # a policy needs a statement; without one, the bucket's ACL rules
            elif len(kept) != len(statements):
                self.put_policy({"Version": POLICY_VERSION, "Statement": kept}, bucket)

    def policy(self, bucket: str | None = None) -> dict[str, Any]:
        """The policy of `bucket` (the URL's by default); an empty one when it has none, or no bucket."""
        bucket = bucket or self.location.bucket
        status, body = self._request("GET", f"/{bucket}", query={"policy": ""})
        if status == 404 and any(marker in body for marker in _NO_POLICY):
            return {"Version": POLICY_VERSION, "Statement": []}
        if status != 200:
            raise StoreRefused("get-bucket-policy", bucket, f"HTTP {status}: {_short(body)}")
        policy: dict[str, Any] = json.loads(body)
        return policy

    def put_policy(self, policy: Mapping[str, Any], bucket: str | None = None) -> None:
        bucket = bucket or self.location.bucket
        body = json.dumps(policy, separators=(",", ":")).encode()
        status, answer = self._request("PUT", f"/{bucket}", query={"policy": ""}, body=body)
        if status not in (200, 204):
            # Named with its size: a server that keeps the policy where its size is bounded (versitygw's
            # posix backend without --sidecar: one extended attribute, 4 KiB on ext4) refuses it with 500.
            statements = len(policy.get("Statement") or [])
            size = f"a policy of {len(body)} bytes, {statements} statements"
            raise StoreRefused("put-bucket-policy", bucket, f"HTTP {status} ({size}): {_short(answer)}")

    def delete_policy(self, bucket: str | None = None) -> None:
        bucket = bucket or self.location.bucket
        status, answer = self._request("DELETE", f"/{bucket}", query={"policy": ""})
        if status not in (200, 204):
            raise StoreRefused("delete-bucket-policy", bucket, f"HTTP {status}: {_short(answer)}")

    def _request(
        self, method: str, path: str, *, query: Mapping[str, str] | None = None, body: bytes = b""
    ) -> tuple[int, bytes]:
        return signed_request(
            method, self.endpoint, path, credentials=self.admin, query=query, body=body, region=self.region
        )


_POLICY_LOCK = threading.Lock()


def _names(statement: Mapping[str, Any], principal: str) -> bool:
    """Whether a policy statement names `principal` (in any of the forms a Principal takes)."""
    named = statement.get("Principal")
    if isinstance(named, Mapping):
        named = named.get("AWS")
    if isinstance(named, str):
        named = [named]
    return principal in (named or [])


def _principals(statements: list[Mapping[str, Any]]) -> list[str]:
    """Every principal of ours the statements name (whatever the form of their Principal)."""
    found = []
    for statement in statements:
        named = statement.get("Principal")
        if isinstance(named, Mapping):
            named = named.get("AWS")
        if isinstance(named, str):
            named = [named]
        found += [str(n) for n in named or [] if principal_namespace(str(n)) is not None]
    return found


def _xml(text: str) -> str:
    return xml.sax.saxutils.escape(text)


def _short(body: bytes) -> str:
    return body[:300].decode(errors="replace")
