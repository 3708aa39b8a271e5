"""``masd reload`` and SIGHUP over a running masd (docs/operations.md §2, "Reload").

masd runs as a real process.  An LMTP session opened before the reload stays
open across it and, on the same connection, a domain added by a new file in
``domains.d`` accepts mail after it.  A broken file is refused by name, and
the configuration before it keeps serving; so is a changed listener.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.masd_process import WAIT, MasdProcess, mx_mail, wait_until, write_master_config

from masd.cli import main
from masd.config import Config, ConfigErrors, parse_config
from masd.config.reload import restart_needed
from masd.service import Runtime
from masd.service.runtime import Job
from masd.testing import lmtpclient
from masd.testing.peers import FakePeer, SmtpSink

ANN = "ann@example.org"
NEW = "shop.example"
NEW_FILE = '[types.order]\nrole = "master"\nmodes = ["callback"]\nacknowledge = false\n'


def reload_cli(pid_file: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "masd", "reload", "--pid-file", str(pid_file)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def reload(pid_file: Path) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(reload_cli, pid_file)


def test_reload_applies_a_new_domain_file_and_refuses_a_broken_one(tmp_path: Path) -> None:
    asyncio.run(_reload(tmp_path))


async def _reload(tmp_path: Path) -> None:
    async with FakePeer() as endpoint, SmtpSink() as sink:
        setup = write_master_config(
            tmp_path / "masd", endpoint_url=endpoint.url + "mas", smtp_port=sink.port
        )
        folder = setup.config.parent / "domains.d"
        folder.mkdir()
        pid_file = tmp_path / "masd.pid"
        lmtp = ("127.0.0.1", setup.lmtp_port)
        async with (
            MasdProcess(
                setup.config, tmp_path / "masd.log", args=["--pid-file", str(pid_file)]
            ) as masd,
            await lmtpclient.LmtpConnection.open(lmtp, timeout=WAIT) as held,
        ):
            rcpt = f"order@{NEW}"
            _, data = mx_mail(ANN, rcpt, body="hello\n")
            before = await held.send(ANN, [rcpt], data)
            assert before.codes == (550,), before  # 5.1.2: not a domain of ours yet

            (folder / f"{NEW}.toml").write_text(NEW_FILE)
            applied = await reload(pid_file)
            assert applied.returncode == 0, applied
            assert f"domains help.example, {NEW}" in applied.stdout

            # The session opened before the reload is still there, and sees the new domain.
            after = await held.send(ANN, [rcpt], data)
            assert after.codes == (250,), after

            # A broken file: refused by name, the running configuration kept.
            (folder / f"{NEW}.toml").write_text('[types.order]\nrole = "boss"\n')
            refused = await reload(pid_file)
            assert refused.returncode == 1, refused
            assert "reload refused" in refused.stderr
            assert f'{folder / NEW}.toml: domains."{NEW}".types.order.role' in refused.stderr
            again = await held.send(ANN, [f"order@{NEW}"], mx_mail(ANN, rcpt, body="2\n")[1])
            assert again.codes == (250,), again

            # A changed listener needs a restart: refused, by name, on SIGHUP too.
            (folder / f"{NEW}.toml").write_text(NEW_FILE)
            text = setup.config.read_text()
            setup.config.write_text(text.replace(f":{setup.lmtp_port}", ":1"))
            os.kill(int(pid_file.read_text()), signal.SIGHUP)
            log = tmp_path / "masd.log"
            refusal = "server.lmtp changed: restart masd to apply"
            await wait_until(lambda: refusal in log.read_text(), "the listener refusal logged")
            fresh = await lmtpclient.deliver(lmtp, ANN, [rcpt], data, timeout=WAIT)
            assert fresh.codes == (250,), fresh
            await held.close()
            assert await masd.terminate() == 0
        assert not pid_file.exists()


def test_reload_without_a_running_masd_says_so(tmp_path: Path) -> None:
    done = reload_cli(tmp_path / "masd.pid")
    assert done.returncode == 2, done
    assert f"cannot read {tmp_path / 'masd.pid'}" in done.stderr
    assert "is masd running?" in done.stderr


def test_a_job_keeps_the_configuration_it_started_with(tmp_path: Path) -> None:
    """Runtime.replace_config reaches the next input; a Job holds the one of its start."""

    def config(domain: str) -> Config:
        server = {"lmtp": "127.0.0.1:2424", "http": "127.0.0.1:8025"}
        domains = {domain: {"types": {"ticket": {"role": "master"}}}}
        return parse_config({"server": server, "domains": domains}, base_dir=tmp_path)

    rt = Runtime(config("help.example"), lambda: "id")
    job = Job(rt, tx=None, now=0.0)  # type: ignore[arg-type]  # no store job: only the runtime
    rt.replace_config(config("shop.example"))
    assert list(rt.config.domains) == ["shop.example"]
    assert rt.type_view("shop.example", "ticket").role == "master"
    assert list(job.rt.config.domains) == ["help.example"]
    assert job.rt.type_view("help.example", "ticket").role == "master"


@pytest.mark.slow
def test_reload_finds_masd_by_the_pid_file_its_config_names(tmp_path: Path) -> None:
    """``server.pid_file``: masd serve writes it without --pid-file, and masd reload
    --config reads it; a relative path is relative to the configuration's directory."""

    async def main() -> None:
        async with FakePeer() as endpoint, SmtpSink() as sink:
            setup = write_master_config(
                tmp_path / "masd", endpoint_url=endpoint.url + "mas", smtp_port=sink.port
            )
            text = setup.config.read_text()
            setup.config.write_text(
                text.replace("[server]\n", '[server]\npid_file = "run/masd.pid"\n', 1)
            )
            (setup.config.parent / "run").mkdir()
            pid_file = setup.config.parent / "run" / "masd.pid"
            command = [sys.executable, "-m", "masd", "reload", "--config", str(setup.config)]
            async with MasdProcess(setup.config, tmp_path / "masd.log") as masd:
                await wait_until(pid_file.exists, "the pid file written")
                done = await asyncio.to_thread(
                    subprocess.run, command, capture_output=True, text=True, timeout=60
                )
                assert done.returncode == 0, done
                assert "domains help.example" in done.stdout
                # --pid-file still wins over the configuration's.
                elsewhere = [*command, "--pid-file", str(tmp_path / "none.pid")]
                missed = await asyncio.to_thread(
                    subprocess.run, elsewhere, capture_output=True, text=True, timeout=60
                )
                assert missed.returncode == 2, missed
                assert f"cannot read {tmp_path / 'none.pid'}" in missed.stderr
                assert "--pid-file FILE or server.pid_file" in missed.stderr
                assert await masd.terminate() == 0
            assert not pid_file.exists()

    asyncio.run(main())


