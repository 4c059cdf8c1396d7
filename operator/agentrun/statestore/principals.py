"""A principal per agent namespace on the bundled object store (versitygw with its internal IAM).

Each namespace gets two users of role `user`: one that may get and put objects under the namespace's
prefix (`<prefix>/<namespace>/`), for its attempt Pods, and one that may only get them, for people who
read the namespace's state. Neither may delete, list, or reach another namespace's prefix. The grant is a
statement of the bucket's policy naming the user's access key; versitygw consults only the policy once a
bucket has one (its ACL no longer), and lets its root (the operator) do anything. The policy grows by two
statements per namespace (about 300 bytes with names of 12 characters), and versitygw v1.8.0's posix
backend keeps it in one extended attribute of the bucket directory: on ext4, 12 namespaces fit; a policy
the server cannot store is refused (HTTP 500) and the refusal names its size (docs/state-store.md).

Crash-safe and idempotent: `ensure` may run again at any point. It takes the credentials a Secret of the
namespace already holds (so a rerun never orphans them), creates the user or resets its secret to them,
and puts the policy statement when it is not there as it should be. `take_back` (a namespace that is
gone) takes the statements out, then deletes the users; `principals` reads back what the server holds,
for the operator's sweep (agentrun.core.store_principals decides).
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

from agentrun.core.store_principals import ServerPrincipals, principal_name, principal_namespace

from .errors import StoreRefused
from .location import StoreLocation
from .sigv4 import DEFAULT_REGION, S3Credentials, signed_request

POLICY_VERSION: Final = "2012-10-17"
_VERSIONING_ON: Final = (
    b'<?xml version="1.0" encoding="UTF-8"?>'
    b'<VersioningConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    b"<Status>Enabled</Status></VersioningConfiguration>"
)
_BUCKET_OWNED: Final = b"BucketAlreadyOwnedByYou"
# What versitygw's admin API answers to creating a user whose access key is taken.
_USER_EXISTS: Final = b"XAdminUserExists"
_NO_POLICY: Final = b"NoSuchBucketPolicy"
# ... and to deleting a user that does not exist (already deleted: a take-back run again).
_NO_USER: Final = (b"XAdminUserNotFound", b"user not found")


class Access(Enum):
    """What a namespace's principal may do with the objects under the namespace's prefix."""

    WRITE = ("s3:GetObject", "s3:PutObject")  # attempt Pods: never s3:DeleteObject
    READ = ("s3:GetObject",)  # people reading the namespace's state

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

    def namespace_resource(self, namespace: str) -> str:
        """The policy Resource of every object under the namespace's prefix."""
        return f"arn:aws:s3:::{self.location.bucket}/{self.location.key(namespace)}/*"

    def statement(self, namespace: str, access: Access) -> dict[str, Any]:
        return {
            "Effect": "Allow",
            "Principal": {"AWS": [access_key(namespace, access)]},
            "Action": access.actions,
            "Resource": [self.namespace_resource(namespace)],
        }

    def ensure(self, namespace: str, access: Access, held: S3Credentials | None) -> S3Credentials:
        """The namespace's principal for `access` exists with `held` (the credentials its Secret holds;
        None: none yet, new ones are made) and is granted exactly its statement. Returns the credentials."""
        credentials = held or S3Credentials.new(access_key(namespace, access))
        if credentials.access_key != access_key(namespace, access):
            raise ValueError(f"{namespace}'s Secret names access key {credentials.access_key!r}, not ours")
        self.put_user(credentials)
        self.grant(namespace, access)
        return credentials

    # ---- the bucket ------------------------------------------------------------------------------------

    def prepare_bucket(self) -> None:
        """The bucket exists and its versioning is Enabled (idempotent: a bucket already there is fine, a
        versioning already on is put again). Read back: a server that does not report it Enabled raises
        StoreRefused, as does one that refuses a request; one that does not answer, StoreUnavailable."""
        bucket = self.location.bucket
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
        return frozenset((e.text or "").strip() for e in root.iter() if _local(e.tag) == "Access")

    def delete_user(self, access: str) -> None:
        """Deletes the user; one that does not exist is fine (a take-back run again)."""
        status, body = self._request("PATCH", "/delete-user", query={"access": access})
        if status in (200, 204) or any(marker in body for marker in _NO_USER):
            return
        raise StoreRefused("delete-user", access, f"HTTP {status}: {_short(body)}")

    def principals(self) -> ServerPrincipals:
        """The users, and the principals the bucket's policy names: what a sweep compares with the
        namespaces (the users first, as a sweep lists the server before the namespaces)."""
        users = self.users()
        statements = self.policy().get("Statement") or []
        return ServerPrincipals(users=users, granted=frozenset(_principals(statements)))

    def take_back(self, namespace: str) -> None:
        """The namespace's principals lose their statements, then their users (a namespace that is gone).
        Idempotent: a take-back interrupted half-way is found by the next sweep (a statement or a user
        left names the namespace) and run again."""
        self.revoke(namespace)
        for access in Access:
            self.delete_user(access_key(namespace, access))

    # ---- the bucket's policy ----------------------------------------------------------------------------

    def grant(self, namespace: str, access: Access) -> None:
        """The bucket policy holds the principal's statement (and no other for it); put only on change.
        One read-modify-write at a time in this process (the operator is the policy's one writer)."""
        wanted = self.statement(namespace, access)
        principal = access_key(namespace, access)
        with _POLICY_LOCK:
            policy = self.policy()
            statements = policy.get("Statement") or []
            if [s for s in statements if _names(s, principal)] == [wanted]:
                return
            others = [s for s in statements if not _names(s, principal)]
            self.put_policy({"Version": POLICY_VERSION, "Statement": [*others, wanted]})

    def revoke(self, namespace: str) -> None:
        """The bucket policy no longer grants the namespace's principals anything (a namespace that is
        gone). The policy holds a statement per principal and the server reads it on every request of a
        principal (versitygw evaluates the whole policy each time), so what is no longer needed is taken
        out."""
        principals = {access_key(namespace, access) for access in Access}
        with _POLICY_LOCK:
            policy = self.policy()
            statements = policy.get("Statement") or []
            kept = [s for s in statements if not any(_names(s, p) for p in principals)]
            if not kept and statements:
                self.delete_policy()  # a policy needs a statement; without one, the bucket's ACL rules
            elif len(kept) != len(statements):
                self.put_policy({"Version": POLICY_VERSION, "Statement": kept})

    def policy(self) -> dict[str, Any]:
        bucket = f"/{self.location.bucket}"
        status, body = self._request("GET", bucket, query={"policy": ""})
        if status == 404 and _NO_POLICY in body:
            return {"Version": POLICY_VERSION, "Statement": []}
        if status != 200:
            raise StoreRefused("get-bucket-policy", self.location.bucket, f"HTTP {status}: {_short(body)}")
        policy: dict[str, Any] = json.loads(body)
        return policy

    def put_policy(self, policy: Mapping[str, Any]) -> None:
        body = json.dumps(policy, separators=(",", ":")).encode()
        status, answer = self._request("PUT", f"/{self.location.bucket}", query={"policy": ""}, body=body)
        if status not in (200, 204):
            # Named with its size: a server that keeps the policy where its size is bounded (versitygw's
            # posix backend without --sidecar: one extended attribute, 4 KiB on ext4) refuses it with 500.
            statements = len(policy.get("Statement") or [])
            size = f"a policy of {len(body)} bytes, {statements} statements"
            raise StoreRefused(
                "put-bucket-policy", self.location.bucket, f"HTTP {status} ({size}): {_short(answer)}"
            )

    def delete_policy(self) -> None:
        status, answer = self._request("DELETE", f"/{self.location.bucket}", query={"policy": ""})
        if status not in (200, 204):
            detail = f"HTTP {status}: {_short(answer)}"
            raise StoreRefused("delete-bucket-policy", self.location.bucket, detail)

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


def _local(tag: str) -> str:
    """An XML element's name without its namespace."""
    return tag.rsplit("}", 1)[-1]


def _xml(text: str) -> str:
    return xml.sax.saxutils.escape(text)


def _short(body: bytes) -> str:
    return body[:300].decode(errors="replace")
