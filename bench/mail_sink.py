"""masd's relay in the benchmark: Postfix's ``smtp-sink`` with every arrival timed.

    python -m bench.mail_sink PORT ARRIVALS

Runs ``smtp-sink -D FIFO`` on 127.0.0.1:PORT: smtp-sink appends each message
it accepts to its dump file (one write, just before its ``250``), and the
dump file is a named pipe this process reads.  For each message it writes
one line to ARRIVALS as it comes: ``epoch-seconds TAB Message-ID TAB
In-Reply-To``.  Reading the pipe costs this process little, and smtp-sink,
in C, about 0.05 ms per message, so masd's relay is not what limits masd.
SIGTERM stops smtp-sink, reads what is left and exits.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_RECORD = re.compile(rb"^X-Client-Addr: ", re.MULTILINE)
_MESSAGE_ID = re.compile(rb"^Message-ID:[ \t]*(\S+)", re.MULTILINE | re.IGNORECASE)
_IN_REPLY_TO = re.compile(rb"^In-Reply-To:[ \t]*(\S+)", re.MULTILINE | re.IGNORECASE)


def smtp_sink() -> str:
    path = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
    if not os.path.exists(path):
        raise SystemExit("smtp-sink is missing (Debian package postfix)")
    return path


def _lines(data: bytes, at: float) -> bytes:
    """One line per message that starts in ``data`` (smtp-sink writes a message at once)."""
    out = []
    starts = [m.start() for m in _RECORD.finditer(data)]
    for begin, end in zip(starts, [*starts[1:], len(data)], strict=True):
        head = data[begin:end].split(b"\n\n", 1)[0]
        mid, irt = _MESSAGE_ID.search(head), _IN_REPLY_TO.search(head)
        out.append(
            b"%.6f\t%s\t%s\n" % (at, mid.group(1) if mid else b"-", irt.group(1) if irt else b"-")
        )
    return b"".join(out)


def main() -> None:
    port, arrivals = int(sys.argv[1]), Path(sys.argv[2])
    where = Path(tempfile.mkdtemp(prefix="masd-mail-sink-"))
    where.chmod(0o777)  # smtp-sink (as nobody) makes a file per message beside the pipe
    fifo = where / "dump"
    os.mkfifo(fifo)
    fifo.chmod(0o666)
    # Opened for reading and writing: the pipe never reports end-of-file between
    # two messages, so smtp-sink never finds it without a reader.
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    argv = [smtp_sink(), "-D", str(fifo)]
    if os.geteuid() == 0:
        argv += ["-u", "nobody"]
    sink = subprocess.Popen([*argv, f"127.0.0.1:{port}", "1024"])
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        sink.terminate()

    signal.signal(signal.SIGTERM, stop)
    out = arrivals.open("ab", buffering=0)
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                at = time.time()
                with contextlib.suppress(BlockingIOError):
                    out.write(_lines(os.read(fd, 1 << 20), at))
            elif stopping and sink.poll() is not None:
                break
    finally:
        out.close()
        os.close(fd)
        sink.wait(10)
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
