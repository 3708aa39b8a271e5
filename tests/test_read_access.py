"""Who reads what, over real sockets against a running masd (docs/protocol.md §16.10).

One matrix: every read route, asked by the admin, by the master of each of two types, by
a mode endpoint, by a webhook, with a secret nobody has and with none.  The admin reads
everything; each master reads its own domain's and types' messages, cases, threads,
events and intakes (pending ones included) and gets ``403 forbidden`` for the other's;
the lists answer a master with its own types only; mode endpoints and webhooks read
nothing (403); no secret or an unknown one is 401.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from support.readers import Readers, attached, running

ROLES = ("admin", "crm", "other", "mode", "webhook", "unknown", "none")


def key_path(key: str) -> str:
    return "/mas/v0.1/cases/" + quote(key, safe="")


def routes(message_ref: str, key: str) -> list[str]:
    """Every read route about one message and one case."""
    m = f"/mas/v0.1/messages/{message_ref}"
    return [m, m + "/raw", m + "/attachments/0", key_path(key), key_path(key) + "/thread"]


LISTS = ("/mas/v0.1/cases", "/mas/v0.1/events", "/mas/v0.1/intakes")


def listed_types(path: str, body: dict[str, Any]) -> set[str]:
    """The "domain/type" pairs a list's items belong to."""
    if path.endswith("/cases"):
        return {f"{c['domain']}/{c['type']}" for c in body["cases"]}
    if path.endswith("/intakes"):
        return {f"{i['domain']}/{i['type']}" for i in body["intakes"]}
    found = set()
    for e in body["events"]:
        local, domain = e["case"]["key"].split("@")
        found.add(f"{domain}/{local.split('=')[0]}")
    return found


async def setup_store(r: Readers) -> dict[str, tuple[str, str]]:
    """A case and a pending intake for each master; (message_ref, case key) of each
    master's case, and the message_ref of each master's pending intake."""
    crm_intake = await r.intake(r.crm, "case@help.example", attached("c", "one"))
    other_intake = await r.intake(r.other, "order@help.example", attached("o", "two"))
    await r.assign(r.setup.master_token, crm_intake["intake_ref"], "c-1")
    await r.assign(r.setup.other_master_token, other_intake["intake_ref"], "o-1")
    crm_pending = await r.intake(r.crm, "case@help.example", attached("c", "three"))
    other_pending = await r.intake(r.other, "case@other.example", attached("o", "four"))
    return {
        "crm": (crm_intake["event"]["message_ref"], "case=c-1@help.example"),
        "other": (other_intake["event"]["message_ref"], "order=o-1@help.example"),
        "crm-pending": (crm_pending["event"]["message_ref"], ""),
        "other-pending": (other_pending["event"]["message_ref"], ""),
    }


def expected(who: str, owner: str) -> int:
    if who in ("unknown", "none"):
        return 401
    if who in ("mode", "webhook"):
        return 403
    return 200 if who in ("admin", owner) else 403


def test_every_read_route_answers_each_kind_of_caller_by_one_rule(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as r:
            made = await setup_store(r)
            got: dict[tuple[str, str], int] = {}
            want: dict[tuple[str, str], int] = {}
            for owner in ("crm", "other"):
                message_ref, key = made[owner]
                pending_ref = made[f"{owner}-pending"][0]
                paths = [*routes(message_ref, key), *routes(pending_ref, "")[:3]]
                for path in paths:
                    for who in ROLES:
                        response = await r.get(path, who)
                        got[(path, who)] = response.status_code
                        want[(path, who)] = expected(who, owner)
                        if response.status_code != 200:
                            assert (
                                response.json()["error"]
                                == {
                                    401: "unauthenticated",
                                    403: "forbidden",
                                }[response.status_code]
                            )
            assert got == want
            await lists_hold_only_own_types(r)

    asyncio.run(main())


async def lists_hold_only_own_types(r: Readers) -> None:
    own = {
        "admin": {"help.example/case", "help.example/order", "other.example/case"},
        "crm": {"help.example/case"},
        "other": {"help.example/order", "other.example/case"},
    }
    for path in LISTS:
        for who in ROLES:
            response = await r.get(path, who, params={"limit": 1000})
            assert response.status_code == expected(who, who), (path, who, response.text)
            if response.status_code != 200:
                continue
            shown = listed_types(path, response.json())
            if path.endswith("/cases"):
                # only assigned cases: the pending intake of other.example has none
                assert shown == own[who] - {"other.example/case"}, (path, who)
            else:
                assert shown == own[who] - (
                    set() if path.endswith("/intakes") else {"other.example/case"}
                ), (path, who)
    # The event feed's stream and long poll are read under the same rule.
    response = await r.get(
        "/mas/v0.1/events", "crm", params={"wait": 1}, headers={"Accept": "application/json"}
    )
    assert listed_types("/events", response.json()) == {"help.example/case"}
    response = await r.get("/mas/v0.1/events", "crm", params={"case": "order=o-1@help.example"})
    assert response.status_code == 403, response.text
    # As Server-Sent Events: the same events, the same limit.
    whole = (await r.get("/mas/v0.1/events", "crm", params={"limit": 1000})).json()["events"]
    streamed: list[dict[str, Any]] = []
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {r.setup.master_token}"}
    async with r.http.stream("GET", "/mas/v0.1/events", headers=headers) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("data: "):
                streamed.append(json.loads(line[len("data: ") :]))
            if len(streamed) == len(whole):
                break
    assert [e["cursor"] for e in streamed] == [e["cursor"] for e in whole]


def test_the_rule_itself_as_a_table() -> None:
    from masd.read.access import ADMIN, ANYTHING, Owned, Reader, entitled

    crm = Reader.master_of("crm", [("help.example", "case")])
    other = Reader.master_of("other", [("help.example", "order"), ("other.example", "case")])
    things = [
        Owned("help.example", "case"),
        Owned("help.example", "order"),
        Owned("other.example", "case"),
        Owned("help.example", "ticket"),
    ]
    table = {
        name: [entitled(who, what) for what in things]
        for name, who in (("admin", ADMIN), ("crm", crm), ("other", other), ("peer", None))
    }
    assert table == {
        "admin": [True, True, True, True],
        "crm": [True, False, False, False],
        "other": [False, True, True, False],
        "peer": [False, False, False, False],
    }
    assert [entitled(who, ANYTHING) for who in (ADMIN, crm, other, None)] == [
        True,
        True,
        True,
        False,
    ]
    assert (ADMIN.scope, crm.scope) == (None, ["help.example/case"])
