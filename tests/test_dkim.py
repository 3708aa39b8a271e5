"""DKIM signing (docs/protocol.md §5): RSA and Ed25519, one key or two, checked as a receiver would.

Every signature is checked with dkimpy's verifier; for the same key, message
and time, masd's signature must equal dkimpy's own byte for byte.
"""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import dkim
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st
from support.keys import pem
from support.outbox import deliver, inbound, make_env

from masd.config import Dkim
from masd.core import compose
from masd.edges import dkim as masd_dkim
from masd.edges.context import EdgeContext
from masd.edges.dkim import DkimSignError, Signer, load_signer, sign
from masd.edges.mailer import OutboundMail
from masd.edges.outbox import Outbox
from masd.edges.smtp import SmtpTransport
from masd.testing import SmtpSink

DOMAIN = "help.example"
NOW = 1_700_000_000


def txt(key: rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey) -> bytes:
    """The DNS TXT record a receiver would find for ``key``."""
    if isinstance(key, rsa.RSAPrivateKey):
        der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return b"v=DKIM1; k=rsa; p=" + base64.b64encode(der)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b"v=DKIM1; k=ed25519; p=" + base64.b64encode(raw)


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ed_key() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def keys(
    rsa_key: rsa.RSAPrivateKey, ed_key: ed25519.Ed25519PrivateKey
) -> dict[str, tuple[Dkim, Any]]:
    """selector -> (the configured key, the key object)."""
    return {
        "rsa": (Dkim("rsa", Path("rsa.key"), pem(rsa_key)), rsa_key),
        "ed": (Dkim("ed", Path("ed.key"), pem(ed_key)), ed_key),
    }


def dns(keys: dict[str, tuple[Dkim, Any]]) -> Any:
    records = {f"{s}._domainkey.{DOMAIN}".encode(): txt(k) for s, (_, k) in keys.items()}

    def lookup(name: bytes, timeout: float = 5) -> bytes | None:
        return records.get(name.rstrip(b"."))

    return lookup


def signatures(raw: bytes) -> list[dict[str, str]]:
    """The tags of each DKIM-Signature header, top first."""
    found = re.findall(rb"^DKIM-Signature:(.*?)\r\n(?![ \t])", raw, re.S | re.M)
    out = []
    for header in found:
        value = re.sub(rb"\s+", b"", header).decode()
        out.append(dict(part.split("=", 1) for part in value.split(";") if part))
    return out


def verified(raw: bytes, keys: dict[str, tuple[Dkim, Any]]) -> list[bool]:
    """dkimpy's verdict on each signature of ``raw``, top first."""
    d = dkim.DKIM(raw)
    return [d.verify(idx=i, dnsfunc=dns(keys)) for i in range(len(signatures(raw)))]


def outbound(in_reply_to: str | None = "<m1@example.com>", body: str | None = None) -> bytes:
    return compose.render(
        compose.OutboundMail(
            sender="ticket=gs-1@help.example",
            to="alice@example.com",
            subject="Re: Please call me",
            body=body or "Your message has been received.\nGrüße\n",
            message_id="<r1@help.example>",
            in_reply_to=in_reply_to,
            references=[in_reply_to] if in_reply_to else [],
            auto_submitted=True,
            date=1_700_000_000.0,
        )
    )


@pytest.fixture
def frozen_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """dkimpy reads time.time() for t=; give it the time masd signs with."""
    monkeypatch.setattr(time, "time", lambda: float(NOW))


def dkimpy_signature(message: bytes, key: Dkim, obj: Any) -> bytes:
    headers, _ = masd_dkim._parse(message)
    present = {name.lower() for name, _ in headers}
    include = [
        h.lower().encode() for h in masd_dkim.SIGNED_HEADERS if h.lower().encode() in present
    ]
    if isinstance(obj, rsa.RSAPrivateKey):
        return bytes(
            dkim.sign(
                message,
                key.selector.encode(),
                DOMAIN.encode(),
                key.key,
                canonicalize=(b"relaxed", b"relaxed"),
                include_headers=include,
            )
        )
    seed = obj.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return bytes(
        dkim.sign(
            message,
            key.selector.encode(),
            DOMAIN.encode(),
            base64.b64encode(seed),
            canonicalize=(b"relaxed", b"relaxed"),
            include_headers=include,
            signature_algorithm=b"ed25519-sha256",
        )
    )


