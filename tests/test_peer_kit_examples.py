"""The peer kit (docs/protocol.md §19.1) against the two integrator examples of §21.

Each example is taken from the Markdown as test_integrator_examples.py takes it, run on a
loopback port with its token file, and checked by ``python -m masd conformance peer``: every
check of its role must pass.  The master example posts to ``MASD_URL``, here the kit's
``--listen`` address, in place of masd's.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from pathlib import Path

from support.integrator import MASTER_EXAMPLE, MODE_EXAMPLE, example, running

from masd.conformance.peer import load_checks
from masd.testing.net import free_ports

CHECKS = Path(__file__).resolve().parent.parent / "conformance" / "peer"


async def kit(role: str, argv: list[str]) -> tuple[int, str]:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "masd",
        "conformance",
        "peer",
        role,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await child.communicate()
    return await child.wait(), out.decode()


def token_file(tmp_path: Path) -> Path:
    token = tmp_path / "peer.token"
    token.write_text(secrets.token_hex(16) + "\n", encoding="utf-8")
    return token


def assert_all_pass(role: str, code: int, output: str) -> None:
    names = sorted(c.name for c in load_checks(CHECKS, role))
    passed = sorted(line.split()[1] for line in output.splitlines() if line.startswith("PASS "))
    assert passed == names, output
    assert output.endswith(f"{len(names)} passed, 0 failed\n"), output
    assert code == 0, output


def test_the_mode_endpoint_example_passes_every_mode_check(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    token = token_file(tmp_path)
    env = {"MODE_PORT": str(port), "MODE_TOKEN_FILE": str(token)}

    async def main() -> tuple[int, str]:
        async with running(tmp_path, example(MODE_EXAMPLE), env, port) as mode:
            argv = ["--target", f"http://127.0.0.1:{port}/mas", "--token-file", str(token)]
            result = await kit("mode", [*argv, "--detail", "phone=+1 555 0100", "--wait", "10"])
            assert mode.running, mode.log()
            return result

    assert_all_pass("mode", *asyncio.run(main()))


def test_the_master_example_passes_every_master_check(tmp_path: Path) -> None:
    port, listen = free_ports(2)
    token = token_file(tmp_path)
    env = {
        "MASTER_PORT": str(port),
        "MASTER_TOKEN_FILE": str(token),
        "MASD_URL": f"http://127.0.0.1:{listen}",
    }

    async def main() -> tuple[int, str]:
        async with running(tmp_path, example(MASTER_EXAMPLE), env, port) as master:
            argv = ["--target", f"http://127.0.0.1:{port}/mas", "--token-file", str(token)]
            argv += ["--listen", f"127.0.0.1:{listen}", "--type", "case", "--wait", "10"]
            result = await kit("master", [*argv, "--domain", "help.example"])
            assert master.running, master.log()
            return result

    assert_all_pass("master", *asyncio.run(main()))
