"""The console's pages as pure functions of read-side documents: every kind of thread entry
has its row, values are escaped, and a timeline page that is full is not followed live."""

from __future__ import annotations

from typing import Any

from masd.console import pages
from masd.console.timeline import row, row_html

CASE: dict[str, Any] = {
    "case": {
        "address": "ticket=gs-1@help.example",
        "key": "ticket=gs-1@help.example",
        "role": "master",
        "participant": "ann@example.org",
        "handoffs": [],
    }
}


def entry(seq: int, kind: str, **data: Any) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "at": "2026-12-01T10:00:00Z", **data}


def test_each_kind_of_entry_says_what_it_is() -> None:
    said = {
        "mail.in": entry(1, "mail.in", **{"from": "ann@example.org"}, subject="Hi", dmarc="pass"),
        "mail.out": entry(2, "mail.out", to="ann@example.org", subject="Re: Hi", purpose="ack"),
        "mail.refused": entry(3, "mail.refused", to="bob@example.org", reason="unauthenticated"),
        "status": entry(4, "status", mode="callback", handoff_id="h1", status="failed", reason="r"),
        "contract.in": entry(5, "contract.in", type="case.assign", id="m1"),
        "contract.out": entry(6, "contract.out", type="handoff.request", id="m2", peer="mode:x"),
        "delivery.failed": entry(7, "delivery.failed", to="ann@example.org", detail="gave up"),
        "mail.bounced": entry(
            8,
            "mail.bounced",
            mail_seq=2,
            recipient="ann@example.org",
            status="5.1.1",
            diagnostic="no such user",
            permanent=True,
        ),
        "later.kind": entry(9, "later.kind", novel=1),
    }
    expected = {
        "mail.in": "from ann@example.org: “Hi”; DMARC pass",
        "mail.out": "to ann@example.org: “Re: Hi” (ack)",
        "mail.refused": "not sent to bob@example.org: unauthenticated",
        "status": "callback h1: failed (reason r)",
        "contract.in": "case.assign m1",
        "contract.out": "handoff.request to mode:x (m2)",
        "delivery.failed": "mail to ann@example.org: gave up",
        "mail.bounced": "bounce of mail #2 to ann@example.org: 5.1.1 permanent; no such user",
        "later.kind": '{"novel": 1}',
    }
    for kind, e in said.items():
        assert row(e)["what"] == expected[kind], kind


def test_a_delivery_state_is_shown_with_what_is_known_of_it() -> None:
    bounced = entry(
        2,
        "mail.out",
        to="a@b.example",
        subject="x",
        delivery={
            "state": "bounced",
            "attempts": 1,
            "status": "5.1.1",
            "remote_mta": "mx.b",
            "diagnostic": "unknown user",
            "done_at": "2026-12-01T10:01:00Z",
        },
    )
    r = row(bounced)
    assert r["state"] == "bounced"
    assert r["more"] == "1 attempt; status 5.1.1; from mx.b; unknown user; at 2026-12-01T10:01:00Z"
    assert 'class="delivery state-bounced"' in row_html(r)


def test_rows_are_escaped() -> None:
    hostile = entry(1, "mail.in", **{"from": '"><img src=x>'}, subject="<b>&</b>")
    shown = row_html(row(hostile))
    assert "<img" not in shown
    assert "<b>" not in shown
    assert "&lt;b&gt;&amp;&lt;/b&gt;" in shown


def test_a_full_timeline_page_links_on_and_is_not_followed_live() -> None:
    thread = {"entries": [entry(1, "mail.in"), entry(2, "mail.in")], "next": 2}
    full = pages.case(CASE, thread, "e7", "t0ken", limit=2)
    assert "data-feed" not in full
    assert 'href="/console/cases/ticket%3Dgs-1%40help.example?after=2"' in full
    last = pages.case(CASE, thread, "e7", "t0ken", limit=3)
    assert 'data-feed="/console/events?after=e7&amp;case=ticket%3Dgs-1%40help.example"' in last
    assert "Later entries" not in last


