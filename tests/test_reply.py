"""reply_text (profile §21): the corpus of real replies in tests/data/replies/ and the rules."""

from __future__ import annotations

import pytest

from bench.reply_corpus import load, normal
from masd.core.details import find_fields
from masd.core.reply import has_words, reply_text

CASES = load()


def test_corpus_score_is_at_least_90_percent() -> None:
    exact = [c.name for c in CASES if normal(c.event().reply_text) == normal(c.expected)]
    missed = sorted({c.name for c in CASES} - set(exact))
    assert len(exact) / len(CASES) >= 0.90, missed


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_never_empty_while_the_sender_wrote(case) -> None:  # type: ignore[no-untyped-def]
    event = case.event()
    assert has_words(event.reply_text) == has_words(event.text)
    assert len(event.reply_text) <= len(event.text) or normal(event.reply_text) == normal(
        event.text
    )


def test_corpus_covers_clients_and_languages() -> None:
    assert len({c.lang for c in CASES}) >= 12
    clients = {c.client for c in CASES}
    for client in (
        "Gmail",
        "Outlook",
        "Apple Mail",
        "iPhone",
        "Android",
        "Thunderbird",
        "Yahoo",
        "AOL",
    ):
        assert client in clients


def test_text_unchanged_when_nothing_is_removed() -> None:
    text = "Hello,\n\nthe order is late.\n> quoted\nand more of mine\n"
    assert reply_text(text) == text


def test_trailing_quote_attribution_and_signature_go() -> None:
    text = (
        "Yes, Tuesday works.\n\n-- \nAnn\n\n"
        "On Mon, 3 Feb 2025 at 10:00, Bob <bob@example.org> wrote:\n> Does Tuesday work?\n"
    )
    assert reply_text(text) == "Yes, Tuesday works."


def test_all_quote_gives_the_whole_text() -> None:
    assert reply_text("> only a quote\n") == "> only a quote\n"


def test_details_are_read_from_the_reply_only() -> None:
    text = "phone: 555 0100\n\nOn Mon, 3 Feb 2025, Desk <desk@help.example> wrote:\n> order: \n"
    reply = reply_text(text)
    assert find_fields(reply, ["phone", "order"]) == {"phone": "555 0100"}
    outlook = "Thanks\n\nFrom: Desk\nSent: Monday\nTo: Ann\nSubject: Re: x\n\norder: 42\n"
    assert find_fields(reply_text(outlook), ["order"]) == {}
    assert find_fields(reply_text("from: Berlin\nto: Paris\ndate: Monday\n"), ["to"]) == {
        "to": "Paris"
    }


def test_hostile_text_stays_linear() -> None:
    # many quote/sign-off rounds and attribution-looking lines: bounded work per line
    text = "mine\n" + "Sent from my iPhone\n> q\n" * 20000 + "On 1 Jan 2020 x wrote:\n" * 5000
    assert has_words(reply_text(text))
