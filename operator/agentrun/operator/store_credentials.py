"""Whether a Run's namespace holds the Secret of its state-store credentials, asked of the API server; and,
with the bundled object store, the namespace's principals and Secrets made when it has none.

Before a Pod takes the credentials by secretKeyRef, the operator reads the Secret (by name only: its RBAC
grants `get` on that name, never a list of the namespace's Secrets), so a missing one fails the Run with
what to create (core.store_credentials) instead of leaving its Pod in CreateContainerConfigError. A namespace
found to hold it is not asked again for a while; one found without it is asked again at the next look,
so a Secret created since is seen at once.

With the bundled server (AGENTRUN_STATE_STORE_PROVISION=versitygw, the operator holding the server's
root credentials), a namespace that opts its agents' ServiceAccount in gets its bucket and principals: one
that gets and puts under the namespace's prefix (the Secret attempt Pods read) and one that only reads
(the `-read` Secret people read with); both Secrets also hold the namespace's URL
(AGENTRUN_STATE_STORE_URL, naming its bucket). They are made idempotently (agentrun.statestore.principals)
when the namespace opts in (operator.store_principals, which also takes them back once the namespace is
gone), and again at a Run whose namespace lacks its Secret (one deleted since, or a Run quicker than
that sweep): looking for the Secret only reads, the Run's table asks for them to be made
(core.plan.ProvisionStoreCredentials), and the executor carries that out here (provision).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Mapping

from agentrun.clock import Clock
from agentrun.core.pods import STATE_STORE_URL_ENV, StateStorePodEnv
from agentrun.core.store_credentials import needs_secret
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.operator.settings import OperatorSettings
from agentrun.statestore import StoreRefused, StoreUnavailable, parse_store_url
from agentrun.statestore.principals import Access, BundledStore
from agentrun.statestore.sigv4 import S3Credentials

log = logging.getLogger("agentrun.operator")
JsonDict = dict[str, object]

# How long a namespace found holding the Secret is taken as holding it (one deleted meanwhile is seen this
# late: its Pod then waits for the Secret, as Kubernetes shows).
FOUND_SECONDS = 60.0
READ_SECRET_SUFFIX = "-read"
MANAGED_BY = "app.kubernetes.io/managed-by"


def read_secret_name(secret: str) -> str:
    """The Secret of the read-only principal people read a namespace's state with."""
    return secret + READ_SECRET_SUFFIX


