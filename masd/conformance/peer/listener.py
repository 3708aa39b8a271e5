"""The kit's own HTTP listener: where the peer under test posts, as it would to email.

It serves ``POST /mas/v0.1/messages`` on a loopback address, records every
request (headers, body, whether the Bearer secret was the peer's) as a
:class:`Post`, and answers through the ``answer`` function the run gives it,
the way email would (``200 {"ok": true}``, a ``case.assign``'s case, a
refusal).  A request with a wrong or missing secret is recorded too, and
answered ``401 unauthenticated``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

__all__ = ["Answer", "KitListener", "Post"]

MESSAGES_PATH: Final = "/mas/v0.1/messages"
#: An answer: status and JSON body.
Answer = tuple[int, dict[str, Any]]


@dataclass(frozen=True)
class Post:
    """One request the peer sent the kit."""

    path: str
    headers: dict[str, str]  # names lower-case
    body: bytes
    json: Any  # None when the body is not JSON
    authenticated: bool  # the Bearer secret was the peer's
    answer: Answer

    @property
    def type(self) -> str:
        return str(self.json.get("type")) if isinstance(self.json, dict) else "(not JSON)"


class KitListener:
    """Listens on ``host:port`` (port 0: any free one) until :meth:`close`."""

    def __init__(self, token: str, answer: Callable[[Post], Answer]) -> None:
        self._token = token
        self._answer = answer
        self.posts: list[Post] = []
        self._arrived = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> KitListener:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        bound = self._runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in str(bound[0]) else str(bound[0])
        self.url = f"http://{shown}:{bound[1]}{MESSAGES_PATH}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_more(self, count: int, timeout: float) -> bool:
        """Wait until more than ``count`` posts have arrived; False after ``timeout``."""
        try:
            async with asyncio.timeout(timeout), self._arrived:
                await self._arrived.wait_for(lambda: len(self.posts) > count)
        except TimeoutError:
            return len(self.posts) > count
        return True

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            decoded: Any = json.loads(body)
        except ValueError:
            decoded = None
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {self._token}"
        authenticated = hmac.compare_digest(given.encode(), expected.encode())
        post = Post(
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            json=decoded,
            authenticated=authenticated,
            answer=(0, {}),
        )
        if request.method != "POST" or request.path != MESSAGES_PATH:
            answer: Answer = (404, _refusal("not-found", f"{request.method} {request.path}"))
        elif not authenticated:
            answer = (401, _refusal("unauthenticated", "Authorization: not the peer's secret"))
        else:
            answer = self._answer(post)
        post = Post(post.path, post.headers, body, decoded, authenticated, answer)
        async with self._arrived:
            self.posts.append(post)
            self._arrived.notify_all()
        return web.json_response(answer[1], status=answer[0])


def _refusal(code: str, detail: str) -> dict[str, Any]:
    return {"ok": False, "error": code, "detail": detail}
