"""``masd mcp`` over stdio (docs/protocol.md §23): the SDK's stdio client runs it as a child
process beside a running masd; without its token file it refuses, naming the file.

Waits are bounded polls; no test asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

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

    asyncio.run(main())


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
