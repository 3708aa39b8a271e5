"""A client of masd's HTTP listener, as its peers and operators use it (httpx).

Contract messages go to :data:`MESSAGES_PATH` with a peer's secret; the read
side (a case, its thread page by page) and the test clock take the admin
secret.  :func:`envelope` gives a message its version and a fresh ``id``.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

import httpx

from masd.edges.http.shared import CASES_PATH, CLOCK_PATH, MESSAGES_PATH

__all__ = ["CASES_PATH", "CLOCK_PATH", "MESSAGES_PATH", "MasdClient", "bearer", "envelope"]

#: The largest thread page the read side serves.
PAGE: Final = 1000


def envelope(mtype: str | None = None, **fields: Any) -> dict[str, Any]:
    """A contract message: ``mas_modes_version``, a fresh ``id``, ``type``, then ``fields``."""
    message: dict[str, Any] = {"mas_modes_version": "0.1", "id": secrets.token_hex(16)}
    if mtype is not None:
        message["type"] = mtype
    message.update(fields)
    return message


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class MasdClient:
    """Requests to one masd at ``base_url`` (``http://127.0.0.1:PORT``); ``http`` is
    the underlying ``httpx.AsyncClient`` for anything else."""

    def __init__(self, base_url: str, *, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, trust_env=False)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def send(
        self, message: Mapping[str, Any], token: str, *, url: str | None = None
    ) -> httpx.Response:
        """POST a contract message as JSON, to ``url`` or to :data:`MESSAGES_PATH`."""
        return await self.http.post(url or MESSAGES_PATH, json=dict(message), headers=bearer(token))

    async def healthy(self) -> bool:
        """``GET /healthz`` answers 200 (False when nothing answers)."""
        try:
            response = await self.http.get("/healthz")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def case(self, key: str, admin: str) -> httpx.Response:
        """``GET`` the case whose address or key is ``key``."""
        return await self.http.get(_case_path(key), headers=bearer(admin))

    async def thread(self, key: str, admin: str) -> tuple[int, list[Any]]:
        """Every entry of the case's thread, page after page: (HTTP status, entries).

        A status other than 200 ends the reading (with the entries read so far).
        """
        entries: list[Any] = []
        after = 0
        while True:
            response = await self.http.get(
                _case_path(key) + "/thread",
                params={"after": after, "limit": PAGE},
                headers=bearer(admin),
            )
            if response.status_code != 200:
                return response.status_code, entries
            page = response.json()
            entries += page.get("entries", [])
            if not page.get("entries"):
                return 200, entries
            after = page["next"]

    async def advance_clock(self, seconds: float, admin: str) -> httpx.Response:
        """Move ``masd serve --test-clock``'s clock on by ``seconds``."""
        return await self.http.post(CLOCK_PATH, json={"advance": seconds}, headers=bearer(admin))


def _case_path(key: str) -> str:
    return f"{CASES_PATH}/{quote(key, safe='')}"
