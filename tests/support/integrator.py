"""The integrator examples of docs/protocol.md §21, taken from the Markdown and run as written.

``example`` finds the one Python block of a section; ``running`` writes it to a file and runs it
with the system's Python as a child process, configured by its environment only, until it
accepts connections on its port.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from masd.testing.process import ChildProcess

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
MODE_EXAMPLE = "21.2 Writing a mode endpoint"
MASTER_EXAMPLE = "21.3 Writing a master"


def example(heading: str) -> str:
    """The Python block of the section ``heading`` of docs/protocol.md."""
    start = DOC.index(f"### {heading}\n")
    ends = [i for i in (DOC.find("\n## ", start), DOC.find("\n### ", start + 4)) if i > 0]
    section = DOC[start : min(ends, default=len(DOC))]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, re.M | re.S)
    assert len(blocks) == 1, heading
    return str(blocks[0])


@asynccontextmanager
async def running(
    tmp_path: Path, code: str, env: dict[str, str], port: int
) -> AsyncIterator[ChildProcess]:
    """The example ``code`` as a child process, once it accepts connections on ``port``."""
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    child = ChildProcess(
        [sys.executable, str(script)], log=tmp_path / "example.log", env={"PATH": "/usr/bin", **env}
    )
    child.spawn()
    try:

        async def listening() -> bool:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                assert child.running, child.log()
                return False
            writer.close()
            return True

        for _ in range(200):
            if await listening():
                break
            await asyncio.sleep(0.05)
        yield child
    finally:
        await child.stop()
