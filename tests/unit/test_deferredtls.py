"""aiohttp's default TLS contexts, made without reading the CA bundle at import (agentrun.deferredtls):
the same context as the standard library's, whose certificates load at its first handshake. (That
importing the SDK leaves aiohttp's own so is checked in a fresh interpreter: test_architecture.)"""

from __future__ import annotations

import ssl

from agentrun.deferredtls import DeferredCertsContext, deferred_default_context


def settings(context: ssl.SSLContext) -> tuple[object, ...]:
    return (
        context.protocol,
        context.verify_mode,
        context.check_hostname,
        context.options,
        context.verify_flags,
        context.minimum_version,
        context.maximum_version,
        context.post_handshake_auth,
    )


def loaded(context: ssl.SSLContext) -> int:
    """How many certificates the context holds, without making a deferred one load them."""
    return int(ssl.SSLContext.cert_store_stats(context)["x509"])


def test_the_deferred_default_context_is_the_standard_one_loaded_at_its_first_handshake() -> None:
    standard = ssl.create_default_context()
    deferred = deferred_default_context()()

    assert isinstance(deferred, DeferredCertsContext) and settings(deferred) == settings(standard)
    assert loaded(deferred) == 0 < loaded(standard)
    deferred.wrap_bio(ssl.MemoryBIO(), ssl.MemoryBIO(), server_hostname="example.org")
    assert loaded(deferred) == loaded(standard)
    assert deferred.get_ca_certs() == standard.get_ca_certs()


def test_asking_what_it_holds_loads_them_too() -> None:
    deferred = deferred_default_context()()
    assert deferred.cert_store_stats() == ssl.create_default_context().cert_store_stats()


def test_a_context_given_its_own_ca_is_made_as_ever() -> None:
    pem = ssl.DER_cert_to_PEM_cert(ssl.create_default_context().get_ca_certs(binary_form=True)[0])
    given = deferred_default_context()(cadata=pem)
    assert type(given) is ssl.SSLContext and loaded(given) == 1


def test_the_standard_library_is_left_as_it_was() -> None:
    assert ssl.create_default_context.__module__ == "ssl"
    assert ssl.SSLContext.load_default_certs.__module__ == "ssl"
    assert ssl.SSLContext.set_default_verify_paths.__qualname__ == "_SSLContext.set_default_verify_paths"
