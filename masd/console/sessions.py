"""Who is signed in to the console: sessions held in memory, each with an expiry.

Signing in with the admin secret opens a :class:`Session`: a random token (the cookie's
value) and a random CSRF token (in every form that changes anything).  A session ends when
its owner signs out, when it has not been used for :data:`IDLE` seconds, :data:`LONGEST`
seconds after it began, when the admin secret changes (a reload with a new secret signs
everyone out), and when masd stops.  At most :data:`MAX_SESSIONS` are held; one more ends
the oldest.

Tokens are looked up by their SHA-256, so the lookup does not depend on how much of a
guessed token is right.  Times are the caller's clock (seconds).

The sessions also hold the sign-in's :class:`~masd.console.throttle.SignInThrottle`: who
gave a wrong secret, and how long each must wait before trying again.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Final

from masd.console.throttle import SignInThrottle

#: Seconds a session lasts without being used.
IDLE: Final = 30 * 60.0
#: Seconds a session lasts at most.
LONGEST: Final = 12 * 3600.0
#: Sessions held at once.
MAX_SESSIONS: Final = 1000


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


@dataclass
class Session:
    """One signed-in browser: its CSRF token and until when it lasts."""

    csrf: str
    began: float
    expires: float
    #: The SHA-256 of the admin secret it was opened with.
    secret: bytes
    #: What the last change did, shown once on the next page (post, redirect, get).
    flash: str | None = None

    def take_flash(self) -> str | None:
        said, self.flash = self.flash, None
        return said

    def csrf_matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())


class Sessions:
    """The console's sessions (one set per HTTP edge)."""

    def __init__(self, *, idle: float = IDLE, longest: float = LONGEST) -> None:
        self.idle = idle
        self.longest = longest
        self._held: dict[bytes, Session] = {}
        #: Wrong secrets by client, and the waits they earned.
        self.throttle = SignInThrottle()

    def __len__(self) -> int:
        return len(self._held)

    def open(self, secret: str, now: float) -> tuple[str, Session]:
        """A new session for someone who gave ``secret``: (its token, the session)."""
        self._prune(now)
        while len(self._held) >= MAX_SESSIONS:
            del self._held[next(iter(self._held))]  # the oldest (dicts keep order)
        token = secrets.token_urlsafe(32)
        session = Session(secrets.token_urlsafe(32), now, now + self.idle, _digest(secret))
        self._held[_digest(token)] = session
        return token, session

    def find(
        self, token: str | None, secret: str | None, now: float, *, touch: bool = True
    ) -> Session | None:
        """The live session of ``token`` while the admin secret is still ``secret``; its
        idle expiry starts again (unless ``touch`` is false: a page left open following the
        live feed is not a use).  None (and the session ended) otherwise."""
        if not token:
            return None
        key = _digest(token)
        session = self._held.get(key)
        if session is None:
            return None
        current = secret is not None and hmac.compare_digest(session.secret, _digest(secret))
        if not current or now >= session.expires:
            del self._held[key]
            return None
        if touch:
            session.expires = min(now + self.idle, session.began + self.longest)
        return session

    def close(self, token: str | None) -> None:
        """Sign-out: the session of ``token`` ends (nothing happens for an unknown one)."""
        if token:
            self._held.pop(_digest(token), None)

    def _prune(self, now: float) -> None:
        for key in [k for k, s in self._held.items() if now >= s.expires]:
            del self._held[key]