def message(**event: Any) -> dict[str, Any]:
    return {"message_ref": "m 1/x", "size": 2048, "event": event}


def test_a_mail_row_shows_its_own_words_first_and_the_whole_text_behind_a_click() -> None:
    whole = "Yes, Tuesday.\n\nOn Mon, Bob wrote:\n> When?\n"
    e = entry(1, "mail.in", message_ref="m 1/x", subject="Re: visit")
    trimmed = row(e, message(text=whole, reply_text="Yes, Tuesday.", attachments=[]))
    assert trimmed["mail"]["reply"] == "Yes, Tuesday."
    assert trimmed["mail"]["text"] == whole
    assert trimmed["mail"]["whole"] == "The whole text"
    shown = row_html(trimmed)
    assert '<p class="reply">Yes, Tuesday.</p>' in shown
    assert '<pre class="text">Yes, Tuesday.\n\nOn Mon, Bob wrote:\n&gt; When?\n</pre>' in shown
    assert 'href="/console/messages/m%201%2Fx/raw" download>Raw message' in shown
    # An event without reply_text (recorded before there was one) shows its text.
    older = row(e, message(text=whole))
    assert older["mail"]["reply"] == whole
    assert older["mail"]["whole"] == "The whole text (nothing was left out)"
    same = row(e, message(text="Call me.\n", reply_text="Call me.", attachments=[]))
    assert same["mail"]["whole"] == "The whole text (nothing was left out)"
    # A mail of attachments only says so instead of an empty paragraph.
    files = [{"filename": None, "content_type": "image/png", "size": 1, "sha256": "0" * 64}]
    bare = row_html(row(e, message(text="", reply_text="", attachments=files)))
    assert '<p class="reply empty">' in bare
    assert (
        '<a class="attachment" href="/console/messages/m%201%2Fx/attachments/0" download>' in bare
    )
    assert 'attachment 1</a> <span class="about">image/png, 1 byte</span>' in bare
    # An entry whose message is gone (erased) is its summary alone.
    assert row(e)["mail"] is None
    assert '<div class="mail">' not in row_html(row(e))


def test_a_mails_words_and_files_are_escaped() -> None:
    hostile = '<img src=x onerror="alert(1)">'
    files = [{"filename": hostile, "content_type": hostile, "size": 3, "sha256": "0" * 64}]
    e = entry(1, "mail.in", message_ref="r")
    shown = row_html(row(e, message(text=hostile, reply_text=hostile, attachments=files)))
    assert "<img" not in shown
    assert shown.count("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;") == 4


def test_the_header_counts_the_rows_each_by_its_tally() -> None:
    files = [{"filename": "a", "content_type": "text/plain", "size": 1, "sha256": "0" * 64}] * 3
    thread = {
        "entries": [
            entry(1, "mail.in", message_ref="a"),
            entry(2, "contract.out", type="handoff.request"),
            entry(3, "status", status="accepted"),
            entry(4, "mail.out", to="ann@example.org"),
            entry(5, "mail.in", message_ref="b"),
            entry(6, "mail.in", message_ref="gone"),
        ],
        "next": 6,
    }
    mails = {"a": message(text="x", attachments=files), "b": message(text="y")}
    page = pages.case(CASE, thread, "e7", "t0ken", limit=100, messages=mails)
    for name, n in (
        ("entries", 6),
        ("mails_in", 3),
        ("attachments", 3),
        ("statuses", 1),
        ("mails_sent", 1),
    ):
        assert f'<dd data-count="{name}">{n}</dd>' in page, name
    given = pages.case(CASE, thread, "e7", "t0ken", limit=100, counted={"entries": 40})
    assert '<dd data-count="entries">40</dd>' in given
    assert '<dd data-count="statuses">0</dd>' in given