def test_reload_says_what_is_wrong_with_the_config_it_was_given(tmp_path: Path) -> None:
    broken = tmp_path / "masd.toml"
    broken.write_text("[server]\npid_file = 7\n")
    done = CliRunner().invoke(main, ["reload", "--config", str(broken)])
    assert done.exit_code == 2, done.output
    assert "server.pid_file: 7 is not" in done.stderr, done.stderr
    assert "give the pid file with --pid-file" in done.stderr
    unparsed = tmp_path / "unparsed.toml"
    unparsed.write_text("[server\n")
    done = CliRunner().invoke(main, ["reload", "--config", str(unparsed)])
    assert done.exit_code == 2, done.output
    assert f"masd reload: {unparsed}:1:8: invalid TOML" in done.stderr, done.stderr


def test_the_pid_file_is_a_path_beside_the_config_and_bound_at_start(tmp_path: Path) -> None:
    def config(**server: str) -> Config:
        table = {"lmtp": "127.0.0.1:2424", "http": "127.0.0.1:8025", **server}
        domains = {"help.example": {"types": {"ticket": {"role": "master"}}}}
        return parse_config({"server": table, "domains": domains}, base_dir=tmp_path)

    assert config().server.pid_file is None
    assert config(pid_file="run/masd.pid").server.pid_file == tmp_path / "run" / "masd.pid"
    assert config(pid_file="/run/masd/masd.pid").server.pid_file == Path("/run/masd/masd.pid")
    with pytest.raises(ConfigErrors, match=r'server\.pid_file: "" is not a file name'):
        config(pid_file="")
    moved = restart_needed(config(pid_file="a.pid"), config(pid_file="b.pid"))
    assert moved == ["server.pid_file changed: restart masd to apply"]
