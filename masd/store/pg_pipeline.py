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

Statements are prepared on the server, once per connection and statement
text (and parameter types, which psycopg picks per value): the server then
parses a text once, not at every run, and may keep its plan.  The ``Parse``
goes out in the same pipeline as the statement's first run, so it costs no
round trip of its own.  A ``Parse`` the server skipped (the pipeline was
aborted by an earlier error) or refused is forgotten, and made again at the
text's next run.  A connection keeps :data:`MAX_PREPARED` statements (about 25 KB
of the server's memory each, with its plan); past them, the one least recently
run is dropped (``DEALLOCATE``, in the same pipeline).  A
statement the server no longer has as it was made (``26000``: something ran
``DISCARD ALL``; ``0A000``: a migration changed the columns a ``SELECT *``
returns) makes every connection's statements stale: the job is run again
(:class:`~masd.store.backend.Raced`) and each connection makes its statements
anew before its next one.

A connection that fails (``PQconsumeInput`` or ``PQflush`` failing) is left
``BAD`` by libpq: psycopg's ``Connection.broken`` then says so, and the pool
drops it.
"""

from __future__ import annotations

import contextlib
import itertools
import select
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.errors import error_from_result

from masd.store.backend import Raced, numbered

_OK: Final = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK, pq.ExecStatus.EMPTY_QUERY)
_SYNC: Final = pq.ExecStatus.PIPELINE_SYNC
_ABORTED: Final = pq.ExecStatus.PIPELINE_ABORTED
#: Statements one connection keeps prepared at most (module docstring).
MAX_PREPARED: Final = 100

#: What the server says of a statement it no longer has as it was prepared.
_STALE: Final = frozenset({"26000", "0A000"})

#: Waits until a socket (its descriptor) is ready for the ``select.POLL*`` events given.
Wait = Callable[[int, int], None]
_Key = tuple[bytes, tuple[int, ...]]  # a statement's text and its parameters' types
_epoch = 0  # raised when any connection found its statements stale (module docstring)


class _Statements:
    """What one connection has prepared: a name per (text, parameter types)."""

    __slots__ = ("epoch", "names", "numbers")

    def __init__(self) -> None:
        self.names: OrderedDict[_Key, bytes] = OrderedDict()  # least recently run first
        self.numbers = itertools.count(1)  # names are never reused on a connection
        self.epoch = _epoch

    @staticmethod
    def of(conn: psycopg.Connection[Any]) -> _Statements:
        found: _Statements | None = getattr(conn, "_masd_statements", None)
        if found is None:
            found = _Statements()
            conn._masd_statements = found  # type: ignore[attr-defined]
        return found


class _Prepare:
    """A ``Parse`` sent and not yet answered: forgotten unless the server made it."""

    __slots__ = ("key", "name", "statements")

    def __init__(self, statements: _Statements, key: _Key, name: bytes) -> None:
        self.statements = statements
        self.key = key
        self.name = name

    def failed(self) -> None:
        names = self.statements.names
        if names.get(self.key) == self.name:
            del names[self.key]


class Result:
    """One statement's result as a DB-API cursor shows it (:class:`masd.store.backend.Cursor`):
    read on first use, which sends what is queued and waits for it."""

    __slots__ = ("_next", "_pipe", "_res", "_rows", "made_before")

    def __init__(self, pipe: Transaction, made_before: bool) -> None:
        self._pipe = pipe
        #: Its statement was prepared by an earlier transaction (a stale one fails).
        self.made_before = made_before
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

    def __init__(self, conn: psycopg.Connection[Any], begin: str, wait: Wait | None = None) -> None:
        self._conn = conn
        self._pg = conn.pgconn
        self.encoding = conn.info.encoding
        self._tx = Transformer(conn)
        self._statements = _Statements.of(conn)
        #: One entry per statement sent and not yet answered, in order.
        self._queue: deque[Result | _Prepare | None] = deque()
        self._syncs = 0  # Syncs sent and not yet answered
        #: How the job waits for the socket: blocking its thread, or as a job of the event
        #: loop (masd.store.pg_loop.wait_socket).
        self._wait = wait or _poll
        self._savepoints = 0
        self._begin = begin
        self._committed = False

    def __enter__(self) -> Transaction:
        self._pg.enter_pipeline_mode()
        self.send(self._begin)
        if self._statements.epoch != _epoch:  # found stale somewhere: every one made anew
            self._deallocate()
            self._statements.epoch = _epoch
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
            key = (query, tuple(self._tx.types or ()))
            formats: Sequence[pq.Format] | None = self._tx.formats
        else:
            values, key, formats = None, (query, ()), None
        names = self._statements.names
        name = names.get(key)
        if name is not None:
            names.move_to_end(key)
        result = Result(self, name is not None)
        self._pg.send_query_prepared(name or self._prepare(key), values, param_formats=formats)
        self._queue.append(result)
        return result

    def _prepare(self, key: _Key) -> bytes:
        statements = self._statements
        while len(statements.names) >= MAX_PREPARED:
            _, old = statements.names.popitem(last=False)
            self.send("DEALLOCATE " + old.decode())  # after the runs of it already sent
        name = b"masd_%d" % next(statements.numbers)
        self._pg.send_prepare(name, key[0], param_types=key[1])
        self._queue.append(_Prepare(statements, key, name))
        statements.names[key] = name
        return name

    def _deallocate(self) -> None:
        self.send("DEALLOCATE ALL")
        self._statements.names.clear()

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

    def ended(self) -> None:
        """What was sent opened no transaction (a ping): leave without a ``ROLLBACK``."""
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
        error: Exception | None = None
        while self._syncs:
            res = self._next_result()
            status = res.status
            if status == _SYNC:
                self._syncs -= 1
                continue
            entry = self._queue.popleft()
            if status in _OK:
                if isinstance(entry, Result):
                    entry._res = res
                continue
            if isinstance(entry, _Prepare):
                entry.failed()
            if error is None:
                error = self._error(res, entry)
        if error is not None:
            if self._conn.broken and not isinstance(error, psycopg.OperationalError):
                raise psycopg.OperationalError(str(error)) from error
            raise error

    def _error(self, res: pq.abc.PGresult, entry: Result | _Prepare | None) -> Exception:
        global _epoch
        if res.status == _ABORTED:
            return psycopg.OperationalError("statement not run: the pipeline was aborted")
        error = error_from_result(res, encoding=self.encoding)
        if error.sqlstate in _STALE and isinstance(entry, Result) and entry.made_before:
            _epoch += 1  # every connection's statements are made anew (module docstring)
            stale = Raced(f"a prepared statement was stale: {error} ({error.sqlstate})")
            stale.__cause__ = error
            return stale
        return error

    def _next_result(self) -> pq.abc.PGresult:
        """The next result libpq has (not the null after each statement's), waiting for
        the socket as long as libpq needs more input."""
        pg = self._pg
        while True:
            while pg.is_busy():
                self._wait(pg.socket, select.POLLIN)
                pg.consume_input()
            res = pg.get_result()
            if res is not None:
                return res
            if pg.status == pq.ConnStatus.BAD:
                raise psycopg.OperationalError("the connection to the server was lost")

    def _flush(self) -> None:
        while self._pg.flush():
            self._wait(self._pg.socket, select.POLLIN | select.POLLOUT)
            self._pg.consume_input()  # the server may answer before it reads it all

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


def _poll(fd: int, events: int) -> None:
    poll = select.poll()
    poll.register(fd, events)
    poll.poll()


def ping(conn: psycopg.Connection[Any], wait: Wait | None = None) -> None:
    """One empty statement and its answer: raises if ``conn`` no longer reaches the server."""
    with Transaction(conn, "", wait) as pipe:
        pipe.ended()
