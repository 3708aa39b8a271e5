"""RLIMIT_NOFILE and the connection caps (masd.edges.descriptors): the soft limit is
raised as far as the caps need; a hard limit below that is a named refusal to start."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from support.hostile import limited, open_files, write_hostile_config
from support.masd_process import MasdProcess

from masd.config import load_config
from masd.edges import descriptors
from masd.edges.descriptors import MARGIN, need

_SET_AND_EXEC = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


def test_the_need_is_the_caps_of_the_listeners_run_and_the_margin(tmp_path: Path) -> None:
    h = write_hostile_config(tmp_path, cap=7, endpoint_url="http://127.0.0.1:9/", smtp_port=25)
    server = load_config(h.config).server
    assert need(server, ["lmtp", "http"]).total == 14 + MARGIN
    both = need(server, ["lmtp", "http", "policy", "milter"])
    assert both.total == 28 + MARGIN
    assert str(both) == (
        "server.max_lmtp_sessions 7 + server.max_http_connections 7 + "
        f"server.max_policy_connections 7 + server.max_milter_connections 7 + {MARGIN} for the "
        "store, peers and relay"
    )


def test_a_hard_limit_under_the_caps_is_a_named_refusal(tmp_path: Path) -> None:
    h = write_hostile_config(tmp_path, cap=100, endpoint_url="http://127.0.0.1:9/", smtp_port=25)
    masd = str(Path(sys.executable).with_name("masd"))
    argv = [sys.executable, "-c", _SET_AND_EXEC, "300", "300", masd, "serve", "--config"]
    done = subprocess.run(
        [*argv, str(h.config)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1, done.stderr
    total = 4 * 100 + MARGIN
    assert done.stderr.splitlines() == [
        f"masd: descriptor-limit: the limit on open files (RLIMIT_NOFILE) is 300, under the "
        f"{total} the connection caps need (server.max_lmtp_sessions 100 + "
        "server.max_http_connections 100 + server.max_policy_connections 100 + "
        f"server.max_milter_connections 100 + {MARGIN} for the store, peers and relay); "
        "raise LimitNOFILE= (ulimit -n) or lower the caps"
    ]
    assert not (tmp_path / "masd.db").exists()  # refused before the store was opened


def test_the_soft_limit_is_raised_as_far_as_the_caps_need(tmp_path: Path) -> None:
    h = write_hostile_config(tmp_path, cap=30, endpoint_url="http://127.0.0.1:9/", smtp_port=25)

    async def main() -> None:
        async with limited(MasdProcess(h.config, tmp_path / "masd.log"), 200, 5000) as masd:
            assert masd.proc is not None
            assert open_files(masd.proc.pid) == (4 * 30 + MARGIN, 5000)
            assert "open files: soft limit raised from 200 to 376" in masd.log()

    asyncio.run(main())


def test_a_soft_limit_high_enough_is_left_alone() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert descriptors.ensure(descriptors.Need((("x", 1),), margin=1)) == soft