ODD_MESSAGES = {
    "composed": outbound(),
    "no reply headers": outbound(in_reply_to=None),
    "folded and spaced headers": (
        b"From:  Alice \t <alice@example.com>  \r\nSubject: a\r\n \tfolded   subject \r\n"
        b"To: x@example.org\r\nSubject: the last Subject is the one signed\r\n"
        b"X-Not-Signed: y\r\nmessage-id:<lower@example.com>\r\n\r\nbody\r\n"
    ),
    "8-bit body, trailing blank lines and spaces": (
        b"From: a@example.com\r\nContent-Type: text/plain; charset=latin-1\r\n\r\n"
        b"Gr\xfc\xdfe  \t \r\n\t tab first\r\n\xff\xfe\x80 raw bytes\r\n\r\n\r\n"
    ),
    "empty body": b"From: a@example.com\r\nSubject: nothing\r\n\r\n",
    "headers only": b"From: a@example.com\r\nSubject: no blank line\r\n",
    "bare LF line ends": b"From: a@example.com\nTo: b@example.org\n\nline one\nline two\n\n",
    "no final line end": b"From: a@example.com\r\n\r\nends without CRLF",
    "8-bit header": "From: Jörg <j@example.com>\r\nSubject: Grüße\r\n\r\nx\r\n".encode(),
}


@pytest.mark.parametrize("selector", ["rsa", "ed"])
@pytest.mark.parametrize("name", list(ODD_MESSAGES))
def test_signature_equals_dkimpys_and_verifies(
    keys: dict[str, tuple[Dkim, Any]], selector: str, name: str, frozen_time: None
) -> None:
    message = ODD_MESSAGES[name]
    key, obj = keys[selector]
    signed = sign(message, [load_signer(key, DOMAIN)], NOW)
    assert signed == dkimpy_signature(message, key, obj) + message
    assert verified(signed, keys) == [True]
    t = signatures(signed)[0]
    assert (t["d"], t["s"], t["c"], t["t"]) == (DOMAIN, selector, "relaxed/relaxed", str(NOW))
    assert t["a"] == {"rsa": "rsa-sha256", "ed": "ed25519-sha256"}[selector]


_field_name = st.sampled_from(["From", "To", "Subject", "Date", "Message-ID", "X-Other", "subject"])
_value = st.lists(st.sampled_from([*"ab \t,;:<>@.", "\r\n ", "\r\n\t", "é"])).map("".join)
_body = st.binary(max_size=200).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"\r\n"))


@settings(max_examples=60, deadline=None)
@given(
    fields=st.lists(st.tuples(_field_name, _value), max_size=6),
    body=_body,
)
def test_any_header_and_body_sign_as_dkimpy_signs(
    keys: dict[str, tuple[Dkim, Any]], fields: list[tuple[str, str]], body: bytes
) -> None:
    head = "".join(f"{n}:{v}\r\n" for n, v in [("From", "a@example.com"), *fields])
    message = head.encode() + b"\r\n" + body
    key, obj = keys["ed"]
    real_time = time.time
    time.time = lambda: float(NOW)  # type: ignore[assignment]
    try:
        expected = dkimpy_signature(message, key, obj)
    finally:
        time.time = real_time  # type: ignore[assignment]
    assert sign(message, [load_signer(key, DOMAIN)], NOW) == expected + message


def test_dual_signed_mail_carries_both_and_each_verifies(
    keys: dict[str, tuple[Dkim, Any]],
) -> None:
    signers = [load_signer(keys["rsa"][0], DOMAIN), load_signer(keys["ed"][0], DOMAIN)]
    signed = sign(outbound(), signers, NOW)
    tags = signatures(signed)
    assert [(t["s"], t["a"]) for t in tags] == [("rsa", "rsa-sha256"), ("ed", "ed25519-sha256")]
    assert verified(signed, keys) == [True, True]
    # A changed signed header breaks both.
    forged = signed.replace(b"Subject: Re:", b"Subject: Fw:", 1)
    assert forged != signed
    assert verified(forged, keys) == [False, False]


def test_only_headers_present_are_signed(keys: dict[str, tuple[Dkim, Any]]) -> None:
    signed = sign(outbound(in_reply_to=None), [load_signer(keys["rsa"][0], DOMAIN)], NOW)
    h = signatures(signed)[0]["h"].split(":")
    assert "in-reply-to" not in h
    assert "references" not in h
    assert h[0] == "from"
    assert verified(signed, keys) == [True]


