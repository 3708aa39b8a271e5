"""masd over MCP (docs/protocol.md §23), driven by the SDK's own client over streamable HTTP
against a real masd on loopback: who is shown which tools, each tool, the refusals.

Waits are bounded polls; no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from support.masd_process import WAIT
from support.mcp import body, mcp_world, session

READS = {"list_cases", "read_case", "read_message", "read_attachment", "wait_events"}
MASTER_ACTS = {"assign_case", "send_mail", "set_policy"}


async def tool_names(url: str, secret: str) -> set[str]:
    async with session(url, secret) as client:
        return {t.name for t in (await client.list_tools()).tools}


@pytest.mark.slow
def test_each_caller_is_shown_its_own_tools(tmp_path: Path) -> None:
    async def main() -> None:
        async with mcp_world(tmp_path) as w:
            t = w.tokens
            assert await tool_names(w.mcp_url, t["admin"]) == READS
            assert await tool_names(w.mcp_url, t["crm"]) == READS | MASTER_ACTS
            assert await tool_names(w.mcp_url, t["other"]) == READS | MASTER_ACTS
            assert await tool_names(w.mcp_url, t["callback"]) == {"post_status"}
            assert await tool_names(w.mcp_url, t["transfer"]) == {"post_status"}
            for secret in ("nobody-" + "x" * 20, None):
                headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
                async with httpx.AsyncClient() as http:
                    got = await http.post(w.mcp_url, json={}, headers=headers)
                assert got.status_code == 401, got.text
                assert got.json()["error"] == "unauthenticated"
                assert got.headers["www-authenticate"] == 'Bearer realm="masd"'
            async with httpx.AsyncClient() as http:
                huge = await http.post(
                    w.mcp_url,
                    content=b"[" + b" " * (1024 * 1024) + b"]",
                    headers={
                        "Authorization": f"Bearer {t['crm']}",
                        "Content-Type": "application/json",
                    },
                )
                assert huge.status_code == 413, huge.text
                assert huge.json()["error"] == "too-large"
                elsewhere = await http.post(
                    w.mcp_url.replace("/mcp", "/other"),
                    json={},
                    headers={"Authorization": f"Bearer {t['crm']}"},
                )
                assert (elsewhere.status_code, elsewhere.json()["error"]) == (404, "not-found")
            for tool in ("post_status", "send_mail"):
                async with session(w.mcp_url, t["admin"]) as client:
                    refused = await client.call_tool(tool, {})
                assert refused.is_error
                assert body(refused)["error"] == "forbidden"

    asyncio.run(main())


async def http_get(w: Any, path: str, secret: str) -> dict[str, Any]:
    """The read side's answer to ``path`` over HTTP, for the same secret."""
    async with httpx.AsyncClient(base_url=w.http_url) as http:
        got = await http.get(path, headers={"Authorization": f"Bearer {secret}"})
    found: dict[str, Any] = got.json()
    return found


def refusal(result: Any) -> tuple[str, str]:
    assert result.is_error, result
    found = body(result)
    assert found["ok"] is False
    return found["error"], found["detail"]


