"""reply_text (profile §21): the corpus of real replies in tests/data/replies/ and the rules."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.masd_process import write_master_config

from bench.reply_corpus import load, normal
from masd.cli import main
from masd.config import load_config
from masd.core.address import parse_address
from masd.core.details import find_fields
from masd.core.event import build_event
from masd.core.reply import has_words, reply_text
from masd.service import Runtime, deliver
from masd.store import Store

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


REPLY_MAIL = (
    b"Authentication-Results: mx.help.example; dmarc=pass header.from=example.com\r\n"
    b"From: Alice <alice@example.com>\r\nTo: ticket!callback@help.example\r\n"
    b"Subject: Call me\r\nMessage-ID: <reply-1@example.com>\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n\r\n"
    b"phone: +1 555 0100\r\n\r\nThanks!\r\n\r\n-- \r\nAlice, phone: +1 555 9999\r\n\r\n"
    b"Am 3. Feb. 2025 um 10:00 schrieb Desk <desk@help.example>:\r\n"
    b"> phone: +1 555 0000\r\n"
)


def _delivered(tmp_path: Path) -> tuple[Path, str]:
    setup = write_master_config(tmp_path, endpoint_url="http://127.0.0.1:9/mas", smtp_port=25)
    config = load_config(setup.config)
    counter = itertools.count(1)
    rt = Runtime(config, lambda: f"id-{next(counter)}")
    mail = build_event(
        REPLY_MAIL,
        mail_from="alice@example.com",
        rcpt_to="ticket!callback@help.example",
        received_at="2026-11-29T10:00:00Z",
        message_ref="msg-reply-1",
        trust=rt.trust(),
    )
    rcpt = parse_address("ticket!callback@help.example")
    with Store.open(config.server.database) as store:
        store.write_sync(
            lambda db: deliver(rt, db, rcpt, mail, REPLY_MAIL, "0" * 64, 1_790_000_000.0)
        )
    return setup.config, "msg-reply-1"


def test_case_and_message_show_print_the_reply_first(tmp_path: Path) -> None:
    config, ref = _delivered(tmp_path)
    runner = CliRunner()
    case = runner.invoke(main, ["case", "show", "--config", str(config), "ticket-1"])
    assert case.exit_code == 0, case.output
    assert "| Thanks!" in case.stdout
    assert "schrieb" not in case.stdout
    assert "555 9999" not in case.stdout
    whole = runner.invoke(
        main, ["case", "show", "--config", str(config), "ticket-1", "--whole-text"]
    )
    assert "> phone: +1 555 0000" in whole.stdout
    assert "555 9999" in whole.stdout

    shown = runner.invoke(main, ["message", "show", "--config", str(config), ref])
    assert shown.exit_code == 0, shown.output
    reply_at = shown.stdout.index("reply (the sender's own words):")
    assert "| phone: +1 555 0100" in shown.stdout[reply_at:]
    assert "schrieb" not in shown.stdout
    assert "--whole-text" in shown.stdout
    both = runner.invoke(main, ["message", "show", "--config", str(config), ref, "--whole-text"])
    assert both.stdout.index("reply (") < both.stdout.index("text (whole):")
    assert "  | > phone: +1 555 0000" in both.stdout

    doc = json.loads(
        runner.invoke(main, ["message", "show", "--config", str(config), ref, "--json"]).stdout
    )
    event = doc["message"]["event"]
    assert event["reply_text"] == "phone: +1 555 0100\n\nThanks!"
    assert event["text"].endswith("> phone: +1 555 0000\n")


def test_negotiation_reads_the_details_from_the_reply_only() -> None:
    from test_engine import TYPE, case, ctx, handoff, mail, of

    from masd.core.engine import SendContract, master_mail

    rcpt = "ticket=gs-1@help.example"
    body = (
        "phone: 555 0199\n\n-- \nAlice\nfax: 555 0000\n\n"
        "On Mon, 3 Feb 2025 at 10:00, Desk <desk@help.example> wrote:\n> fax:\n> phone:\n"
    )
    effects = master_mail(
        case(handoff("negotiating", 3, ("phone", "fax"))),
        parse_address(rcpt),
        mail(rcpt, body=body),
        TYPE,
        ctx(),
        new_case_id="",
    )
    (send,) = of(SendContract, effects)
    assert send.message["details"] == {"phone": "555 0199"}


def test_a_handoff_request_takes_no_details_from_the_quoted_mail() -> None:
    from test_engine import TYPE, ctx, mail, of

    from masd.core.engine import SendContract, master_mail

    rcpt = "ticket!callback@help.example"
    body = "Please call.\n\nFrom: Desk\nSent: Monday\nTo: Alice\nSubject: Re: x\n\nphone: 1\n"
    effects = master_mail(
        None, parse_address(rcpt), mail(rcpt, body=body), TYPE, ctx(), new_case_id="gs-1"
    )
    (send,) = of(SendContract, effects)
    assert send.message["details"] == {"subject": "Help"}


def test_hostile_html_stays_linear() -> None:
    from masd.core.htmltext import html_to_text
    from masd.core.reply_html import html_reply_text

    hostile = [
        "<div " + "class=x " * 100_000 + ">mine</div>",  # unquoted values, one tag
        '<div title="' + "class='a " * 50_000 + '">mine</div>',
        "mine" + "<blockquote>" * 50_000 + "q",  # never closed
        "mine" + '<div class="gmail_quote">q</div>own' * 20_000,
        "<p>mine</p>" + '<blockquote type="cite">q</blockquote>' * 20_000,
    ]
    for html in hostile:
        text = html_to_text(html)
        assert has_words(html_reply_text(html, text)) == has_words(text)


def test_html_quotes_followed_by_own_words_are_kept() -> None:
    from masd.core.htmltext import html_to_text
    from masd.core.reply_html import html_reply_text

    html = "<blockquote>Which size?</blockquote>Large.<blockquote>Colour?</blockquote>Blue."
    assert normal(html_reply_text(html, html_to_text(html))) == "Which size? Large. Colour? Blue."
    trailing = "Blue.<div class='gmail_quote'>On Mon, Bob wrote:<blockquote>x</blockquote></div>"
    assert html_reply_text(trailing, html_to_text(trailing)) == "Blue."


def test_reply_text_reaches_the_master_and_the_message_route(tmp_path: Path) -> None:
    """Over LMTP and HTTP against a running masd: case.intake's event and GET
    /mas/v0.1/messages/{ref} carry reply_text (an HTML-only Outlook reply, Yahoo's text)."""
    import asyncio

    from support.readers import running

    wanted = {c.name: c for c in CASES if c.name in {"masd/outlook_html_only", "talon/yahoo"}}

    async def main() -> None:
        async with running(tmp_path) as r:
            for case in wanted.values():
                intake = await r.intake(r.crm, "case@help.example", case.raw)
                event = intake["event"]
                assert normal(event["reply_text"]) == normal(case.expected)
                assert len(event["text"]) > len(event["reply_text"])
                ref = event["message_ref"]
                doc = (await r.get(f"/mas/v0.1/messages/{ref}", "crm")).json()["message"]
                assert doc["event"]["reply_text"] == event["reply_text"]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("text", "reply"),
    [
        ("Done.\n\nSent from my iPhone\n", "Done."),
        ("Done.\n\nSent from my TI-85\n", "Done."),
        ("Done.\n\nVon meinem iPhone gesendet\n", "Done."),
        ("Done.\n\niPhoneから送信\n", "Done."),
        ("Done.\n\nGet Outlook for Android<https://aka.ms/ghei36>\n", "Done."),
        ("Done.\n\nSent by courier today\n", "Done.\n\nSent by courier today\n"),
        ("Done.\n\nSent on Monday.\n", "Done.\n\nSent on Monday.\n"),
    ],
)
def test_client_sign_offs_go_and_sentences_stay(text: str, reply: str) -> None:
    assert reply_text(text) == reply
