"""The reply corpus of tests/data/replies/: each case's input, what masd reads from it, and
the reply expected (tests/test_reply.py and bench/reply_score.py read it the same way).

A case is a file ``NAME.txt`` (a text/plain body), ``NAME.html`` (an HTML-only body) or
``NAME.eml`` (a whole message) beside ``NAME.expected``, the reply a reader wants: the
sender's own words as profile §21 draws them.  ``index.json`` names, for each case, the mail
client that wrote it, its language and its source; ``README.md`` the sources' licences.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from masd.core.event import GatewayEvent, build_event
from masd.core.trust import TrustSettings

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "replies"
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "txt", "html" or "eml"
    client: str
    lang: str
    source: str
    raw: bytes  # the whole message masd reads
    expected: str

    def event(self) -> GatewayEvent:
        return build_event(
            self.raw,
            mail_from="sender@example.org",
            rcpt_to="ticket@help.example",
            received_at="2026-01-01T00:00:00Z",
            message_ref="m1",
            trust=TrustSettings(trusted_authserv_ids=frozenset(), trusted_hosts=frozenset()),
        ).event

    def html(self) -> str | None:
        """The HTML body as written (for readers that take markup), else None."""
        if self.kind == "html":
            return _text_of(self.raw)
        return None


def normal(text: str) -> str:
    """``text`` with every run of white space one space, none at either end."""
    return _SPACE.sub(" ", text).strip()


def _text_of(raw: bytes) -> str:
    return raw.split(b"\n\n", 1)[1].decode("utf-8")


def _message(body: str, content_type: str) -> bytes:
    head = (
        "From: Sender <sender@example.org>\nTo: ticket@help.example\nSubject: Re: your request\n"
        "Message-ID: <reply@example.org>\nMIME-Version: 1.0\n"
        f"Content-Type: {content_type}; charset=utf-8\nContent-Transfer-Encoding: 8bit\n\n"
    )
    return (head + body).encode("utf-8")


def load() -> list[Case]:
    """Every case of the corpus, by name."""
    index = json.loads((CORPUS / "index.json").read_text(encoding="utf-8"))
    cases = []
    for expected in sorted(CORPUS.glob("*/*.expected")):
        name = f"{expected.parent.name}/{expected.stem}"
        meta = index["cases"][name]
        found = [p for p in expected.parent.glob(expected.stem + ".*") if p.suffix != ".expected"]
        (source,) = found
        kind = source.suffix[1:]
        data = source.read_bytes()
        if kind == "txt":
            raw = _message(data.decode("utf-8").replace("\r\n", "\n"), "text/plain")
        elif kind == "html":
            raw = _message(data.decode("utf-8").replace("\r\n", "\n"), "text/html")
        else:
            raw = data
        cases.append(
            Case(
                name=name,
                kind=kind,
                client=meta["client"],
                lang=meta["lang"],
                source=meta.get("source", expected.parent.name),
                raw=raw,
                expected=expected.read_text(encoding="utf-8"),
            )
        )
    return cases
