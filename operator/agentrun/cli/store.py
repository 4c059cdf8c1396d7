"""The agent-state store as the CLI opens it: the one AGENTRUN_STATE_STORE_URL names, its credentials in
the environment; without that, the namespace's read-only Secret (`agentrun-state-store-read`, made by the
operator on its bundled store: the namespace's own URL and a principal that only reads), read with the
user's own Kubernetes credentials. One place, so that every command says the same thing when neither is
there or the user may not get the Secret, and `app.main` knows whether this process opened a store (then
it ends without finalizing the interpreter: obstore's threads may still wind down)."""

from __future__ import annotations

import base64
import os
from typing import Final

from agentrun.cli.errors import CliError
from agentrun.kubeapi import ApiError, KubeApi
from agentrun.rbac import STATE_STORE_SECRET
from agentrun.statestore import BlobStore, StateStoreError

STORE_URL_ENV: Final = "AGENTRUN_STATE_STORE_URL"
# The name of the namespaces' Secret, as the operator is told it (its default: agentrun-state-store);
# people read with the one beside it, suffixed -read.
STORE_SECRET_ENV: Final = "AGENTRUN_STATE_STORE_SECRET"
READ_SUFFIX: Final = "-read"
# What a client takes from the Secret besides the URL (the operator writes these; any other key is left).
CREDENTIAL_KEYS: Final = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_OPENED: dict[str, BlobStore] = {}


def store_url() -> str | None:
    return os.environ.get(STORE_URL_ENV, "").strip() or None


def read_secret_name() -> str:
    """The namespace's read-only Secret people read its archives and state with."""
    return (os.environ.get(STORE_SECRET_ENV, "").strip() or STATE_STORE_SECRET) + READ_SUFFIX


async def open_store(what: str, api: KubeApi, namespace: str) -> BlobStore:
    """The store `what` is in, for `namespace`: the one the environment configures, else the one the
    namespace's read-only Secret names with its credentials; a clear error naming what is missing."""
    url = store_url()
    # one client per store the environment names, or per namespace whose Secret names it
    key = f"url {url}" if url is not None else f"namespace {namespace}"
    if key in _OPENED:
        return _OPENED[key]
    env = None
    if url is None:
        url, env = await _read_secret(what, api, namespace)
    try:
        store = BlobStore.from_url(url, env=env)
    except StateStoreError as exc:
        raise CliError(f"{what}: {exc}") from None
    _OPENED[key] = store
    return store


async def _read_secret(what: str, api: KubeApi, namespace: str) -> tuple[str, dict[str, str]]:
    name = read_secret_name()
    yourself = f"or set {STORE_URL_ENV} and the store's credentials (AWS_* variables) yourself"
    try:
        secret = await api.get(api.core_path("secrets", namespace, name))
    except ApiError as exc:
        if exc.status != 403:
            raise
        raise CliError(
            f"{what} is in the state store, read with the Secret {name} of namespace {namespace}, which you "
            f"may not get: ask for RBAC verb `get` on secrets, resource name {name}, in namespace "
            f"{namespace} (kubectl auth can-i get secret/{name} -n {namespace}), {yourself}"
        ) from None
    if secret is None:
        raise CliError(
            f"{what} is in the state store, but namespace {namespace} has no Secret {name} to read it with "
            f"(the operator makes it when the namespace opts in on its bundled store; else its "
            f"administrator provides it), {yourself}"
        )
    values = {k: base64.b64decode(str(v)).decode() for k, v in (secret.get("data") or {}).items()}
    url = values.get(STORE_URL_ENV, "").strip()
    if not url:
        raise CliError(
            f"{what}: the Secret {name} of namespace {namespace} holds no {STORE_URL_ENV}, {yourself}"
        )
    return url, {k: values[k] for k in CREDENTIAL_KEYS if k in values}


def store_used() -> bool:
    """Whether this process opened the store."""
    return bool(_OPENED)
