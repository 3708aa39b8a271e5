"""``masd mcp`` over stdio (docs/protocol.md §23): the SDK's stdio client runs it as a child
process beside a running masd; without its token file it refuses, naming the file.

Waits are bounded polls; no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.masd_process import ROOT, wait_until
from support.mcp import body, mcp_world, stdio_session

from masd.cli.mcp import NO_CALLER
from masd.testing.process import child_env


def masd_mcp(config: Path, token_file: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "masd", "mcp", "--config", str(config)]
    return subprocess.run(
        [*argv, "--token-file", str(token_file)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=child_env(this_masd=True),
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_stdio_serves_the_callers_tools_and_reads(tmp_path: Path) -> None:
    async def main() -> None:
        async with mcp_world(tmp_path) as w:
            intake = await w.intake(subject="Printer on fire", body="It smokes.\n")
            async with stdio_session(w.config, w.token_file("crm")) as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert names == {
                    "list_cases",
                    "read_case",
                    "read_message",
                    "read_attachment",
                    "wait_events",
                    "assign_case",
                    "send_mail",
                    "set_policy",
                }
                ref = intake["event"]["message_ref"]
                read = await client.call_tool("read_message", {"message_ref": ref})
                assert not read.is_error, read
                assert body(read)["message"]["event"]["subject"] == "Printer on fire"
            async with stdio_session(w.config, w.token_file("callback")) as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert names == {"post_status"}
            nobody = tmp_path / "nobody.token"
            nobody.write_text("nobody-" + "y" * 32 + "\n")
            refused = await asyncio.to_thread(masd_mcp, w.config, nobody)
            assert refused.returncode == NO_CALLER
            assert f"--token-file {nobody}: Authorization: the secret matches no peer" in (
                refused.stderr
            )

            # With no masd running, a message is taken on the store itself; it goes out
            # once masd runs again.
            case = {"address": "case=p-1@help.example", "key": "case=p-1@help.example"}
            async with stdio_session(w.config, w.token_file("crm")) as client:
                assign = {"intake_ref": intake["intake_ref"], "resource_id": "p-1"}
                assert not (await client.call_tool("assign_case", assign)).is_error
            assert await w.masd.terminate() == 0
            async with stdio_session(w.config, w.token_file("crm")) as client:
                reply = {"case": case, "in_reply_to": ref, "body": "We sent a new printer.\n"}
                sent = await client.call_tool("send_mail", reply)
                assert not sent.is_error, sent
                thread = body(await client.call_tool("read_case", {"key": case["key"]}))
                assert "mail.out" in [e["kind"] for e in thread["thread"]["entries"]]
            await w.masd.start()
            await wait_until(
                lambda: any(
                    "We sent a new printer." in m.message.get_body().get_content()
                    for m in w.sink.messages
                ),
                "the mail taken while masd was stopped, at the relay",
            )

    asyncio.run(main())


@pytest.mark.slow
def test_stdio_without_its_token_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "masd.toml"
    config.write_text("")  # never read: the token file is looked at first
    missing = masd_mcp(config, tmp_path / "absent.token")
    assert missing.returncode == NO_CALLER == 3
    assert f"--token-file {tmp_path / 'absent.token'}: cannot read it" in missing.stderr
    assert "Traceback" not in missing.stderr
    spaced = tmp_path / "spaced.token"
    spaced.write_text("two words\n")
    refused = masd_mcp(config, spaced)
    assert refused.returncode == NO_CALLER
    assert "not one secret of printable ASCII" in refused.stderr


@pytest.mark.slow
def test_the_guides_agent_answers_a_new_case(tmp_path: Path) -> None:
    """docs/agent.py, as docs/agents.md gives it, works a case end to end."""

    async def main() -> None:
        async with mcp_world(tmp_path) as w:
            intake = await w.intake(subject="Broken login", body="I cannot log in since Monday.\n")
            async with stdio_session(w.config, w.token_file("crm")) as client:
                assign = {"intake_ref": intake["intake_ref"], "resource_id": "login-7"}
                assert not (await client.call_tool("assign_case", assign)).is_error
            agent = await asyncio.create_subprocess_exec(
                sys.executable,
                str(ROOT / "docs" / "agent.py"),
                "--masd",
                str(Path(sys.executable).parent / "masd"),
                "--config",
                str(w.config),
                "--token-file",
                str(w.token_file("crm")),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=child_env(this_masd=True),
            )
            out, err = await asyncio.wait_for(agent.communicate(), 120)
            assert agent.returncode == 0, err.decode()
            ref = intake["event"]["message_ref"]
            assert f"answered {ref} on case=login-7@help.example" in out.decode()
            answer = "Thank you for writing about: I cannot log in since Monday."

            def answered() -> list[Any]:
                return [m for m in w.sink.messages if answer in m.message.get_body().get_content()]

            await wait_until(lambda: bool(answered()), "the agent's answer at the relay")
            (mail,) = answered()
            assert mail.rcpt_tos == ("ann@example.org",)

    asyncio.run(main())


def test_the_guide_shows_the_agent_the_tests_run() -> None:
    guide = (ROOT / "docs" / "agents.md").read_text("utf-8")
    shown = guide.split("<!-- agent:begin -->\n```python\n", 1)[1].split("```\n<!-- agent:end -->")[
        0
    ]
    assert shown == (ROOT / "docs" / "agent.py").read_text("utf-8")
