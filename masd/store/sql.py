"""The handle a store job holds, and the few ways the store's modules use it.

A write job (:meth:`masd.store.Store.write`) and a read
(:meth:`masd.store.Store.read`) are handed a :class:`Tx`: the open
transaction they run in.  Outside :mod:`masd.store` it is opaque, a value to
pass to the store's functions (``masd.store.cases.load(tx, key)``, ...);
only the modules of this package see the connection behind it, through the
helpers below.  That keeps every SQL statement of masd in this package.

Behind a ``Tx`` is a :class:`masd.store.backend.Connection` (SQLite's is the
``sqlite_utils.Database`` of the writer or of a reader; PostgreSQL's is a
:class:`masd.store.pg_backend.PgTx`); :func:`dialect` says which SQL it speaks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, Protocol, TypeVar, cast

from masd.store.backend import SQLITE, Connection, Dialect


class Tx(Protocol):
    """An open store transaction (a write job's or a read's); see the module docstring."""


def db(tx: Tx) -> Connection:
    """The connection behind ``tx`` (for this package's modules only)."""
    return cast(Connection, tx)


def dialect(tx: Tx) -> Dialect:
    """The SQL ``tx`` speaks (:class:`masd.store.backend.Dialect`): SQLite's unless its
    backend says otherwise."""
    return cast(Dialect, getattr(tx, "masd_dialect", SQLITE))


def rerun(tx: Tx) -> bool:
    """Whether ``tx``'s job is running again, after a race rolled its earlier run back
    (where several hosts write; SQLite's one writer runs each job once)."""
    return bool(getattr(tx, "masd_rerun", False))


def lease(tx: Tx) -> tuple[str, float, float] | None:
    """Where several hosts send from the outbox: this host's name, the length of the lease it
    takes on a row (seconds, on the database's clock) and the monotonic time before the job's
    transaction began; None where one host sends (SQLite)."""
    return cast("tuple[str, float, float] | None", getattr(tx, "masd_lease", None))


def many(tx: Tx, sql: str, params: Sequence[Sequence[Any]]) -> None:
    """Run one statement once per parameter tuple of ``params``."""
    cast(Any, tx).conn.executemany(sql, params)


def one(tx: Tx, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
    """The first row of ``sql`` as a dict by column name, or None."""
    cur = db(tx).execute(sql, tuple(params))
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([c[0] for c in cur.description], row, strict=True))


def rows(tx: Tx, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Every row of ``sql``, each a dict by column name."""
    cur = db(tx).execute(sql, tuple(params))
    names = [c[0] for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def tuples(tx: Tx, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Every row of ``sql`` (or of its ``RETURNING`` clause), as tuples."""
    return cast(list[tuple[Any, ...]], db(tx).execute(sql, tuple(params)).fetchall())


def value(tx: Tx, sql: str, params: Sequence[Any] = ()) -> Any:
    """The first column of the first row of ``sql`` (None when there is no row)."""
    row = db(tx).execute(sql, tuple(params)).fetchone()
    return None if row is None else row[0]


def run(tx: Tx, sql: str, params: Sequence[Any] = ()) -> int:
    """Run one statement; the number of rows it changed (waited for: a round trip of its
    own where the database is across a network)."""
    return int(db(tx).execute(sql, tuple(params)).rowcount)


def send(tx: Tx, sql: str, params: Sequence[Any] = ()) -> None:
    """Run one statement whose count nobody reads: on PostgreSQL it goes out with the next
    statement whose result is read (pipeline mode, masd/store/pg_backend.py), and an error
    of its own is raised there, or at the commit."""
    db(tx).execute(sql, tuple(params))


T = TypeVar("T")


class AfterCommit(Generic[T]):
    """A store job's answer, read by its caller once the job's transaction committed
    (``answer = (await store.write(job))()``).

    On PostgreSQL the results a job leaves unread come back with its ``COMMIT``, in the
    round trip that ends it: a job that reads them before it returns waits for the
    server once more.  Only for a job none of whose writes depend on what it reads."""

    __slots__ = ("_read",)

    def __init__(self, read: Callable[[], T]) -> None:
        self._read = read

    def __call__(self) -> T:
        return self._read()


@contextmanager
def savepoint(tx: Tx) -> Iterator[None]:
    """A nested transaction inside the job: an exception leaving the block
    undoes what the block wrote (and goes on), the rest of the job stays."""
    with cast(Any, tx).atomic():
        yield


#: One encoder for every call (``json.dumps`` with options builds a new one each
#: time); it keeps no state between calls, so threads may share it.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def dumps(value: object) -> str:
    """The one JSON encoding of the JSON columns: compact, UTF-8, keys sorted."""
    return _ENCODER.encode(value)
