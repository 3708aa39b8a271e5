"""``masd serve`` with proposed changes applied at start, to measure them before they land.

    python -m bench.masd_variant CHANGES -- serve --config FILE

CHANGES is a comma list (``bench.run --masd-variant`` passes it on):

- ``switchinterval=S``: ``sys.setswitchinterval(S)``; the event loop gets the
  GIL back sooner after each socket call while the store's writer thread runs
  Python code (the default is 0.005 s);
- ``quiet-mail-log``: aiosmtpd's ``mail.log`` logger at WARNING (at INFO it
  writes about eight lines per LMTP transaction);

- ``log-level=LEVEL``: ``masd serve --log-level LEVEL`` (what the lines
  masd writes per delivery and per status cost);
- ``temp-store=FILE``: every store connection gets ``PRAGMA temp_store`` of
  that value (masd sets MEMORY);
- ``checkpoint-seconds=S``: the store's checkpointer runs every S seconds
  (masd's default is in ``masd.store.db.CHECKPOINT_SECONDS``): smaller
  checkpoints, each with a shorter sync of the database file;
- ``wal-limit-mb=MB``: the WAL size past which the writer runs a ``RESTART``
  checkpoint between two batches (masd's is ``masd.store.db.WAL_LIMIT_BYTES``);
- ``smtp-connections=N``: the SMTP sessions masd keeps with its relay
  (``masd.edges.smtp.DEFAULT_CONNECTIONS``);
- ``sqlite-cache=MB``: every store connection gets ``PRAGMA cache_size`` of MB
  mebibytes and ``PRAGMA mmap_size`` of four times that (SQLite's default
  cache is 2 MB, so a large store is read back through ``pread`` calls).

This is a measuring device only: masd's own code is unchanged, and the
benchmark report names the variant it ran.
"""

from __future__ import annotations

import logging
import sys
from typing import Any


def _quiet_mail_log() -> None:
    import masd.logs

    configure = masd.logs.configure_logging

    def quiet(level: str = "INFO") -> None:
        configure(level)
        logging.getLogger("mail.log").setLevel(logging.WARNING)

    masd.logs.configure_logging = quiet


def _wrap_connect(wrap: Any) -> None:
    """Every store connection (the writer's, the checkpointer's, the readers') through
    ``wrap(connect)``."""
    from masd.store import checkpointer, readers

    for module in (checkpointer, readers):
        module._connect = wrap(module._connect)  # type: ignore[attr-defined]


def _sqlite_cache(megabytes: int) -> None:
    def wrap(connect: Any) -> Any:
        def bigger(path: Any, **kwargs: Any) -> Any:
            conn = connect(path, **kwargs)
            conn.execute(f"PRAGMA cache_size=-{megabytes * 1024}")
            conn.execute(f"PRAGMA mmap_size={megabytes * 4 * 1024 * 1024}")
            return conn

        return bigger

    _wrap_connect(wrap)


_EXTRA_ARGS: list[str] = []


def _temp_store(value: str) -> None:
    def wrap(connect: Any) -> Any:
        def other(path: Any, **kwargs: Any) -> Any:
            conn = connect(path, **kwargs)
            conn.execute(f"PRAGMA temp_store={value}")
            return conn

        return other

    _wrap_connect(wrap)


def _store_setting(name: str, value: float) -> None:
    """Every Store masd opens gets ``name=value`` (an argument of ``Store.__init__``)."""
    from masd.store import db

    init = db.Store.__init__

    def other(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs[name] = value
        init(self, *args, **kwargs)

    db.Store.__init__ = other  # type: ignore[method-assign]


def _smtp_connections(n: int) -> None:
    from masd.edges import smtp

    init = smtp.SmtpTransport.__init__

    def more(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["connections"] = n
        init(self, *args, **kwargs)

    smtp.SmtpTransport.__init__ = more  # type: ignore[method-assign]


def apply(changes: str) -> None:
    for change in filter(None, (c.strip() for c in changes.split(","))):
        name, _, value = change.partition("=")
        if name == "switchinterval":
            sys.setswitchinterval(float(value))
        elif name == "quiet-mail-log":
            _quiet_mail_log()
        elif name == "log-level":
            _EXTRA_ARGS.extend(["--log-level", value])
        elif name == "temp-store":
            _temp_store(value)
        elif name == "checkpoint-seconds":
            _store_setting("checkpoint_seconds", float(value))
        elif name == "smtp-connections":
            _smtp_connections(int(value))
        elif name == "wal-limit-mb":
            _store_setting("wal_limit_bytes", int(float(value) * 1024 * 1024))
        elif name == "sqlite-cache":
            _sqlite_cache(int(value))
        else:
            raise SystemExit(f"bench.masd_variant: unknown change {change!r}")


def main() -> None:
    args = sys.argv[1:]
    if len(args) < 2 or args[1] != "--":
        raise SystemExit("usage: python -m bench.masd_variant CHANGES -- serve --config FILE")
    apply(args[0])
    from masd.cli import main as masd_main

    sys.argv = ["masd", *args[2:], *_EXTRA_ARGS]
    masd_main()


if __name__ == "__main__":
    main()