def test_the_fold_never_leaves_a_line_of_only_space() -> None:
    # 71 characters and the CRLF: dkimpy would end the header with "\r\n \r\n".
    value = b"b=" + b"A" * 140 + b"\r\n"
    folded = masd_dkim._fold(value, len(b"DKIM-Signature"))
    assert folded.endswith(b"A\r\n")
    assert b"\r\n \r\n" not in folded
    assert folded.replace(b"\r\n ", b"") == value


def test_unusable_keys_are_named_refusals(keys: dict[str, tuple[Dkim, Any]]) -> None:
    good = keys["rsa"][0]
    cases = {
        "truncated": (good.key[:200], "is not a usable key"),
        "short RSA": (
            subprocess.run(["openssl", "genrsa", "512"], check=True, capture_output=True).stdout,
            "512 bits",
        ),
        "EC": (pem(ec.generate_private_key(ec.SECP256R1())), "DKIM signs with RSA or Ed25519"),
    }
    for data, why in cases.values():
        with pytest.raises(DkimSignError) as caught:
            load_signer(Dkim("rsa", Path("/etc/masd/rsa.key"), data), DOMAIN)
        assert caught.value.detail.startswith("DKIM signing for help.example (selector rsa)")
        assert why in caught.value.detail
    with pytest.raises(DkimSignError, match="no From header"):
        sign(b"Subject: x\r\n\r\nbody\r\n", [load_signer(good, DOMAIN)], NOW)


def test_a_broken_key_keeps_the_mail_for_later(keys: dict[str, tuple[Dkim, Any]]) -> None:
    good, _ = keys["rsa"]
    broken = Dkim("rsa", Path("rsa.key"), good.key[:200])
    mail = OutboundMail("ticket=gs-1@help.example", "alice@example.com", outbound(), DOMAIN)

    async def main() -> None:
        async with SmtpSink() as sink:
            bad = SmtpTransport(sink.relay, hostname="masd.test", keys={DOMAIN: [broken]})
            result = await bad.send(mail)
            assert result.outcome == "temporary"
            assert "DKIM signing for help.example (selector rsa)" in result.text
            assert sink.messages == []  # never sent unsigned
            await bad.close()
            fixed = SmtpTransport(sink.relay, hostname="masd.test", keys={DOMAIN: [good]})
            assert (await fixed.send(mail)).ok
            await fixed.close()
            [arrived] = sink.messages
            assert verified(arrived.raw, keys) == [True]

    asyncio.run(main())


def test_signing_runs_off_the_event_loops_thread(
    keys: dict[str, tuple[Dkim, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []
    real = masd_dkim.sign

    def watched(message: bytes, signers: list[Signer], now: float) -> bytes:
        threads.append(threading.current_thread())
        return real(message, signers, now)

    monkeypatch.setattr("masd.edges.smtp.sign", watched)
    dual = [keys["rsa"][0], keys["ed"][0]]
    mail = OutboundMail("ticket=gs-1@help.example", "alice@example.com", outbound(), DOMAIN)

    async def main() -> None:
        async with SmtpSink() as sink:
            transport = SmtpTransport(sink.relay, hostname="masd.test", keys={DOMAIN: dual})
            results = await asyncio.gather(*(transport.send(mail) for _ in range(6)))
            await transport.close()
            assert all(r.ok for r in results), results
            assert all(verified(m.raw, keys) == [True, True] for m in sink.messages)

    asyncio.run(main())
    assert len(threads) == 6
    assert threading.main_thread() not in threads


def test_mail_from_the_outbox_is_signed_and_verifies(
    tmp_path: Path, keys: dict[str, tuple[Dkim, Any]]
) -> None:
    key, _ = keys["rsa"]
    (tmp_path / "dkim.key").write_bytes(key.key)
    (tmp_path / "dkim.key").chmod(0o600)
    as_configured = {"mas": (Dkim("mas", Path("dkim.key"), key.key), keys["rsa"][1])}

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
        assert verified(mail.raw, as_configured) == [True]
        t = signatures(mail.raw)[0]
        assert (t["d"], t["s"], t["c"], t["a"]) == (
            DOMAIN,
            "mas",
            "relaxed/relaxed",
            "rsa-sha256",
        )
        for name in ("from", "to", "subject", "date", "message-id", "in-reply-to"):
            assert name in t["h"].split(":")

    asyncio.run(main())
