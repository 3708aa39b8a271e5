"""A real bounce through a real Postfix (docs/protocol.md §22), on the deployment of
tests/test_postfix_e2e.py: masd's acknowledgement leaves through Postfix with its bounce
address; the next hop refuses the recipient at RCPT, so Postfix's bounce(8) writes a DSN
to that envelope sender, and relays it to masd over LMTP like any mail for help.example.
masd records it on the case, marks the mail bounced, and suppresses the address.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.bounces import bounce_case
from test_postfix_e2e import ANN, bounces, deployment, make_mail, run

REFUSAL = "550 5.1.1 <ann@example.org>: Recipient address rejected: User unknown"


def _kinds(entries: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in entries]


@pytest.mark.slow
@pytest.mark.postfix
def test_postfix_bounce_comes_back_to_its_case(tmp_path: Path) -> None:
    async def main() -> None:
        async with deployment(tmp_path) as d:
            d.sink.refuse(REFUSAL, 1, at="RCPT")
            _, data = make_mail(ANN, "ticket@help.example", subject="My invoice")
            assert await d.postfix.send(ANN, ["ticket@help.example"], data) == {}

            case = "ticket=ticket-1@help.example"
            entries = await d.wait_thread(
                case, lambda e: "mail.bounced" in _kinds(e), "the bounce of the acknowledgement"
            )
            assert _kinds(entries) == ["mail.in", "mail.out", "mail.bounced"]
            out, bounced = entries[1], entries[2]
            assert out["delivery"]["state"] == "bounced"
            assert out["delivery"]["status"] == "5.1.1"
            assert "User unknown" in out["delivery"]["diagnostic"]
            assert bounced["mail_seq"] == out["seq"]
            assert bounced["recipient"] == ANN
            assert bounced["permanent"] is True
            assert bounced["remote_mta"] == out["delivery"]["remote_mta"]
            assert bounced["remote_mta"] is not None

            # Postfix wrote the DSN to the bounce address and handed it to masd, not to the
            # next hop; masd answered nothing.
            log = await d.postfix.wait_log("sender non-delivery notification")
            assert "sender non-delivery notification" in log
            await d.wait_queue_empty()
            assert bounces(d.sink.messages) == []
            assert d.sink.messages == []
            received = await d.http.get("/mas/v0.1/events", params={"limit": 1000})
            feed = [e["entry"] for e in received.json()["events"]]
            assert bounced in feed

            # The next acknowledgement to Ann is refused, and the sink sees nothing.
            _, again = make_mail(ANN, "ticket@help.example", subject="Still there?")
            assert await d.postfix.send(ANN, ["ticket@help.example"], again) == {}
            second = await d.wait_thread(
                "ticket=ticket-2@help.example",
                lambda e: "mail.refused" in _kinds(e),
                "the suppressed acknowledgement",
            )
            refused = [e for e in second if e["kind"] == "mail.refused"]
            assert [(e["reason"], e["to"]) for e in refused] == [("suppressed", ANN)]
            await d.wait_queue_empty()
            assert d.sink.messages == []

    run(main)


def test_the_bounce_case_helper_refuses_other_senders() -> None:
    assert bounce_case("ticket=t-1+bounce-1-abcdefghijklmnop@help.example") == (
        "ticket=t-1@help.example"
    )
    with pytest.raises(AssertionError):
        bounce_case("ticket=t-1@help.example")