class StoreCredentials:
    """The state store attempt Pods are told of, and which namespaces hold its credentials' Secret."""

    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        store: StateStorePodEnv | None,
        bundled: BundledStore | None = None,
    ) -> None:
        self.api, self.clock, self.store, self.bundled = api, clock, store, bundled
        self._found_until: dict[str, float] = {}
        self._unchecked_said = False
        # One provisioning of a namespace at a time (a sweep and a Run's reconcile may both want it):
        # the second finds the first's Secret and keeps its credentials.
        self._making: dict[str, asyncio.Lock] = {}

    @classmethod
    def for_settings(
        cls, api: KubeApi, clock: Clock, config: OperatorSettings, environ: Mapping[str, str] = os.environ
    ) -> StoreCredentials:
        """As configured: with the bundled server, administered with the operator's own store credentials."""
        return cls(api, clock, config.state_store_pod_env(), bundled_store(config, environ))

    @property
    def provisions(self) -> bool:
        """Whether this operator makes a namespace's principals and Secrets itself (the bundled server)."""
        return self.store is not None and self.bundled is not None

    async def missing(self, namespace: str) -> bool:
        """Whether attempt Pods of `namespace` would lack the store's Secret (False when no Secret is
        needed, or when this operator may not read it: it says so once, and Pods start as they would).
        Only reads: with the bundled server, the Run's table asks for them to be made (provision)."""
        if self.store is None or not needs_secret(self.store):
            return False
        until = self._found_until.get(namespace)
        if until is not None and self.clock.monotonic() < until:
            return False
        found = await self._secret_found(namespace)
        if found:
            self._found_until[namespace] = self.clock.monotonic() + FOUND_SECONDS
        else:
            self._found_until.pop(namespace, None)
        return not found

    async def provision(self, namespace: str) -> bool:
        """The namespace's two principals on the bundled server and their Secrets (idempotent: a Secret
        there already keeps its credentials). False when the server refused (said in the log); a server
        that does not answer raises, and the Run is looked at again later."""
        assert self.store is not None and self.bundled is not None
        async with self._making.setdefault(namespace, asyncio.Lock()):
            return await self._provision(namespace)

    async def _provision(self, namespace: str) -> bool:
        assert self.store is not None and self.bundled is not None
        try:
            for access, name in (
                (Access.WRITE, self.store.secret),
                (Access.READ, read_secret_name(self.store.secret)),
            ):
                await self._principal(namespace, access, name)
        except StoreRefused as exc:
            log.warning("cannot make namespace %s's principals on the state store: %s", namespace, exc)
            return False
        log.info("made namespace %s's principals on the state store and their Secrets", namespace)
        return True

    async def take_back(self, namespace: str) -> None:
        """The principals of a namespace that is gone: out of their bucket's policy, then deleted (its
        Secrets went with the namespace). A server that refuses or does not answer raises: the next
        sweep tries again."""
        assert self.bundled is not None
        self._found_until.pop(namespace, None)
        async with self._making.setdefault(namespace, asyncio.Lock()):
            await asyncio.to_thread(self.bundled.take_back, namespace)
        self._making.pop(namespace, None)
        log.info("took back namespace %s's principals on the state store (the namespace is gone)", namespace)

    async def _principal(self, namespace: str, access: Access, name: str) -> None:
        assert self.bundled is not None and self.store is not None
        secret = await self.api.get(self.api.core_path("secrets", namespace, name))
        held = _credentials(secret) if secret is not None else None
        credentials = await asyncio.to_thread(self.bundled.ensure, namespace, access, held)
        # The namespace's own URL (its bucket) beside the keys: what people set to read with the Secret.
        url = self.store.url_of(namespace)
        if secret is not None:  # kept as it is (its RBAC has no `patch secrets`: it was made whole)
            return
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY: "agentrun"}},
            "type": "Opaque",
            "stringData": {**credentials.env(), STATE_STORE_URL_ENV: url},
        }
        try:
            await self.api.create(self.api.core_path("secrets", namespace), body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            await self._principal(namespace, access, name)  # made meanwhile: its credentials win

    async def _secret_found(self, namespace: str) -> bool:
        assert self.store is not None
        try:
            return await self.api.get(self.api.core_path("secrets", namespace, self.store.secret)) is not None
        except ApiError as exc:
            if exc.status != 403:
                raise
            if not self._unchecked_said:
                self._unchecked_said = True
                log.warning(
                    "cannot check for the state store's Secret %s in agents' namespaces (%s): grant the "
                    "operator `get secrets` on that name, as its chart does",
                    self.store.secret,
                    exc,
                )
            return True


def bundled_store(config: OperatorSettings, environ: Mapping[str, str] = os.environ) -> BundledStore | None:
    """The bundled server, administered with the operator's own store credentials (its root); None unless
    the operator is told AGENTRUN_STATE_STORE_PROVISION with a store URL."""
    store = config.state_store_pod_env()
    if store is None or not config.state_store_provision:
        return None
    if not environ.get("AWS_ACCESS_KEY_ID") or not environ.get("AWS_SECRET_ACCESS_KEY"):
        raise ValueError(
            "AGENTRUN_STATE_STORE_PROVISION needs the bundled server's root credentials in the "
            "operator's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    admin = S3Credentials(environ["AWS_ACCESS_KEY_ID"], environ["AWS_SECRET_ACCESS_KEY"])
    return BundledStore(parse_store_url(store.url), admin)


class BucketNotReady(RuntimeError):
    """The operator must not start: the bundled server refused, or did not answer in time (the message
    says which, and what to look at)."""


async def prepare_bucket(
    bundled: BundledStore, clock: Clock, *, within: float, interval: float = 1.0
) -> None:
    """The bundled server's bucket exists with versioning Enabled (idempotent), before the operator starts:
    the collector, archives and the namespaces' principals all need it. The server starts beside the
    operator (its StatefulSet), so one that does not answer yet is waited for, up to `within` seconds; one
    that refuses (wrong root credentials, ...) stops the start at once."""
    bucket, endpoint = bundled.location.bucket, bundled.endpoint
    deadline = clock.monotonic() + within
    said = False
    while True:
        try:
            await asyncio.to_thread(bundled.prepare_bucket)
        except StoreUnavailable as error:
            if clock.monotonic() >= deadline:
                raise BucketNotReady(
                    f"the bundled state store at {endpoint} did not answer within {within:g} s ({error}): "
                    "is its StatefulSet's Pod running? (kubectl get pods -l "
                    "app.kubernetes.io/component=state-store)"
                ) from None
            if not said:
                said = True
                log.info("waiting for the bundled state store at %s to answer (%s)", endpoint, error)
            await clock.sleep(interval)
            continue
        except StoreRefused as error:
            raise BucketNotReady(
                f"the bundled state store at {endpoint} refused to prepare bucket {bucket}: {error} "
                "(the operator's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be the server's root; a "
                "bucket that exists under other credentials means the server's volume outlived the root "
                "Secret it was made with: bring that Secret back, or delete the claim of the volume)"
            ) from None
        log.info("state store bucket %s at %s is there with versioning Enabled", bucket, endpoint)
        return


def _credentials(secret: Mapping[str, object]) -> S3Credentials | None:
    """The credentials a Secret holds (its data is base64), None when it holds none."""
    data = secret.get("data")
    if not isinstance(data, Mapping):
        return None
    values = {key: base64.b64decode(str(value)).decode() for key, value in data.items()}
    if "AWS_ACCESS_KEY_ID" not in values or "AWS_SECRET_ACCESS_KEY" not in values:
        return None
    return S3Credentials(values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"])
