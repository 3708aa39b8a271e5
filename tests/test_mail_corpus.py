"""masd's reading of real mail against the standard library's, message by message.

The corpus (tests/mail_corpus.json) is mail other software wrote: messages
Debian packages ship (read where they install them) and messages mail
programs from Debian write at test time.  For every message, masd's event
(text, attachments with size and sha256, From addresses and name, subject,
Message-ID, In-Reply-To) is compared with what Python's ``email`` package
(policy ``default``) reads; tests/mail_differences.json lists each difference
with the reason masd's reading is the better one.  An unlisted difference
fails, and so does a listed one that is gone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.mailcorpus import MANIFEST, generated, masd_reading, shipped, stdlib_reading

TESTS = Path(__file__).resolve().parent
LISTED = json.loads((TESTS / "mail_differences.json").read_text("utf-8"))
SOURCES = [*MANIFEST["shipped"], *MANIFEST["generated"]]


def _messages(source: dict[str, str], work: Path) -> list[tuple[str, bytes]]:
    if source in MANIFEST["shipped"]:
        return shipped(source)
    return generated(source, work)


def _differences(messages: list[tuple[str, bytes]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for mid, raw in messages:
        ours, theirs = masd_reading(raw), stdlib_reading(raw)
        diff = {key: [ours[key], theirs[key]] for key in ours if ours[key] != theirs[key]}
        if diff:
            found[mid] = diff
    return found


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s["name"])
def test_masd_reads_the_corpus_as_the_stdlib_does_or_better(
    source: dict[str, str], tmp_path: Path
) -> None:
    messages = _messages(source, tmp_path)
    assert messages, f"{source['name']}: no messages"
    found = _differences(messages)
    prefix = source["name"] + "/"
    listed = {m: set(d) for m, d in LISTED["differences"].items() if m.startswith(prefix)}
    unlisted = {m: d for m, d in found.items() if set(d) != listed.get(m, set())}
    gone = sorted(set(listed) - set(found))
    assert not unlisted, json.dumps(unlisted, indent=1, ensure_ascii=False, default=str)[:6000]
    assert not gone, f"listed differences that are gone: {gone}"


def test_every_listed_difference_has_a_reason() -> None:
    reasons = LISTED["reasons"]
    for mid, fields in LISTED["differences"].items():
        assert mid.split("/", 1)[0] in {s["name"] for s in SOURCES}, mid
        for field, reason in fields.items():
            assert reason in reasons, (mid, field)
    used = {r for fields in LISTED["differences"].values() for r in fields.values()}
    assert used == set(reasons)


def test_the_corpus_is_large_and_varied(tmp_path: Path) -> None:
    counts = {s["name"]: len(_messages(s, tmp_path / s["name"])) for s in SOURCES}
    assert sum(counts.values()) >= 300, counts
    assert all(count >= 8 for count in counts.values()), counts
