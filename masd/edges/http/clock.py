"""``/mas/v0.1/test/clock``: the test clock, served only with ``masd serve --test-clock``
(which requires loopback listeners).

``GET`` tells masd's time; ``POST {"advance": seconds}`` moves it forward.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from masd import service
from masd.clock import TestClock
from masd.core import wire
from masd.core.errors import WireError
from masd.edges.http.shared import CLOCK_PATH, HttpRefusal, Route, Served


async def tick(request: web.Request, edge: Served) -> web.StreamResponse:
    assert isinstance(edge.clock, TestClock)
    if request.method == "POST":
        try:
            body = wire.loads(await request.read())
            seconds = body["advance"]
            if isinstance(seconds, bool) or not isinstance(seconds, int | float):
                raise TypeError(seconds)
            if not 0 <= seconds <= 10 * 365 * 86400:
                raise ValueError(seconds)
        except WireError as exc:
            raise HttpRefusal(exc.code, exc.detail) from exc
        except (ValueError, TypeError, KeyError) as exc:
            raise HttpRefusal(
                "invalid-message", f"advance: {exc!s:.80} is not a number of seconds >= 0"
            ) from exc
        edge.clock.advance(float(seconds))
        # Deadlines and retries may be due now: the timer and the outbox look again.
        edge.on_commit.committed(service.ALL_WAKES)
    return web.json_response({"ok": True, "now": edge.clock.now()})


ROUTES: Final = (
    Route("POST", CLOCK_PATH, tick, "admin"),
    Route("GET", CLOCK_PATH, tick, "admin"),
)
