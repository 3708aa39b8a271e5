"""A store job's transaction on libpq's pipeline, driven from psycopg's ``pq`` binding.

psycopg's cursors in pipeline mode spend about 25 µs of the interpreter per
statement (a cursor, its query object, and the generators that ask the
socket whether it can read or write after every statement); a delivery's
job sends about ten.  Here a statement is one call into libpq
(``PQsendQueryParams``) with its parameters dumped by psycopg's own
:class:`~psycopg.adapt.Transformer` (the same types, the same text), and the
socket is waited on only where the job reads a result or commits: the
statements queued before are sent with a ``Sync`` and their results read in
one round trip, as psycopg's ``Pipeline.sync`` does.

The rules of libpq's pipeline that shape it:

- the results come back in the order the statements were sent, one result
  then a null for each, and one ``PIPELINE_SYNC`` for each ``Sync``;
- a statement that fails makes every later one up to the next ``Sync`` come
  back ``PIPELINE_ABORTED``: the first error is the job's, raised as
  psycopg raises it (:func:`psycopg.errors.error_from_result`, so its
  SQLSTATE class is the same and :meth:`masd.store.backend.Dialect.classify`
  reads it unchanged);
- the transaction is the server's: ``BEGIN`` is the first statement,
  ``COMMIT`` the last, and after an error only a ``ROLLBACK`` (or a
  ``ROLLBACK TO SAVEPOINT``) sent after a ``Sync`` is carried out;
- pipeline mode is left only with nothing pending, so every way out of
  :class:`Transaction` reads what it sent before it leaves.

A connection that fails (``PQconsumeInput`` or ``PQflush`` failing) is left
``BAD`` by libpq: psycopg's ``Connection.broken`` then says so, and the pool
drops it.
"""

from __future__ import annotations

import contextlib
import select
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.errors import error_from_result

from masd.store.backend import numbered

_OK: Final = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK, pq.ExecStatus.EMPTY_QUERY)
_SYNC: Final = pq.ExecStatus.PIPELINE_SYNC
_ABORTED: Final = pq.ExecStatus.PIPELINE_ABORTED


class Result:
    """One statement's result as a DB-API cursor shows it (:class:`masd.store.backend.Cursor`):
    read on first use, which sends what is queued and waits for it."""

    __slots__ = ("_next", "_pipe", "_res", "_rows")

    def __init__(self, pipe: Transaction) -> None:
        self._pipe = pipe
        self._res: pq.abc.PGresult | None = None
        self._rows: list[tuple[Any, ...]] | None = None
        self._next = 0

    def _got(self) -> pq.abc.PGresult:
        if self._res is None:
            self._pipe.sync()
        assert self._res is not None, "a statement's result was not read"
        return self._res

    @property
    def description(self) -> list[tuple[str, int]] | None:
        res = self._got()
        if not res.nfields:
            return None
        enc = self._pipe.encoding
        return [((res.fname(i) or b"").decode(enc), res.ftype(i)) for i in range(res.nfields)]

    @property
    def rowcount(self) -> int:
        count = self._got().command_tuples
        return -1 if count is None else count

    def _loaded(self) -> list[tuple[Any, ...]]:
        if self._rows is None:
            self._rows = self._pipe.load(self._got())
        return self._rows

    def fetchone(self) -> tuple[Any, ...] | None:
        rows = self._loaded()
        if self._next >= len(rows):
            return None
        self._next += 1
        return rows[self._next - 1]

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows = self._loaded()
        rest, self._next = rows[self._next :], len(rows)
        return rest