@pytest.mark.slow
def test_reading_tools_show_what_the_read_side_shows_and_refuse_as_it_does(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with mcp_world(tmp_path) as w:
            t = w.tokens
            small, large = b"\x00small" * 10, bytes(range(256)) * 2100  # 537,600 bytes
            intake = await w.intake(
                subject="Invoice", body="Where is my invoice?\n", files=(small, large)
            )
            ref = intake["event"]["message_ref"]
            async with session(w.mcp_url, t["crm"]) as crm:
                assigned = await crm.call_tool(
                    "assign_case", {"intake_ref": intake["intake_ref"], "resource_id": "inv-1"}
                )
                assert not assigned.is_error, assigned
                key = "case=inv-1@help.example"
                listed = body(await crm.call_tool("list_cases", {}))
                assert [c["key"] for c in listed["cases"]] == [key]
                assert listed == await http_get(w, "/mas/v0.1/cases", t["crm"])
                case = body(await crm.call_tool("read_case", {"key": key}))
                http_case = await http_get(w, f"/mas/v0.1/cases/{quote(key, safe='')}", t["crm"])
                assert case["case"] == http_case["case"]
                kinds = [e["kind"] for e in case["thread"]["entries"]]
                assert "mail.in" in kinds, kinds
                message = body(await crm.call_tool("read_message", {"message_ref": ref}))
                assert message == await http_get(w, f"/mas/v0.1/messages/{ref}", t["crm"])
                event = message["message"]["event"]
                assert "Where is my invoice?" in event["text"]
                assert [a["size"] for a in event["attachments"]] == [len(small), len(large)]

                inline = await crm.call_tool("read_attachment", {"message_ref": ref, "n": 0})
                assert not inline.is_error, inline
                embedded = inline.content[1]
                assert embedded.type == "resource"
                assert base64.b64decode(embedded.resource.blob) == small
                linked = await crm.call_tool("read_attachment", {"message_ref": ref, "n": 1})
                link = linked.content[1]
                assert link.type == "resource_link"
                assert link.uri.endswith(f"/mas/v0.1/messages/{ref}/attachments/1")
                assert body(linked)["inline"] is False
                none = await crm.call_tool("read_attachment", {"message_ref": ref, "n": 2})
                http_none = await http_get(w, f"/mas/v0.1/messages/{ref}/attachments/2", t["crm"])
                assert refusal(none) == (http_none["error"], http_none["detail"])
                assert refusal(none) == (
                    "unknown-message",
                    f"n: message {ref} has 2 attachments, no 2",
                )

                events = body(await crm.call_tool("wait_events", {}))
                assert events["count"] == len(events["events"]) > 0
                assert {e["case"]["key"] for e in events["events"]} == {key}
                after = body(
                    await crm.call_tool("wait_events", {"after": events["next"], "wait": 1})
                )
                assert (after["count"], after["next"]) == (0, events["next"])
                too_long = await crm.call_tool("wait_events", {"wait": 31})
                assert refusal(too_long) == (
                    "invalid-message",
                    'wait: "31" is not an integer from 0 to 30',
                )
                bad_cursor = await crm.call_tool("list_cases", {"after": "nope"})
                assert refusal(bad_cursor)[0] == "invalid-message"

            # What another master may not see: the read side's answer, word for word.
            async with session(w.mcp_url, t["other"]) as other:
                assert body(await other.call_tool("list_cases", {}))["cases"] == []
                http_refused = await http_get(
                    w, f"/mas/v0.1/cases/{quote(key, safe='')}", t["other"]
                )
                got = refusal(await other.call_tool("read_case", {"key": key}))
                assert got == (http_refused["error"], http_refused["detail"])
                assert got == ("unknown-case", f"key: no case {key}")  # as if there were none
                http_refused = await http_get(w, f"/mas/v0.1/messages/{ref}", t["other"])
                got = refusal(await other.call_tool("read_message", {"message_ref": ref}))
                assert got == (http_refused["error"], http_refused["detail"])
                assert got == ("unknown-message", f"message_ref: no message {ref}")
                got = refusal(await other.call_tool("wait_events", {"case": "inv-1"}))
                assert got == ("unknown-case", "case: no case inv-1")
                events = body(await other.call_tool("wait_events", {}))
                assert events["events"] == []
                unknown = await other.call_tool("read_case", {"key": "case=nope@help.example"})
                assert refusal(unknown) == ("unknown-case", "key: no case case=nope@help.example")

            async with session(w.mcp_url, t["admin"]) as admin:
                listed = body(await admin.call_tool("list_cases", {}))
                assert [c["key"] for c in listed["cases"]] == [key]

    asyncio.run(main())


async def http_post(w: Any, message: dict[str, Any], secret: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=w.http_url) as http:
        got = await http.post(
            "/mas/v0.1/messages", json=message, headers={"Authorization": f"Bearer {secret}"}
        )
    found: dict[str, Any] = got.json()
    return found


async def mails_out(client: Any, key: str) -> int:
    """The mail.out entries of the case's thread: one per mail masd queued."""
    case = body(await client.call_tool("read_case", {"key": key}))
    return [e["kind"] for e in case["thread"]["entries"]].count("mail.out")


@pytest.mark.slow
def test_acting_tools_take_the_posts_path(tmp_path: Path) -> None:
    async def main() -> None:
        async with mcp_world(tmp_path) as w:
            t = w.tokens
            intake = await w.intake(subject="Refund", body="I want my money back.\n")
            ref = intake["event"]["message_ref"]
            case = {"address": "case=r-1@help.example", "key": "case=r-1@help.example"}
            async with session(w.mcp_url, t["crm"]) as crm:
                assign = {"intake_ref": intake["intake_ref"], "resource_id": "r-1"}
                first = await crm.call_tool("assign_case", assign)
                assert not first.is_error, first
                again = await crm.call_tool("assign_case", assign)  # the same id: one answer
                assert body(again) == body(first)
                other_id = {**assign, "resource_id": "r-2", "id": "assign-2"}
                assert refusal(await crm.call_tool("assign_case", other_id))[0] in (
                    "already-assigned",
                    "wrong-state",
                )
                outs = await mails_out(crm, case["key"])

                reply = {"case": case, "in_reply_to": ref, "body": "Your refund is on its way.\n"}
                sent = await crm.call_tool("send_mail", reply)
                assert not sent.is_error, sent
                assert body(sent)["ok"] is True
                repeated = await crm.call_tool("send_mail", reply)
                assert body(repeated) == body(sent)
                assert await mails_out(crm, case["key"]) == outs + 1
                named = await crm.call_tool("send_mail", {**reply, "id": "reply-2"})
                named_again = await crm.call_tool("send_mail", {**reply, "id": "reply-2"})
                assert body(named_again) == body(named)
                assert await mails_out(crm, case["key"]) == outs + 2
                mails = await w.sink.wait_for(outs + 2, WAIT)
                texts = [m.message.get_body(("plain",)).get_content() for m in mails]
                assert sum("Your refund is on its way." in text for text in texts) == 2

                policy = await crm.call_tool("set_policy", {"case": case, "autonomous_send": False})
                assert not policy.is_error, policy

                # Refusals name the contract's code and detail, as the POST's answer does.
                unknown = {
                    "case": {"address": "case=zz@help.example", "key": "case=zz@help.example"}
                }
                bad_reply = {**reply, **unknown, "id": "reply-zz"}
                got = refusal(await crm.call_tool("send_mail", bad_reply))
                posted = await http_post(
                    w,
                    {"mas_modes_version": "0.1", "type": "mail.send", **bad_reply},
                    t["crm"],
                )
                assert got == (posted["error"], posted["detail"])
                assert got[0] == "unknown-case"
                long = await crm.call_tool("send_mail", {**reply, "body": "x" * 200_001})
                assert refusal(long) == ("invalid-message", "body: 200001 characters, over 200000")
                huge = await crm.call_tool("send_mail", {**reply, "body": "x" * 300_000})
                assert refusal(huge)[0] == "too-large"

            async with session(w.mcp_url, t["other"]) as other:
                foreign = await other.call_tool("send_mail", {**reply, "id": "other-1"})
                assert refusal(foreign)[0] == "forbidden"

            # A mode endpoint reports on the handoff masd sent it.
            await w.mail(
                "ticket!callback@help.example", subject="Call me", body="Phone: +1 555 0100\n"
            )
            (request,) = await w.endpoint.wait_for(1, WAIT)
            handoff = request.json
            status = {"case": handoff["case"], "handoff_id": handoff["handoff_id"]}
            async with session(w.mcp_url, t["callback"]) as mode:
                ok = await mode.call_tool(
                    "post_status", {**status, "seq": 1, "status": "scheduled"}
                )
                assert body(ok) == {"ok": True}
                stale = await mode.call_tool(
                    "post_status", {**status, "seq": 1, "status": "running"}
                )
                assert not stale.is_error
                assert body(stale) == {"ok": True, "ignored": "stale"}
                bad = await mode.call_tool("post_status", {**status, "seq": 2, "status": "asleep"})
                assert refusal(bad) == (
                    "invalid-message",
                    'status: "asleep" is not a status of docs/protocol.md §14',
                )
                other_case = {**status, "handoff_id": "h" * 32, "seq": 3, "status": "running"}
                assert refusal(await mode.call_tool("post_status", other_case))[0] in (
                    "unknown-handoff",
                    "forbidden",
                )
                assert refusal(await mode.call_tool("send_mail", reply))[0] == "forbidden"

    asyncio.run(main())


@pytest.mark.slow
def test_the_listener_holds_the_http_listeners_connection_cap(tmp_path: Path) -> None:
    async def main() -> None:
        async with mcp_world(tmp_path, max_http_connections=3) as w:
            held = [await asyncio.open_connection("127.0.0.1", w.mcp_port) for _ in range(3)]
            reader, writer = await asyncio.open_connection("127.0.0.1", w.mcp_port)
            answer = await asyncio.wait_for(reader.read(), WAIT)
            assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
            assert b'"error": "unavailable"' in answer
            assert b"server.max_http_connections" in answer
            writer.close()
            for _, each in held:
                each.close()

            # Room again once they are closed: the SDK's client is answered.
            async def names() -> set[str]:
                return await tool_names(w.mcp_url, w.tokens["crm"])

            await wait_until_answered(names)

    asyncio.run(main())


async def wait_until_answered(names: Any) -> None:
    for _ in range(100):
        try:
            assert "send_mail" in await names()
            return
        except Exception:
            await asyncio.sleep(0.1)
    assert "send_mail" in await names()
