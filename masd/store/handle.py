"""What the rest of masd holds of a store, whichever the backend: :class:`StoreHandle`.

:class:`masd.store.Store` (an SQLite file, one host) and
:class:`masd.store.pg_backend.PgStore` (PostgreSQL, several hosts) both follow it,
and the edges, the read side and the commands are typed against it, so that
neither the driver of the other nor its module is needed to type-check them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from masd.store.health import HEALTH_SECONDS, StoreHealth
from masd.store.sql import Tx
from masd.store.writer import StoreStats

T = TypeVar("T")


class StoreHandle(Protocol):
    """An open store: jobs written and read, its health, its statistics, closing."""

    @property
    def path(self) -> object:
        """Where it is, for messages: a file's path, or a URI without its password."""
        ...

    @property
    def health(self) -> StoreHealth: ...

    @property
    def stats(self) -> StoreStats: ...

    async def write(self, fn: Callable[[Tx], T]) -> T: ...

    def write_sync(self, fn: Callable[[Tx], T]) -> T: ...

    async def read(self, fn: Callable[[Tx], T]) -> T: ...

    def read_sync(self, fn: Callable[[Tx], T]) -> T: ...

    async def check(self, max_age: float = HEALTH_SECONDS) -> StoreHealth: ...

    def close(self) -> None: ...

    def __enter__(self) -> StoreHandle: ...

    def __exit__(self, *exc: object) -> None: ...
