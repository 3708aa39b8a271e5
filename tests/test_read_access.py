"""Who reads what, over real sockets against a running masd (docs/protocol.md §16.10).

One matrix: every read route, asked by the admin, by the master of each of two types, by
a mode endpoint, by a webhook, with a secret nobody has and with none.  The admin reads
everything; each master reads its own domain's and types' messages, cases, threads,
events and intakes (pending ones included), and what is another's is answered exactly as
what does not exist (the same 404, the same body, no key named); the lists answer a
master with its own types only; mode endpoints and webhooks read nothing (403); no
secret or an unknown one is 401.
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
    return 200 if who in ("admin", owner) else 404


def twin(path: str, message_ref: str, key: str) -> tuple[str, str, str]:
    """The same route about a message or case that does not exist: (path, what the
    detail names there, what it names here)."""
    if key and key_path(key) in path:
        bogus = key.replace("@", "-nobody@")
        return path.replace(key_path(key), key_path(bogus)), bogus, key
    return path.replace(message_ref, message_ref + "nobody"), message_ref + "nobody", message_ref


async def answered_as_unknown(
    r: Readers, who: str, path: str, hidden: Any, names: tuple[str, ...]
) -> None:
    """``hidden`` (``who``'s answer about another's thing) is the answer about nothing."""
    other_path, bogus, real = names
    unknown = await r.get(other_path, who)
    assert (hidden.status_code, unknown.status_code) == (404, 404), (path, who, hidden.text)
    assert hidden.json() == {
        **unknown.json(),
        "detail": unknown.json()["detail"].replace(bogus, real),
    }, (path, who)
    assert hidden.headers["content-type"] == unknown.headers["content-type"]


def test_every_read_route_answers_each_kind_of_caller_by_one_rule(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as r:
            made = await setup_store(r)
            got: dict[tuple[str, str], int] = {}
            want: dict[tuple[str, str], int] = {}
            for owner in ("crm", "other"):
                message_ref, key = made[owner]
                pending_ref = made[f"{owner}-pending"][0]
                paths = [(p, message_ref, key) for p in routes(message_ref, key)]
                paths += [(p, pending_ref, "") for p in routes(pending_ref, "")[:3]]
                for path, ref, case_key in paths:
                    for who in ROLES:
                        response = await r.get(path, who)
                        got[(path, who)] = response.status_code
                        want[(path, who)] = expected(who, owner)
                        if response.status_code == 404:
                            names = twin(path, ref, case_key)
                            await answered_as_unknown(r, who, path, response, names)
                        elif response.status_code != 200:
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
    hidden = await r.get("/mas/v0.1/events", "crm", params={"case": "order=o-1@help.example"})
    unknown = await r.get("/mas/v0.1/events", "crm", params={"case": "order=o-9@help.example"})
    assert (hidden.status_code, unknown.status_code) == (404, 404), hidden.text
    assert hidden.json()["detail"] == unknown.json()["detail"].replace("o-9", "o-1")
    # A bare id names no case of another's: neither which key has it nor that one does.
    by_id = await r.get("/mas/v0.1/events", "crm", params={"case": "o-1"})
    assert by_id.json() == {"ok": False, "error": "unknown-case", "detail": "case: no case o-1"}
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
    # An event is its case key's: the key names the domain and type, erased case or not.
    from masd.read.access import key_owner

    assert key_owner("case=c-1.x_y@help.example") == Owned("help.example", "case")
    assert entitled(crm, key_owner("case=c-1@help.example"))
    assert not entitled(crm, key_owner("order=c-1@help.example"))


def test_a_master_cannot_count_a_master_role_types_cases(tmp_path: Path) -> None:
    """Master-role ids are sequential (``ticket=1``, ``ticket=2``, ...): a slave-role
    type's master asking for each gets what it gets for one that was never made, on the
    case, its thread and the feed, by key or by bare id."""

    async def main() -> None:
        async with running(tmp_path) as r:
            await r.deliver("ticket@help.example", attached("ticket", "help"))
            listed = (await r.get("/mas/v0.1/cases", "admin", params={"limit": 1000})).json()
            made = [c["key"] for c in listed["cases"] if c["type"] == "ticket"]
            assert len(made) == 1, listed
            key = made[0]
            bogus = key.replace("=", "=9").replace("@", "9@")
            for suffix in ("", "/thread"):
                hidden = await r.get(key_path(key) + suffix, "crm")
                unknown = await r.get(key_path(bogus) + suffix, "crm")
                assert (hidden.status_code, unknown.status_code) == (404, 404), hidden.text
                assert hidden.json()["detail"] == unknown.json()["detail"].replace(bogus, key)
                assert (await r.get(key_path(key) + suffix, "admin")).status_code == 200
            case_id = key.split("=")[1].split("@")[0]
            for named in (key, case_id):
                hidden = await r.get("/mas/v0.1/events", "crm", params={"case": named})
                assert hidden.json() == {
                    "ok": False,
                    "error": "unknown-case",
                    "detail": f"case: no case {named}",
                }, hidden.text
                assert hidden.status_code == 404
                assert (
                    await r.get("/mas/v0.1/events", "admin", params={"case": named})
                ).status_code == 200

    asyncio.run(main())


def test_an_admin_route_answers_a_known_secret_403_and_an_unknown_one_401(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with running(tmp_path) as r:
            for path in ("/mas/v0.1/admin/outbox",):
                for who in ROLES:
                    response = await r.get(path, who)
                    want = {"admin": 200, "unknown": 401, "none": 401}.get(who, 403)
                    assert response.status_code == want, (path, who, response.text)
                    if want == 403:
                        assert response.json()["error"] == "forbidden"
                        assert "not the admin secret" in response.json()["detail"]
                        assert "www-authenticate" not in response.headers
            token = r.tokens["crm"]
            erase = await r.http.post(
                key_path("case=c-1@help.example") + "/erase",
                headers={"Authorization": f"Bearer {token}"},
            )
            assert erase.status_code == 403, erase.text

    asyncio.run(main())


async def streamed_events(r: Readers, who: str, after: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` events ``who``'s Server-Sent Events stream gives after ``after``."""
    found: list[dict[str, Any]] = []
    headers = {"Accept": "text/event-stream", "Authorization": f"Bearer {r.tokens[who]}"}
    params = {"after": after}
    async with r.http.stream("GET", "/mas/v0.1/events", headers=headers, params=params) as s:
        async for line in s.aiter_lines():
            if line.startswith("data: "):
                found.append(json.loads(line[len("data: ") :]))
            if len(found) == count:
                break
    return found


