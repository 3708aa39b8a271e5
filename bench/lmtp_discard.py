"""The Python limit: a bare aiosmtpd LMTP server that accepts every message and discards it.

Served the way masd serves LMTP (``loop.create_server`` with aiosmtpd's
``LMTP`` protocol, a fixed hostname so no DNS lookup per connection), with
nothing behind it: one ``250`` per recipient, no parsing, no storage.

    python -m bench.lmtp_discard PORT
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiosmtpd.lmtp import LMTP
from aiosmtpd.smtp import SMTP, Envelope, Session


class Discard:
    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        return "\r\n".join("250 2.0.0 discarded" for _ in envelope.rcpt_tos)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    handler = Discard()
    server = await loop.create_server(
        lambda: LMTP(handler, hostname="discard.bench", ident="discard", loop=loop),
        "127.0.0.1",
        port,
    )
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    await server.wait_closed()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
