"""DKIM signing and the SMTP sender (docs/protocol.md §5), verified the way a receiver would."""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import dkim
import pytest
from support.outbox import deliver, inbound, make_env

from masd.config import Dkim, TcpListen
from masd.core import compose
from masd.edges.context import EdgeContext
from masd.edges.outbox import Outbox
from masd.edges.smtp import SmtpResult, dkim_sign, send_mail
from masd.testing import SmtpSink

SELECTOR = "mas"
DOMAIN = "help.example"


@pytest.fixture(scope="module")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """(PEM private key, DNS TXT record) from openssl."""
    where = tmp_path_factory.mktemp("dkim")
    key = where / "dkim.key"
    subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
    der = subprocess.run(
        ["openssl", "rsa", "-in", str(key), "-pubout", "-outform", "DER"],
        check=True,
        capture_output=True,
    ).stdout
    txt = b"v=DKIM1; k=rsa; p=" + base64.b64encode(der)
    return key.read_bytes(), txt


def dns_for(txt: bytes) -> object:
    def lookup(name: bytes, timeout: float = 5) -> bytes | None:
        return txt if name.rstrip(b".") == f"{SELECTOR}._domainkey.{DOMAIN}".encode() else None

    return lookup


def tags(raw: bytes) -> dict[str, str]:
    header = re.search(rb"^DKIM-Signature:(.*?)\r\n(?![ \t])", raw, re.S | re.M)
    assert header is not None
    value = re.sub(rb"\s+", b"", header.group(1)).decode()
    return dict(part.split("=", 1) for part in value.split(";") if part)


def outbound(to: str = "alice@example.com", in_reply_to: str | None = "<m1@example.com>") -> bytes:
    return compose.render(
        compose.OutboundMail(
            sender="ticket=gs-1@help.example",
            to=to,
            subject="Re: Please call me",
            body="Your message has been received.\nGrüße\n",
            message_id="<r1@help.example>",
            in_reply_to=in_reply_to,
            references=[in_reply_to] if in_reply_to else [],
            auto_submitted=True,
            date=1_700_000_000.0,
        )
    )


def test_mail_from_the_outbox_is_signed_and_verifies(
    tmp_path: Path, keypair: tuple[bytes, bytes]
) -> None:
    pem, txt = keypair
    (tmp_path / "dkim.key").write_bytes(pem)
    (tmp_path / "dkim.key").chmod(0o600)

    async def main() -> None:
        env = await make_env(tmp_path, dkim=True)
        try:
            await deliver(env, "ticket@help.example", inbound("ticket@help.example")[0])
            outbox = Outbox(EdgeContext(env.rt, env.store, env.clock, env.metrics))
            outbox.start()
            [mail] = await env.sink.wait_for(1)
            await outbox.stop()
        finally:
            await env.close()
        assert dkim.verify(mail.raw, dnsfunc=dns_for(txt))
        t = tags(mail.raw)
        assert (t["d"], t["s"], t["c"], t["a"]) == (
            DOMAIN,
            SELECTOR,
            "relaxed/relaxed",
            "rsa-sha256",
        )
        signed = t["h"].lower().split(":")
        for name in (
            "from",
            "to",
            "subject",
            "date",
            "message-id",
            "in-reply-to",
            "references",
            "auto-submitted",
            "mime-version",
            "content-type",
        ):
            assert name in signed
        # A changed signed header breaks the signature.
        forged = mail.raw.replace(b"Subject: Re:", b"Subject: Fw:", 1)
        assert forged != mail.raw
        assert not dkim.verify(forged, dnsfunc=dns_for(txt))

    asyncio.run(main())


def test_only_headers_present_are_signed(keypair: tuple[bytes, bytes]) -> None:
    pem, txt = keypair
    key = Dkim(selector=SELECTOR, key_file=Path("dkim.key"), key=pem)
    signed = dkim_sign(outbound(in_reply_to=None), key, DOMAIN)
    h = tags(signed)["h"].lower().split(":")
    assert "in-reply-to" not in h
    assert "references" not in h
    assert "from" in h
    assert dkim.verify(signed, dnsfunc=dns_for(txt))


def test_send_mail_signs_and_speaks_smtputf8(keypair: tuple[bytes, bytes]) -> None:
    pem, txt = keypair
    key = Dkim(selector=SELECTOR, key_file=Path("dkim.key"), key=pem)

    async def main() -> None:
        async with SmtpSink() as sink:
            result = await send_mail(
                sink.relay,
                "ticket=gs-1@help.example",
                "jörg@exämple.com",
                outbound(to="jörg@exämple.com"),
                dkim=key,
                domain=DOMAIN,
                hostname="masd.help.example",
                timeout=10,
            )
            assert result.ok, result
            assert result.code == 250
            [mail] = sink.messages
            assert mail.rcpt_tos == ("jörg@exämple.com",)
            assert "SMTPUTF8" in [o.upper() for o in mail.mail_options]
            assert dkim.verify(mail.raw, dnsfunc=dns_for(txt))

    asyncio.run(main())


async def send_to(relay: TcpListen, key: Dkim | None = None) -> SmtpResult:
    return await send_mail(
        relay,
        "ticket=gs-1@help.example",
        "alice@example.com",
        outbound(),
        dkim=key,
        domain=DOMAIN,
        hostname="masd.help.example",
        timeout=10,
    )


@pytest.mark.parametrize(
    ("reply", "at", "outcome"),
    [
        ("550 5.1.1 no such user", "RCPT", "permanent"),
        ("452 4.2.2 mailbox full", "RCPT", "temporary"),
        ("554 5.7.1 spam", "DATA", "permanent"),
        ("421 4.3.2 shutting down", "DATA", "temporary"),
    ],
)
def test_relay_replies_map_to_outcomes(reply: str, at: str, outcome: str) -> None:
    async def main() -> None:
        async with SmtpSink() as sink:
            sink.refuse(reply, at="RCPT" if at == "RCPT" else "DATA")
            result = await send_to(sink.relay)
            assert result.outcome == outcome
            assert result.code == int(reply[:3])
            assert result.describe() == f"SMTP {reply}"
            assert sink.messages == []

    asyncio.run(main())


def test_relay_down_is_temporary() -> None:
    async def main() -> None:
        sink = await SmtpSink().start()
        relay = sink.relay
        await sink.close()  # nothing listens there now
        result = await send_to(relay)
        assert result.outcome == "temporary"
        assert result.code is None
        assert "refused" in result.text.lower()

    asyncio.run(main())


def test_a_broken_key_keeps_the_mail_for_later(keypair: tuple[bytes, bytes]) -> None:
    pem, _ = keypair
    broken = Dkim(selector=SELECTOR, key_file=Path("dkim.key"), key=pem[:200])

    async def main() -> None:
        async with SmtpSink() as sink:
            result = await send_to(sink.relay, broken)
            assert result.outcome == "temporary"
            assert "DKIM signing for help.example" in result.text
            assert sink.messages == []  # never sent unsigned
            good = replace(broken, key=pem)
            assert (await send_to(sink.relay, good)).ok

    asyncio.run(main())
