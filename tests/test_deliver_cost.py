"""The cheap paths of a delivery give what the general paths give.

A send that answers the mail the same job has just recorded reads that mail
from memory instead of from its row; the Principle 10 counts are read only
when a send got past the rules on who the recipient is; a type's view is
built once.  Each test here holds one of those shortcuts to the answer of the
path it replaces, or to the behaviour an operator sees.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.ticket import write_ticket_config

from masd.cli import main
from masd.config import Config
from masd.core.address import parse_address
from masd.core.event import build_event
from masd.core.principle10 import Caps, Counts, Recipient, decide_send
from masd.service import Runtime, UnknownCase, deliver, load_case
from masd.service.apply import Recorded, _recipient
from masd.store import Store

AT = 1_790_000_000.0


def write_config(directory: Path, per_day: int = 10) -> Config:
    cap = f"send_cap = {{ per_case = 20, per_recipient_per_day = {per_day} }}"
    return write_ticket_config(directory, server='hostname = "masd.help.example"', ticket=cap)


def message(
    *,
    sender: str = "Alice <alice@example.com>",
    subject: str | None = "Printer on fire",
    message_id: str | None = "<m-1@example.com>",
    references: str | None = None,
    dmarc: str | None = "pass",
    automated: bool = False,
) -> bytes:
    head = []
    if dmarc is not None:
        head.append(
            f"Authentication-Results: mx.help.example; dmarc={dmarc} header.from=example.com"
        )
    head += [f"From: {sender}", "To: ticket@help.example"]
    if subject is not None:
        head.append(f"Subject: {subject}")
    if message_id is not None:
        head.append(f"Message-ID: {message_id}")
    if references is not None:
        head.append(f"References: {references}")
    if automated:
        head.append("Auto-Submitted: auto-replied")
    return ("\r\n".join(head) + "\r\n\r\nThe printer on floor 3 is on fire.\r\n").encode()


class Rig:
    def __init__(self, config: Config) -> None:
        self.config = config
        counter = itertools.count(1)
        self.rt = Runtime(config, lambda: f"id-{next(counter)}")
        self.refs = itertools.count(1)

    def deliver(
        self, store: Store, raw: bytes, rcpt: str = "ticket@help.example", at: float = AT
    ) -> tuple[str, str]:
        """Deliver ``raw``; (message_ref, case key)."""
        n = next(self.refs)
        mail = build_event(
            raw,
            mail_from="alice@example.com",
            rcpt_to=rcpt,
            received_at="2026-09-21T10:00:00Z",
            message_ref=f"msg-{n}",
            trust=self.rt.trust(),
        )
        address = parse_address(rcpt)
        done = store.write_sync(
            lambda db: deliver(self.rt, db, address, mail, raw, f"{n:064x}", at + n)
        )
        return done.message_ref, done.case_key


def rows(store: Store, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return store.read_sync(lambda db: list(db.execute(sql, params).fetchall()))


def thread(store: Store, key: str) -> list[tuple[Any, ...]]:
    return rows(store, "SELECT kind, data FROM thread WHERE case_key = ? ORDER BY seq", key)


def test_type_view_is_built_once_per_type_and_cannot_be_changed(tmp_path: Path) -> None:
    rt = Rig(write_config(tmp_path)).rt
    view = rt.type_view("help.example", "ticket")
    assert rt.type_view("help.example", "ticket") is view
    assert view.endpoints["callback"].peer == "mode:help.example/ticket/callback"
    with pytest.raises(TypeError):
        view.endpoints["chat"] = view.endpoints["callback"]  # type: ignore[index]
    # An unknown type is refused every time, not remembered as anything.
    for _ in range(2):
        with pytest.raises(UnknownCase):
            rt.type_view("help.example", "nope")


def test_refused_acknowledgement_is_in_the_thread_and_case_show(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    rig = Rig(config)
    with Store.open(config.server.database) as store:
        _, key = rig.deliver(store, message(dmarc=None))
        kinds = [kind for kind, _ in thread(store, key)]
        assert kinds == ["mail.in", "mail.refused"]
        assert '"reason":"unauthenticated-sender"' in thread(store, key)[1][1]
        assert rows(store, "SELECT count(*) FROM send_log") == [(0,)]
        assert rows(store, "SELECT count(*) FROM outbox") == [(0,)]
        assert rows(store, "SELECT sent_count FROM cases WHERE key = ?", key) == [(0,)]
    shown = CliRunner().invoke(main, ["case", "show", "--config", str(tmp_path / "masd.toml"), key])
    assert shown.exit_code == 0, shown.output
    assert "mail.refused" in shown.output
    assert "reason=unauthenticated-sender" in shown.output


def test_automated_sender_is_refused_even_with_dmarc_pass(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    rig = Rig(config)
    with Store.open(config.server.database) as store:
        _, key = rig.deliver(store, message(automated=True))
        assert '"reason":"automated-sender"' in thread(store, key)[1][1]
        assert rows(store, "SELECT count(*) FROM send_log") == [(0,)]


def test_acknowledgement_answers_the_delivered_mail_and_counts_toward_the_cap(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, per_day=1)
    rig = Rig(config)
    with Store.open(config.server.database) as store:
        ref, key = rig.deliver(
            store, message(references="<m-0@example.com>", subject="=?utf-8?q?Drucker?=")
        )
        entries = thread(store, key)
        assert [kind for kind, _ in entries] == ["mail.in", "mail.out"]
        assert f'"in_reply_to":"{ref}"' in entries[1][1]
        assert '"subject":"Re: Drucker"' in entries[1][1]
        [(payload,)] = rows(store, "SELECT payload FROM outbox WHERE kind = 'mail'")
        assert "In-Reply-To: <m-1@example.com>" in payload
        assert "References: <m-0@example.com> <m-1@example.com>" in payload
        assert rows(store, "SELECT sent_count FROM cases WHERE key = ?", key) == [(1,)]
        assert rows(store, "SELECT recipient FROM send_log") == [("alice@example.com",)]
        # The same sender again within 24 h: the counts are read, the cap holds.
        _, second = rig.deliver(store, message(message_id="<m-2@example.com>"))
        assert second != key
        assert '"reason":"send-cap-reached"' in thread(store, second)[1][1]
        assert rows(store, "SELECT count(*) FROM outbox WHERE kind = 'mail'") == [(1,)]


_HEADER_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=0, max_size=30
)


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sender=st.sampled_from(
        ["Alice <alice@example.com>", "ALICE@Example.COM", "<>", "Bob <bob@other.example>"]
    ),
    subject=st.one_of(st.none(), _HEADER_TEXT, st.just("=?utf-8?b?w6TDtsO8?=")),
    message_id=st.sampled_from([None, "<m-1@example.com>", "garbage"]),
    references=st.sampled_from([None, "<r-1@x> <r-2@x>", ""]),
    dmarc=st.sampled_from([None, "pass", "fail", "none"]),
    automated=st.booleans(),
    mode=st.sampled_from(["", "!callback", "!chat"]),
)
def test_the_mail_in_memory_is_the_row_a_send_would_read(
    tmp_path_factory: pytest.TempPathFactory,
    sender: str,
    subject: str | None,
    message_id: str | None,
    references: str | None,
    dmarc: str | None,
    automated: bool,
    mode: str,
) -> None:
    directory = tmp_path_factory.mktemp("memory")
    config = write_config(directory)
    rig = Rig(config)
    raw = message(
        sender=sender,
        subject=subject,
        message_id=message_id,
        references=references,
        dmarc=dmarc,
        automated=automated,
    )
    rcpt = f"ticket{mode}@help.example"
    mail = build_event(
        raw,
        mail_from="alice@example.com",
        rcpt_to=rcpt,
        received_at="2026-09-21T10:00:00Z",
        message_ref="msg-1",
        trust=rig.rt.trust(),
    )
    with Store.open(config.server.database) as store:
        key = store.write_sync(
            lambda db: deliver(rig.rt, db, parse_address(rcpt), mail, raw, "0" * 64, AT)
        ).case_key
        recorded = Recorded(mail.event, key, opened=True)

        def both(db: Any) -> list[tuple[Any, Any]]:
            case = load_case(rig.rt, db, key)
            assert case is not None
            return [
                (_recipient(db, case, reply_to), _recipient(db, case, reply_to, recorded))
                for reply_to in (None, "msg-1", "msg-2")
            ]

        for stored, memory in store.read_sync(both):
            assert memory == stored


@given(
    recipient=st.one_of(
        st.none(),
        st.builds(
            Recipient,
            address=st.sampled_from(["", "alice@example.com"]),
            authenticated=st.booleans(),
            automated=st.booleans(),
        ),
    ),
    counts=st.builds(Counts, st.integers(0, 50), st.integers(0, 50)),
    caps=st.builds(Caps, st.integers(1, 30), st.integers(1, 30)),
)
def test_a_send_refused_before_any_count_is_refused_alike_whatever_the_counts(
    recipient: Recipient | None, counts: Counts, caps: Caps
) -> None:
    """What the send gate relies on to skip the two count queries."""
    early = decide_send(recipient, Counts(0, 0), caps)
    if early is not None:
        assert decide_send(recipient, counts, caps) == early
