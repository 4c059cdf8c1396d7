"""The agent-state store as the CLI opens it: the one AGENTRUN_STATE_STORE_URL names, its credentials in
the environment (for people: the namespace's read-only Secret, docs/state-store.md). One place, so that
every command says the same thing when it is not configured, and `app.main` knows whether this process
opened one (then it ends without finalizing the interpreter: obstore's threads may still wind down)."""

from __future__ import annotations

import os
from typing import Final

from agentrun.cli.errors import CliError
from agentrun.statestore import BlobStore, StateStoreError

STORE_URL_ENV: Final = "AGENTRUN_STATE_STORE_URL"
_OPENED: list[BlobStore] = []


def store_url() -> str | None:
    return os.environ.get(STORE_URL_ENV, "").strip() or None


def open_store(what: str) -> BlobStore:
    """The configured store; a clear error saying what to set when there is none or it is malformed."""
    url = store_url()
    if url is None:
        raise CliError(
            f"{what} is in the state store: set {STORE_URL_ENV} and the store's credentials (the "
            "namespace's read-only Secret) to read it"
        )
    try:
        store = BlobStore.from_url(url)
    except StateStoreError as exc:
        raise CliError(f"{what}: {exc}") from None
    _OPENED.append(store)
    return store


def store_used() -> bool:
    """Whether this process opened the store."""
    return bool(_OPENED)
