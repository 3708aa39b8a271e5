"""Every attachment the event lists for a real mail is served with the bytes it lists
(docs/protocol.md §16.8): each message of the mail corpus (tests/test_mail_corpus.py's
sources) is recorded in a real store and each of its attachments fetched over a real
socket from ``GET /mas/v0.1/messages/{ref}/attachments/{n}``, its bytes hashed and held
against the event's ``size`` and ``sha256`` (uuencoded bodies included, decoded a piece at a
time as the others are, and files inside TNEF parts, decoded whole)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from collections import Counter
from pathlib import Path

import pytest
from support.http import ADMIN, Running, serving
from support.mailcorpus import MANIFEST, generated, shipped
from test_mime_cases import HEAD, tnef

from masd import service
from masd.core.address import parse_address
from masd.core.event import build_event
from masd.core.partspans import attachment_spans
from masd.core.times import rfc3339
from masd.core.trust import TrustSettings

SOURCES = [*MANIFEST["shipped"], *MANIFEST["generated"]]
RCPT = "ticket@help.example"


async def record(run: Running, raw: bytes) -> dict[str, object]:
    """Record ``raw`` through the delivery path; its message_ref and event."""
    config = run.config
    trust = TrustSettings.of(config.server.trusted_authserv_ids, config.server.trusted_hosts)
    mail = build_event(
        raw,
        mail_from="ann@example.org",
        rcpt_to=RCPT,
        received_at=rfc3339(run.clock.now()) or "",
        message_ref=run.rt.new_id(),
        trust=trust,
    )
    address = parse_address(RCPT, domains=list(config.domains))
    sha = hashlib.sha256(raw).hexdigest()
    now = run.clock.now()
    got = await run.store.write(
        lambda db: service.deliver(run.rt, db, address, mail, raw, sha, now)
    )
    return {"ref": got.message_ref, "event": mail.event.to_json()}


async def served(run: Running, mid: str, raw: bytes, kinds: Counter[str]) -> list[str]:
    """The attachments of one message served wrong: what differs, one line each."""
    recorded = await record(run, raw)
    event = recorded["event"]
    assert isinstance(event, dict)
    wrong = []
    for n, (listed, span) in enumerate(
        zip(event["attachments"], attachment_spans(raw), strict=True)
    ):
        kinds["streamed" if span.streamable else "decoded whole"] += 1
        path = f"/mas/v0.1/messages/{recorded['ref']}/attachments/{n}"
        got = await run.client.get(path, headers={"Authorization": f"Bearer {ADMIN}"})
        found = (got.status_code, len(got.content), hashlib.sha256(got.content).hexdigest())
        if found != (200, listed["size"], listed["sha256"]):
            wrong.append(f"{mid} #{n} {listed['content_type']}: {found[:2]}")
    return wrong


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s["name"])
def test_every_listed_attachment_of_the_mail_corpus_is_served_as_listed(
    source: dict[str, str], tmp_path: Path
) -> None:
    work = tmp_path / "mail"
    work.mkdir()
    messages = shipped(source) if source in MANIFEST["shipped"] else generated(source, work)
    assert messages
    kinds: Counter[str] = Counter()

    async def main() -> list[str]:
        wrong: list[str] = []
        async with serving(tmp_path) as run:
            for mid, raw in messages:
                wrong += await served(run, mid, raw, kinds)
        return wrong

    wrong = asyncio.run(main())
    print(f"\n{source['name']}: {len(messages)} messages, attachments {dict(kinds)}")
    assert not wrong, "\n".join(wrong[:40])
    if source["name"] == "uuencode":
        assert kinds["streamed"] > 0


def test_a_file_inside_a_tnef_part_is_served_whole_and_by_range(tmp_path: Path) -> None:
    pdf = b"%PDF-1.4 " + bytes(range(256)) * 4
    files = [("REPORT~1.PDF", "Quarterly report 2025.pdf", pdf), ("A.TXT", "a.txt", b"a")]
    raw = HEAD + (
        b"Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\nsee\n"
        b'--b\nContent-Type: application/ms-tnef; name="winmail.dat"\n'
        b"Content-Transfer-Encoding: base64\n\n" + base64.encodebytes(tnef(files)) + b"--b--\n"
    )

    async def main() -> None:
        async with serving(tmp_path) as run:
            assert await served(run, "tnef", raw, Counter()) == []
            ref = (await record(run, raw + b"\n"))["ref"]
            path = f"/mas/v0.1/messages/{ref}/attachments/1"
            headers = {"Authorization": f"Bearer {ADMIN}", "Range": "bytes=9-18"}
            got = await run.client.get(path, headers=headers)
            assert (got.status_code, got.content) == (206, pdf[9:19])
            assert got.headers["content-range"] == f"bytes 9-18/{len(pdf)}"

    asyncio.run(main())
