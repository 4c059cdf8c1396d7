"""Who may use the console: a one-time login token, exchanged for a session that expires.

The console acts with the kubeconfig of whoever started it, so a session is that person's browser
proving it holds the login URL the console printed. The login token is spent by its first use; the
session id lives only in an HttpOnly cookie; each session has its own CSRF token, which the page sends
back in a header with every write.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from agentrun.clock import Clock, SystemClock


@dataclass
class Session:
    id: str
    csrf: str
    expires: float  # on the monotonic clock of the clock the Sessions were given


class Sessions:
    """The login token and the live sessions of one console process."""

    def __init__(self, lifetime_seconds: float, clock: Clock | None = None) -> None:
        self.lifetime = lifetime_seconds
        self._clock = clock or SystemClock()
        self._login: str | None = secrets.token_urlsafe(32)
        self._sessions: dict[str, Session] = {}

    @property
    def login_token(self) -> str | None:
        """The token of the login URL until it is spent (None afterwards)."""
        return self._login

    def new_login_token(self) -> str:
        """A fresh login token (the old one, if unspent, no longer works): for a second browser."""
        self._login = secrets.token_urlsafe(32)
        return self._login

    def exchange(self, token: str) -> Session | None:
        """The session the login token opens, once; None for a wrong or spent token."""
        expected = self._login
        if expected is None or not hmac.compare_digest(token.encode(), expected.encode()):
            return None
        self._login = None
        session = Session(
            secrets.token_urlsafe(32), secrets.token_urlsafe(32), self._clock.monotonic() + self.lifetime
        )
        self._sessions[session.id] = session
        return session

    def find(self, session_id: str | None) -> Session | None:
        """The live session of a cookie's value; an expired one is forgotten."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if self._clock.monotonic() >= session.expires:
            del self._sessions[session_id]
            return None
        return session

    def end(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def seconds_left(self, session: Session) -> float:
        return max(session.expires - self._clock.monotonic(), 0.0)


def csrf_matches(session: Session, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(session.csrf.encode(), sent.encode())
