"""A PostgreSQL store's URI as errors and log lines show it: where it is, never a password.

:func:`shown_uri` keeps the user, every host with its port, and the database name, so an
operator reading ``cannot open store postgresql://masd@127.0.0.1:55432/masd`` knows which
server was tried; the password (in the URI's user part or its ``password`` parameter) and
every other parameter are left out.  A host that is a unix socket directory is shown as the
``host`` parameter, as libpq writes it.
"""

from __future__ import annotations

from typing import Final

import psycopg

#: Shown for a URI libpq cannot read (so nothing of it can be shown safely).
UNREADABLE: Final = "postgresql database"


def shown_uri(uri: str) -> str:
    """``uri`` without its password, with each host's port (see the module docstring)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(uri)
    except psycopg.ProgrammingError:
        return UNREADABLE
    user = str(info.get("user") or "")
    dbname = str(info.get("dbname") or "")
    hosts = str(info.get("host") or "").split(",")
    ports = str(info.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    at = f"{user}@" if user else ""
    if any(h.startswith("/") for h in hosts):
        query = f"?host={','.join(hosts)}" + (f"&port={info['port']}" if info.get("port") else "")
        return f"postgresql://{at}/{dbname}{query}"
    where = ",".join(_host_port(h, p) for h, p in zip(hosts, ports, strict=False))
    return f"postgresql://{at}{where}/{dbname}"


def _host_port(host: str, port: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{port}" if port else shown
