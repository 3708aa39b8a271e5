"""Where the target keeps its store during a conformance run: its own SQLite file, or PostgreSQL.

By default each flow's target has a fresh SQLite file in the flow's folder.  With
``masd conformance run --database URI`` (a ``postgresql://`` URI of a database the
runner may create databases from, e.g. the server's ``postgres``) each flow gets a
fresh database of its own on that server instead, created before the flow and
dropped after it: the same flows, played against masd on PostgreSQL, with
``server.claim_timeout`` :data:`CLAIM_TIMEOUT` (a flow that kills masd and starts it
again expects the rows it was sending to go out within seconds; the restarted
process is another host to the database, and takes them once their lease ends).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["FlowDatabases"]

_names = itertools.count(1)
#: ``server.claim_timeout`` of a target on PostgreSQL.
CLAIM_TIMEOUT = "2s"


@dataclass(frozen=True)
class FlowDatabases:
    """Each flow's store: SQLite (``server`` None) or a fresh database on ``server``."""

    server: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        return "sqlite" if self.server is None else "postgresql"

    def fresh(self) -> str | None:
        """A new, empty database's name on the server (None for SQLite)."""
        if self.server is None:
            return None
        from masd.store.pg_admin import create_database

        name = f"masd_flow_{os.getpid()}_{next(_names)}"
        create_database(self.server, name, self.password)
        return name

    def drop(self, name: str | None) -> None:
        if self.server is not None and name is not None:
            from masd.store.pg_admin import drop_database

            drop_database(self.server, name, self.password)

    def server_keys(self, name: str | None) -> Mapping[str, Any]:
        """The ``[server]`` keys that point the target at database ``name``."""
        if self.server is None or name is None:
            return {}
        parts = urlsplit(self.server)
        keys: dict[str, Any] = {
            "database": urlunsplit(parts._replace(path="/" + name)),
            # A flow that kills masd expects what it was sending to go out seconds after
            # the restart: the rows a killed host held are another's once its lease ends.
            "claim_timeout": CLAIM_TIMEOUT,
        }
        if self.password is not None:
            keys["database_password_file"] = "secrets/database.token"  # noqa: S105 - a path
        return keys

    def secrets(self) -> Mapping[str, str]:
        """Secrets to write beside the configuration (``secrets/<name>.token``)."""
        return {} if self.password is None else {"database": self.password}
