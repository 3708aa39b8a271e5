"""Writer process for tests/test_store_crash.py: writes until it is killed.

Usage: python tests/store_crash_child.py DB_PATH

Each job takes the next id number and inserts, all in one job, a case, its
first thread entry and its message.  After each job is committed the child
prints ``committed N`` (N the case's number) and flushes stdout.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys

from sqlite_utils import Database

from masd.store import Store, append_thread, dumps, next_number

DOMAIN = "crash.example"
WORKERS = 8


def job(db: Database) -> int:
    n = next_number(db, DOMAIN, "ticket")
    key = f"ticket=t-{n}@{DOMAIN}"
    raw = (f"Subject: case {n}\r\n\r\n" + "x" * 4000).encode()
    db.execute(
        "INSERT INTO cases (key, address, domain, type, id, role, participant, created_at)"
        " VALUES (?, ?, ?, 'ticket', ?, 'master', 'p@example.org', ?)",
        (key, key, DOMAIN, f"t-{n}", float(n)),
    )
    db.execute(
        "INSERT INTO messages (message_ref, case_key, rcpt_to, mail_from, sha256, size, raw,"
        " event, received_at) VALUES (?, ?, ?, 'p@example.org', ?, ?, ?, ?, ?)",
        (
            f"m-{n}",
            key,
            f"ticket@{DOMAIN}",
            hashlib.sha256(raw).hexdigest(),
            len(raw),
            raw,
            dumps({"message_ref": f"m-{n}"}),
            float(n),
        ),
    )
    append_thread(db, key, "mail.in", {"message_ref": f"m-{n}"}, at=float(n))
    return n


async def worker(store: Store) -> None:
    while True:
        n = await store.write(job)
        sys.stdout.write(f"committed {n}\n")
        sys.stdout.flush()


async def main(path: str) -> None:
    store = Store.open(path)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await asyncio.gather(*(worker(store) for _ in range(WORKERS)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
