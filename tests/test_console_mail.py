"""The mail in the operator console, against the running HTTP edge on loopback: a mail's row
shows the sender's own words with the whole text a click away, links to each attachment and
to the raw message, which the console serves to its session only, from the read side's own
routes, as downloads that cannot run in the console's origin; the case's header counts its
thread, and the live feed carries what each new row adds to them."""

from __future__ import annotations

import asyncio
import email.policy
import hashlib
import html
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
from support.http import ADMIN, Running, serving

from masd import service
from masd.core.address import parse_address
from masd.core.event import build_event
from masd.core.times import rfc3339
from masd.core.trust import TrustSettings
from masd.edges.http.console import COOKIE, SECURITY_HEADERS
from masd.edges.http.console_mail import DOWNLOAD_CSP

#: A reply above the mail it answers, as a mail client writes it.
REPLY = "Tuesday at 10 works for me.\nPlease ring the bell twice."
QUOTED = (
    f"{REPLY}\n\nOn Mon, 30 Nov 2026 at 09:12, Help Desk <ticket@help.example> wrote:\n"
    "> When may our technician come by?\n> Kind regards\n"
)
HOSTILE_HTML = b"<html><body><script>document.title='ran'</script><p>Invoice</p></body></html>"
PDF = b"%PDF-1.4\n" + bytes(range(256)) * 8
BEARER = {"Authorization": f"Bearer {ADMIN}"}


def console_on(text: str) -> str:
    return text.replace("[server]\n", "[server]\nconsole = true\n", 1)


def run(tmp_path: Path, body: Callable[[Running], Awaitable[None]]) -> None:
    async def main() -> None:
        async with serving(tmp_path, adjust=console_on) as running:
            await body(running)

    asyncio.run(main())


def mail_with(rcpt: str, text: str, files: list[tuple[str, str, bytes]]) -> bytes:
    """A mail whose trusted A-R says DMARC pass, with ``text`` and ``files``
    (filename, content type, bytes) attached."""
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["Authentication-Results"] = "mx.help.example; dmarc=pass header.from=example.com"
    msg["From"] = "Alice <alice@example.com>"
    msg["To"] = rcpt
    msg["Subject"] = "Re: Your visit"
    msg["Message-ID"] = f"<{secrets.token_hex(8)}@example.com>"
    msg["Date"] = "Mon, 30 Nov 2026 10:01:00 +0000"
    msg.set_content(text)
    for name, kind, data in files:
        main, sub = kind.split("/")
        msg.add_attachment(data, maintype=main, subtype=sub, filename=name)
    return msg.as_bytes()


async def deliver_raw(r: Running, rcpt: str, raw: bytes) -> service.Delivered:
    """Record ``raw`` to ``rcpt`` through the real delivery path, in one store job."""
    config = r.rt.config
    trust = TrustSettings.of(config.server.trusted_authserv_ids, config.server.trusted_hosts)
    mail = build_event(
        raw,
        mail_from="alice@example.com",
        rcpt_to=rcpt,
        received_at=rfc3339(r.clock.now()) or "",
        message_ref=r.rt.new_id(),
        trust=trust,
    )
    address = parse_address(rcpt, domains=list(config.domains))
    sha = hashlib.sha256(raw).hexdigest()
    now = r.clock.now()
    return await r.store.write(lambda db: service.deliver(r.rt, db, address, mail, raw, sha, now))


async def signed_in(r: Running) -> None:
    answer = await r.client.post("/console/sign-in", data={"secret": ADMIN})
    assert answer.status_code == 303, answer.text
    assert COOKIE in r.client.cookies


async def mail_refs(r: Running, key: str) -> list[str]:
    thread = await r.client.get(f"/mas/v0.1/cases/{key}/thread", headers=BEARER)
    return [e["message_ref"] for e in thread.json()["entries"] if e["kind"] == "mail.in"]


async def event_of(r: Running, ref: str) -> dict[str, Any]:
    found = await r.client.get(f"/mas/v0.1/messages/{ref}", headers=BEARER)
    event: dict[str, Any] = found.json()["message"]["event"]
    return event


