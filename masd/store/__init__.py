"""masd's durable state: SQLite in WAL mode, one writer thread with group commit.

Timestamps in every table are REAL epoch seconds (UTC); JSON columns are TEXT.
See :mod:`masd.store.schema` for the tables and :mod:`masd.store.db` for the
write/read model.
"""

from masd.core.kinds import THREAD_KINDS
from masd.store.db import MAX_BATCH, Store, StoreError, StoreStats, backup, migrate
from masd.store.schema import MIGRATIONS, Migration, append_thread, dumps, next_number

__all__ = [
    "MAX_BATCH",
    "MIGRATIONS",
    "THREAD_KINDS",
    "Migration",
    "Store",
    "StoreError",
    "StoreStats",
    "append_thread",
    "backup",
    "dumps",
    "migrate",
    "next_number",
]