class Transaction:
    """One transaction of ``conn`` in pipeline mode (a write's or a read's, as ``begin``
    says); see the module docstring.

    ``begin`` is sent as the pipeline opens; :meth:`commit` ends it; leaving the
    ``with`` block otherwise rolls it back.  ``conn`` must be idle, in autocommit, and
    is idle again (or broken) when the block ends.
    """

    def __init__(self, conn: psycopg.Connection[Any], begin: str) -> None:
        self._conn = conn
        self._pg = conn.pgconn
        self.encoding = conn.info.encoding
        self._tx = Transformer(conn)
        #: One entry per statement sent and not yet answered, in order.
        self._queue: deque[Result | None] = deque()
        self._syncs = 0  # Syncs sent and not yet answered
        self._poll = select.poll()
        self._savepoints = 0
        self._begin = begin
        self._committed = False

    def __enter__(self) -> Transaction:
        self._pg.enter_pipeline_mode()
        self.send(self._begin)
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if self._conn.broken:
            return
        with contextlib.suppress(psycopg.Error):
            if not self._committed:
                with contextlib.suppress(psycopg.Error):
                    self.sync()
                self.send("ROLLBACK")
                self.sync()
        if self._conn.broken:
            return
        try:
            self._pg.exit_pipeline_mode()
        except psycopg.Error:
            self._conn.close()  # results still pending: the pool drops a closed connection

    # -- statements -------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        """Queue ``sql`` (``?`` placeholders) with ``params``; its result, read when used."""
        query, count = numbered(sql)
        if len(params) != count:
            raise psycopg.ProgrammingError(
                f"the query has {count} placeholders but {len(params)} parameters were passed"
            )
        if params:
            values = self._tx.dump_sequence(params, (PyFormat.AUTO,) * count)
            self._pg.send_query_params(
                query, values, param_types=self._tx.types, param_formats=self._tx.formats
            )
        else:
            self._pg.send_query_params(query, None)
        result = Result(self)
        self._queue.append(result)
        return result

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> None:
        for one in params:
            self.execute(sql, tuple(one))

    def send(self, sql: str) -> None:
        """Queue a statement without parameters whose result nobody reads."""
        self._pg.send_query_params(sql.encode(), None)
        self._queue.append(None)

    def commit(self) -> None:
        """Send ``COMMIT`` with what is queued; raise the first error of any of them."""
        self.send("COMMIT")
        self.sync()
        self._committed = True

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """An exception leaving the block undoes what it sent, alone; the block's own
        statements are answered before it ends, so an error of theirs is raised in it."""
        self._savepoints += 1
        name = f"masd_{self._savepoints}"
        self.send(f"SAVEPOINT {name}")
        try:
            yield
            self.sync()
        except BaseException:
            if not self._conn.broken:
                with contextlib.suppress(psycopg.Error):
                    self.sync()
                self.send(f"ROLLBACK TO SAVEPOINT {name}")
                self.send(f"RELEASE SAVEPOINT {name}")
            raise
        self.send(f"RELEASE SAVEPOINT {name}")

    # -- the socket -------------------------------------------------------------------

    def sync(self) -> None:
        """Send a ``Sync`` after what is queued and read every result up to it; raise
        the first error among them."""
        if not self._queue and not self._syncs:
            return
        self._pg.pipeline_sync()
        self._syncs += 1
        self._flush()
        error: psycopg.Error | None = None
        while self._syncs:
            res = self._next_result()
            status = res.status
            if status == _SYNC:
                self._syncs -= 1
                continue
            entry = self._queue.popleft()
            if status in _OK:
                if entry is not None:
                    entry._res = res
            elif error is None:
                error = (
                    error_from_result(res, encoding=self.encoding)
                    if status != _ABORTED
                    else psycopg.OperationalError("statement not run: the pipeline was aborted")
                )
        if error is not None:
            if self._conn.broken and not isinstance(error, psycopg.OperationalError):
                raise psycopg.OperationalError(str(error)) from error
            raise error

    def _next_result(self) -> pq.abc.PGresult:
        """The next result libpq has (not the null after each statement's), waiting for
        the socket as long as libpq needs more input."""
        pg = self._pg
        while True:
            while pg.is_busy():
                self._wait(select.POLLIN)
                pg.consume_input()
            res = pg.get_result()
            if res is not None:
                return res
            if pg.status == pq.ConnStatus.BAD:
                raise psycopg.OperationalError("the connection to the server was lost")

    def _flush(self) -> None:
        while self._pg.flush():
            self._wait(select.POLLIN | select.POLLOUT)
            self._pg.consume_input()  # the server may answer before it reads it all

    def _wait(self, events: int) -> None:
        fd = self._pg.socket
        self._poll.register(fd, events)
        try:
            self._poll.poll()
        finally:
            self._poll.unregister(fd)

    def load(self, res: pq.abc.PGresult) -> list[tuple[Any, ...]]:
        """``res``'s rows as tuples of Python values, loaded as psycopg loads them."""
        if not res.ntuples:
            return []
        tx = self._tx
        tx.set_pgresult(res)
        try:
            return tx.load_rows(0, res.ntuples, tuple)
        finally:
            tx.set_pgresult(None)
