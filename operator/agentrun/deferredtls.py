"""aiohttp, imported without loading the system's CA certificates at import.

aiohttp builds its two default TLS contexts when it is imported (for requests with `ssl=True`, the
default, and `ssl=False`): each reads the system's CA bundle, about a fifth of the worker SDK's import
time. agentrun's own API requests never use them (agentrun.kubeauth builds the context a kubeconfig or
the service account names), so `aiohttp` is imported here with both made cheap: the verifying one loads
the same certificates just before its first handshake (`DeferredCertsContext`), and the one that
verifies nothing (CERT_NONE: no CA is ever consulted) loads none. An agent's own https request through
aiohttp's defaults is verified exactly as before.

If aiohttp was imported already (e.g. by kopf, in the operator), nothing changes.
"""

from __future__ import annotations

import contextlib
import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["DeferredCertsContext", "aiohttp", "deferred_default_context"]


class DeferredCertsContext(ssl.SSLContext):
    """An SSLContext whose `load_default_certs` takes effect at its first handshake (or when asked what
    it holds), not when it is called."""

    _purpose: ssl.Purpose | None = None
    _lock = threading.Lock()

    def load_default_certs(self, purpose: ssl.Purpose = ssl.Purpose.SERVER_AUTH) -> None:
        self._purpose = purpose

    def load_now(self) -> None:
        """Loads what `load_default_certs` asked for, once."""
        with self._lock:
            if self._purpose is not None:
                purpose, self._purpose = self._purpose, None
                super().load_default_certs(purpose)

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        self.load_now()
        return super().wrap_bio(*args, **kwargs)

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        self.load_now()
        return super().wrap_socket(*args, **kwargs)

    def get_ca_certs(self, binary_form: bool = False) -> Any:
        self.load_now()
        return super().get_ca_certs(binary_form)

    def cert_store_stats(self) -> dict[str, int]:
        self.load_now()
        return super().cert_store_stats()


def deferred_default_context(
    create: Callable[..., ssl.SSLContext] = ssl.create_default_context,
) -> Callable[..., ssl.SSLContext]:
    """`create` (ssl.create_default_context), making a DeferredCertsContext: the standard library's own
    recipe (protocol, verification, flags, key log) runs as ever, and the default certificates it loads
    are loaded when first needed instead. A context given CA files or data is made as ever."""
    load = ssl.SSLContext.load_default_certs

    def make(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        asked: list[ssl.Purpose] = []

        def note(context: ssl.SSLContext, purpose: ssl.Purpose = ssl.Purpose.SERVER_AUTH) -> None:
            asked.append(purpose)

        ssl.SSLContext.load_default_certs = note  # type: ignore[method-assign,assignment]
        try:
            context = create(*args, **kwargs)
        finally:
            ssl.SSLContext.load_default_certs = load  # type: ignore[method-assign]
        if not asked:
            return context
        if type(context) is not ssl.SSLContext:  # not the standard recipe: load as it asked, now
            for purpose in asked:
                load(context, purpose)
            return context
        context.__class__ = DeferredCertsContext  # the same object, with its loading deferred
        for purpose in asked:
            context.load_default_certs(purpose)
        return context

    return make


@contextlib.contextmanager
def _cheap_default_contexts() -> Iterator[None]:
    """While aiohttp is imported: its verifying default context defers its certificates, and one that
    verifies nothing loads none (their only use is verification)."""
    create, set_paths = ssl.create_default_context, ssl.SSLContext.set_default_verify_paths

    def set_default_verify_paths(context: ssl.SSLContext) -> None:
        if context.verify_mode != ssl.CERT_NONE:
            set_paths(context)

    ssl.create_default_context = deferred_default_context(create)
    ssl.SSLContext.set_default_verify_paths = set_default_verify_paths  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        ssl.create_default_context = create
        ssl.SSLContext.set_default_verify_paths = set_paths  # type: ignore[method-assign]


if "aiohttp" in sys.modules:
    import aiohttp
else:
    with _cheap_default_contexts():
        import aiohttp
