"""How the loopback proxy counts round trips (masd.testing.tcp_proxy), message by message.

The round-trip test and the scale benchmark read these counts: a trip is a wait of the
client's on the server, however the client's messages fall into packets.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

from masd.testing.proxy_process import ProxyProcess
from masd.testing.tcp_proxy import TcpProxy, _Conversation


def msg(kind: bytes, body: bytes = b"") -> bytes:
    return kind + (4 + len(body)).to_bytes(4, "big") + body


PARAMETERS = b"user\0masd\0\0"
STARTUP = (8 + len(PARAMETERS)).to_bytes(4, "big") + (196608).to_bytes(4, "big") + PARAMETERS
BATCH = msg(b"P", b"x" * 40) + msg(b"B", b"y" * 20) + msg(b"D", b"S\0") + msg(b"E", b"\0" * 5)
ROWS = msg(b"1") + msg(b"2") + msg(b"C", b"INSERT 0 1\0")


def ready() -> tuple[_Conversation, int]:
    """A conversation past its start-up: the client's start-up, a password, then ready."""
    talk = _Conversation()
    trips = talk.client(STARTUP)
    trips += talk.server(msg(b"R", (5).to_bytes(4, "big")))
    trips += talk.client(msg(b"p", b"secret\0"))
    trips += talk.server(msg(b"R", (0).to_bytes(4, "big")) + msg(b"Z", b"I"))
    return talk, trips


def test_start_up_and_authentication_are_counted_by_turns() -> None:
    talk, trips = ready()
    assert trips == 2
    assert talk.parsed


def test_a_batch_the_client_then_waits_on_is_one_trip_however_it_is_split() -> None:
    whole = BATCH * 3 + msg(b"H")
    for cut in (0, 7, len(BATCH), len(BATCH) * 2 + 3, len(whole) - 2):
        talk, _ = ready()
        trips = sum(talk.client(part) for part in (whole[:cut], whole[cut:]) if part)
        trips += talk.server(ROWS * 3)
        trips += talk.client(BATCH + msg(b"S"))
        assert trips == 2, cut
        assert talk.parsed


def test_statements_sent_while_a_sync_is_outstanding_ride_along() -> None:
    talk, _ = ready()
    trips = talk.client(BATCH + msg(b"S"))
    trips += talk.server(ROWS)  # partial: the Sync's ReadyForQuery has not come
    trips += talk.client(BATCH + msg(b"S"))
    trips += talk.server(msg(b"Z", b"T") + ROWS + msg(b"Z", b"I"))
    trips += talk.client(msg(b"Q", b"COMMIT\0"))
    assert trips == 2


def test_a_flush_after_the_answer_to_a_sync_asks_for_nothing() -> None:
    """psycopg may send a bare Flush once a pipeline's Sync is answered: no trip, and the
    next batch's wait is one."""
    talk, _ = ready()
    trips = talk.client(BATCH + msg(b"S"))
    trips += talk.server(ROWS + msg(b"Z", b"I"))
    assert talk.client(msg(b"H")) == 0
    trips += talk.client(BATCH) + talk.client(BATCH + msg(b"H"))
    trips += talk.server(ROWS * 2)
    assert trips == 2


def test_each_wait_after_an_answer_is_a_trip() -> None:
    talk, _ = ready()
    trips = 0
    for _ in range(4):
        trips += talk.client(BATCH + msg(b"H"))
        trips += talk.server(ROWS)
    assert trips == 4


def test_a_conversation_that_is_not_the_protocol_is_counted_by_turns() -> None:
    talk = _Conversation()
    trips = talk.client(b"GET / HTTP/1.1\r\n\r\n")
    trips += talk.client(b"more")
    trips += talk.server(b"HTTP/1.1 200 OK\r\n\r\n")
    trips += talk.client(b"GET /again HTTP/1.1\r\n\r\n")
    assert trips == 2


def test_the_proxy_in_a_process_of_its_own_forwards_holds_and_counts() -> None:
    """ProxyProcess: the same proxy behind a pipe to a child process."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        echo = threading.Thread(target=_echo, args=(listener,), daemon=True)
        echo.start()
        with ProxyProcess(listener.getsockname(), delay=0.05) as proxy:
            child = proxy._proc
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
                for n in range(3):
                    sent = time.monotonic()
                    client.sendall(b"ping %d" % n)
                    assert client.recv(100) == b"ping %d" % n
                    assert time.monotonic() - sent >= 0.1  # held 50 ms each way
            assert proxy.round_trips == 3  # not PostgreSQL's protocol: counted by turns
        assert child is not None
        assert child.returncode == 0  # its input closed: it stopped by itself
        echo.join(10)


def _echo(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    with conn:
        while data := conn.recv(100):
            conn.sendall(data)


@contextlib.contextmanager
def _echoed(delay: float) -> Iterator[socket.socket]:
    """A client connected to an echo server through a :class:`TcpProxy` holding ``delay``;
    the echo has ended by itself when the block ends."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        echo = threading.Thread(target=_echo, args=(listener,), daemon=True)
        echo.start()
        with (
            TcpProxy(listener.getsockname(), delay=delay) as proxy,
            socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client,
        ):
            yield client
        echo.join(10)
        assert not echo.is_alive()


def test_a_stream_larger_than_the_buffers_comes_through_held_in_order_and_its_end_too() -> None:
    """Eight megabytes each way through the held proxy (the reader slower than the sender:
    the proxy's buffers fill and it stops reading), byte for byte; the client's close
    reaches the server once what was held is written."""
    payload = bytes(range(256)) * 32768  # 8 MiB, every offset's byte known
    with _echoed(0.001) as client:
        sender = threading.Thread(target=client.sendall, args=(payload,), daemon=True)
        sender.start()
        got = bytearray()
        while len(got) < len(payload):
            time.sleep(0.001 if len(got) < 1 << 20 else 0)  # slow at first
            got += client.recv(1 << 16)
        sender.join(10)
        assert bytes(got) == payload
        client.shutdown(socket.SHUT_WR)
        assert client.recv(100) == b""  # the echo saw the end and closed: so did we


def test_an_answer_held_when_the_client_stops_sending_still_reaches_it() -> None:
    """The client writes, then shuts its sending side at once: its end of input reaches the
    server after what was held, and the server's answer, held in turn, is still delivered."""
    with _echoed(0.05) as client:
        client.sendall(b"ping")
        client.shutdown(socket.SHUT_WR)
        got = b""
        while data := client.recv(100):
            got += data
        assert got == b"ping"