def test_a_masters_poll_and_stream_are_one_feed_erasures_included(tmp_path: Path) -> None:
    """From one cursor, a master's poll (at once and held) and its stream (live when the
    erase comes, and started after it) give the same events, its own case's
    ``case.erased`` among them, and the other master's not."""

    async def main() -> None:
        async with running(tmp_path) as r:
            await setup_store(r)
            start = (await r.get("/mas/v0.1/events", "admin", params={"limit": 1000})).json()
            cursor = start["next"]
            live = asyncio.create_task(streamed_events(r, "crm", cursor, 1))
            await asyncio.sleep(0.5)  # the stream is open, following the tail
            admin = {"Authorization": f"Bearer {r.tokens['admin']}"}
            for key in ("case=c-1@help.example", "order=o-1@help.example"):
                erased = await r.http.post(key_path(key) + "/erase", headers=admin)
                assert erased.status_code == 200, erased.text
            everything = (await r.get("/mas/v0.1/events", "admin", params={"after": cursor})).json()
            assert [e["entry"]["kind"] for e in everything["events"]] == ["case.erased"] * 2
            polled = (await r.get("/mas/v0.1/events", "crm", params={"after": cursor})).json()
            held = await r.get("/mas/v0.1/events", "crm", params={"after": cursor, "wait": 1})
            replayed = await streamed_events(r, "crm", cursor, 1)
            streamed = await asyncio.wait_for(live, 30)
            mine = [e for e in everything["events"] if e["case"]["key"].startswith("case=")]
            assert len(mine) == 1
            assert polled["events"] == mine, polled
            assert held.json()["events"] == mine
            assert streamed == mine
            assert replayed == mine

    asyncio.run(main())