def own_words(event: dict[str, Any]) -> str:
    """What the console shows first: ``reply_text`` where the event has it, else ``text``."""
    return str(event.get("reply_text", event["text"]))


def download_guarded(answer: httpx.Response) -> None:
    """A mail's bytes: a download, never sniffed, under a sandbox that runs nothing."""
    assert answer.headers["content-disposition"].startswith("attachment")
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["content-security-policy"] == DOWNLOAD_CSP
    for name in ("X-Frame-Options", "Referrer-Policy", "Cache-Control"):
        assert answer.headers[name] == SECURITY_HEADERS[name], name


def test_a_mail_row_shows_the_senders_words_the_whole_text_and_its_files(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        rcpt = "ticket@help.example"
        files = [
            ("invoice.html", "text/html", HOSTILE_HTML),
            ("Plan Q3.pdf", "application/pdf", PDF),
        ]
        got = await deliver_raw(r, rcpt, mail_with(rcpt, QUOTED, files))
        key = got.case_key
        await deliver_raw(r, key, mail_with(key, "No quote in this one.", []))
        first, second = await mail_refs(r, key)
        quoted, plain = await event_of(r, first), await event_of(r, second)
        assert plain.get("reply_text", plain["text"]) == plain["text"]  # nothing to leave out
        await signed_in(r)
        page = (await r.client.get(f"/console/cases/{key}")).text
        entries = page.split('<li class="entry ')[1:]
        rows = [e for e in entries if e.startswith('kind-mail-in"')]
        assert len(rows) == 2
        # The sender's words first, the whole text behind a <details>.
        words = re.search(r'<p class="reply">(.*?)</p>', rows[0], re.S)
        assert words
        assert html.unescape(words[1]) == own_words(quoted)
        assert REPLY in html.unescape(words[1])
        whole = re.search(
            r'<details class="whole"><summary>[^<]+</summary>'
            r'<pre class="text">(.*?)</pre></details>',
            rows[0],
            re.S,
        )
        assert whole
        assert html.unescape(whole[1]) == quoted["text"]
        assert "When may our technician come by?" in html.unescape(whole[1])
        assert "The whole text (nothing was left out)" in rows[1]
        # A link to each attachment and to the raw message, under the console.
        links = re.findall(r'<a class="attachment" href="([^"]+)" download>([^<]+)</a>', rows[0])
        assert links == [
            (f"/console/messages/{first}/attachments/0", "invoice.html"),
            (f"/console/messages/{first}/attachments/1", "Plan Q3.pdf"),
        ]
        assert f"text/html, {len(HOSTILE_HTML)} bytes" in rows[0]
        assert f'href="/console/messages/{first}/raw" download>Raw message' in rows[0]
        assert "<script>document" not in page
        assert 'class="attachments"' not in rows[1]

    run(tmp_path, body)


def test_the_console_serves_a_mails_bytes_as_the_api_does_as_downloads(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        rcpt = "ticket@help.example"
        raw = mail_with(
            rcpt,
            QUOTED,
            [("invoice.html", "text/html", HOSTILE_HTML), ("Plan Q3.pdf", "application/pdf", PDF)],
        )
        got = await deliver_raw(r, rcpt, raw)
        (ref,) = await mail_refs(r, got.case_key)
        base = f"/console/messages/{ref}"
        paths = [f"{base}/raw", f"{base}/attachments/0", f"{base}/attachments/1"]
        # No session, no bytes: the browser is sent to sign in, the admin secret is no session.
        for path in paths:
            for headers in ({}, BEARER, {"Cookie": f"{COOKIE}=forged"}):
                refused = await r.client.get(path, headers=headers)
                assert (refused.status_code, refused.headers["location"]) == (
                    303,
                    "/console/sign-in",
                ), path
                assert refused.content == b""
                assert (
                    refused.headers["content-security-policy"]
                    == SECURITY_HEADERS["Content-Security-Policy"]
                )
        await signed_in(r)
        for path in paths:
            api = await r.client.get(path.replace("/console/", "/mas/v0.1/"), headers=BEARER)
            mine = await r.client.get(path)
            assert (mine.status_code, mine.content) == (200, api.content), path
            for name in ("content-type", "etag", "content-length"):
                assert mine.headers[name] == api.headers[name], (path, name)
            download_guarded(mine)
        raw_answer = await r.client.get(f"{base}/raw")
        assert raw_answer.content == raw
        assert raw_answer.headers["content-type"] == "message/rfc822"
        assert raw_answer.headers["content-disposition"] == f'attachment; filename="{ref}.eml"'
        hostile = await r.client.get(f"{base}/attachments/0")
        assert hostile.content == HOSTILE_HTML
        assert hostile.headers["content-type"].startswith("text/html")
        assert hostile.headers["content-disposition"] == 'attachment; filename="invoice.html"'
        assert "sandbox" in hostile.headers["content-security-policy"].split("; ")
        part = await r.client.get(f"{base}/attachments/1", headers={"Range": "bytes=9-18"})
        assert (part.status_code, part.content) == (206, PDF[9:19])
        download_guarded(part)
        head = await r.client.head(f"{base}/attachments/1")
        assert (head.status_code, head.headers["content-length"]) == (200, str(len(PDF)))
        # What is not there is a page of the console's, not a download.
        for path in (
            f"{base}/attachments/2",
            f"{base}/attachments/x",
            "/console/messages/nope/raw",
        ):
            missing = await r.client.get(path)
            assert missing.status_code == 404, path
            assert missing.headers["content-type"] == "text/html; charset=utf-8"
            assert "content-disposition" not in missing.headers
            assert (
                missing.headers["content-security-policy"]
                == SECURITY_HEADERS["Content-Security-Policy"]
            )
            assert "no message" in missing.text or "attachments" in missing.text

    run(tmp_path, body)


def counted(page: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r'<dd data-count="([a-z_]+)">(\d+)</dd>', page)}


def test_the_header_counts_the_thread_and_the_feed_says_what_each_row_adds(
    tmp_path: Path,
) -> None:
    async def body(r: Running) -> None:
        key, _ = await r.open_callback_case()
        await deliver_raw(r, key, mail_with(key, QUOTED, [("a.pdf", "application/pdf", PDF)]))
        await signed_in(r)
        page = (await r.client.get(f"/console/cases/{key}")).text
        case = (await r.client.get(f"/mas/v0.1/cases/{key}", headers=BEARER)).json()["case"]
        thread = (await r.client.get(f"/mas/v0.1/cases/{key}/thread", headers=BEARER)).json()
        kinds = [e["kind"] for e in thread["entries"]]
        shown = counted(page)
        assert shown == {
            "entries": case["entries"],
            "mails_in": kinds.count("mail.in"),
            "attachments": 1,
            "statuses": kinds.count("status"),
            "mails_sent": case["sent"],
        }
        assert shown["entries"] == len(kinds)
        assert shown["mails_in"] == 2
        # A later page still counts the whole thread.
        later = (await r.client.get(f"/console/cases/{key}?after=2")).text
        assert counted(later) == shown
        feed = re.search(r'data-feed="([^"]+)"', page)
        assert feed, page
        async with r.client.stream("GET", html.unescape(feed[1])) as stream:
            files = [("b.pdf", "application/pdf", PDF), ("c.pdf", "application/pdf", PDF[:9])]
            await deliver_raw(r, key, mail_with(key, "Two more files.", files))
            text = ""
            async for chunk in stream.aiter_text():
                text += chunk
                if "\n\n" in text:
                    break
        data = json.loads(text.split("data: ", 1)[1].split("\n", 1)[0])
        row = data["row"]
        assert row["kind"] == "mail.in"
        assert row["tally"] == {"entries": 1, "mails_in": 1, "attachments": 2}
        assert row["mail"]["reply"] == "Two more files.\n"
        assert [a["name"] for a in row["mail"]["attachments"]] == ["b.pdf", "c.pdf"]
        assert row["mail"]["attachments"][1]["about"] == "application/pdf, 9 bytes"
        assert row["mail"]["raw"].startswith("/console/messages/")
        # The page read afterwards counts what the script added.
        after = counted((await r.client.get(f"/console/cases/{key}")).text)
        expected = {n: shown[n] + row["tally"].get(n, 0) for n in shown}
        assert after == expected

    run(tmp_path, body)
