"""The console's sign-in under attack, against the running HTTP edge on loopback: wrong
secrets from one address are throttled with a growing wait (429 with Retry-After, the
secret not compared) while other addresses and other routes go on at once, logged once per
address per interval; an admin secret too short for the console is refused at check-config
and at start; every answer under /console/, errors included, carries the console's
headers."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from support.http import ADMIN, Running, serving

from masd.cli import main
from masd.clock import TestClock
from masd.config import ConfigErrors, load_config
from masd.config.server import CONSOLE_SECRET_MIN
from masd.console import throttle
from masd.console.throttle import FREE, SignInThrottle, client_of, delay_after
from masd.edges.http.console import SECURITY_HEADERS

THROTTLED = "console sign-in throttled remote="
#: Wrong secrets sent at once (one client's pool; more only cost the test time).
FLOOD = 100


def console_on(text: str) -> str:
    return text.replace("[server]\n", "[server]\nconsole = true\n", 1)


def guarded(response: httpx.Response) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, (response.request.url, name)


def other_address(r: Running, local: str) -> httpx.AsyncClient:
    """A client of the same edge whose connections come from loopback address ``local``."""
    transport = httpx.AsyncHTTPTransport(local_address=local)
    return httpx.AsyncClient(base_url=r.client.base_url, transport=transport, timeout=10)


async def try_secret(client: httpx.AsyncClient, secret: str) -> httpx.Response:
    return await client.post("/console/sign-in", data={"secret": secret})


def throttled_lines(caplog: pytest.LogCaptureFixture, remote: str) -> list[str]:
    return [m for m in caplog.messages if m.startswith(THROTTLED + remote + " ")]


def test_a_flood_of_wrong_secrets_is_throttled_per_address(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """FLOOD wrong secrets sent at once from 127.0.0.1: FREE are compared, the rest answered
    429 unread; the right secret is refused too while the wait lasts; meanwhile 127.0.0.2
    signs in and /healthz answers; one log line for the flood, not one per try."""
    clock = TestClock()
    caplog.set_level(logging.INFO, logger="masd.http")

    async def main() -> None:
        async with serving(tmp_path, adjust=console_on, clock=clock) as r:
            async with other_address(r, "127.0.0.2") as other:

                async def meanwhile() -> tuple[httpx.Response, httpx.Response]:
                    await asyncio.sleep(0.05)  # once the flood is under way
                    return await try_secret(other, ADMIN), await other.get("/healthz")

                flood = [try_secret(r.client, f"guess-{n:03}") for n in range(FLOOD)]
                *answers, (signed, health) = await asyncio.gather(*flood, meanwhile())
            statuses = [a.status_code for a in answers]
            assert statuses.count(401) == FREE, statuses
            assert statuses.count(429) == FLOOD - FREE, statuses
            for answer in answers:
                guarded(answer)
                if answer.status_code == 429:
                    assert answer.headers["retry-after"] == "1"
                    assert "Too many wrong secrets from your address" in answer.text
            last_compared = [a for a in answers if a.status_code == 401][-1]
            assert last_compared.headers["retry-after"] == "1"
            assert "Wait 1 second before trying again" in last_compared.text
            # Another address and another route were not held up.
            assert (signed.status_code, signed.headers["location"]) == (303, "/console/cases")
            assert health.status_code == 200
            # The right secret is not compared either while the wait lasts.
            assert (await try_secret(r.client, ADMIN)).status_code == 429
            assert len(throttled_lines(caplog, "127.0.0.1")) == 1, caplog.messages
            assert throttled_lines(caplog, "127.0.0.2") == []
            # The wait over, one more wrong try doubles it; the next log line counts
            # the tries refused since the first.
            clock.advance(1.0)
            again = await try_secret(r.client, "guess-again")
            assert (again.status_code, again.headers["retry-after"]) == (401, "2")
            assert (await try_secret(r.client, ADMIN)).headers["retry-after"] == "2"
            assert len(throttled_lines(caplog, "127.0.0.1")) == 1  # within the interval
            clock.advance(throttle.LOG_EVERY)
            late = await try_secret(r.client, "guess-late")
            assert (late.status_code, late.headers["retry-after"]) == (401, "4")
            lines = throttled_lines(caplog, "127.0.0.1")
            assert len(lines) == 2, lines
            said = f"failures=7 retry_after=4 refused_since={FLOOD - FREE + 2}"
            assert said in lines[1], lines
            # After the wait the right secret signs in and the failures are forgotten.
            clock.advance(4.0)
            signed = await try_secret(r.client, ADMIN)
            assert signed.status_code == 303, signed.text
            r.client.cookies.clear()
            assert (await try_secret(r.client, "one-slip")).status_code == 401
            assert "retry-after" not in (await try_secret(r.client, "two-slips")).headers

    asyncio.run(main())


def test_the_wait_grows_is_capped_forgotten_and_bounded() -> None:
    assert [delay_after(n) for n in range(FREE)] == [0.0] * FREE
    assert [delay_after(FREE + k) for k in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert delay_after(FREE + 40) == throttle.LONGEST_DELAY
    assert delay_after(10**6) == throttle.LONGEST_DELAY
    held = SignInThrottle(max_clients=3)
    for _ in range(FREE):
        held.failed("198.51.100.7", 1000.0)
    waiting = held.refuse("198.51.100.7", 1000.5)
    assert waiting is not None
    assert waiting.retry_after == 1
    assert held.refuse("198.51.100.7", 1001.0) is None  # the wait is over
    assert held.refuse("198.51.100.8", 1000.5) is None  # another client
    # FORGET seconds without a wrong try start afresh: the next wrong one is free again.
    assert held.failed("198.51.100.7", 1001.0 + throttle.FORGET) is None
    # A flood from many addresses keeps at most max_clients; the oldest make room.
    for n in range(10):
        held.failed(f"203.0.113.{n}", 5000.0 + n)
    assert len(held) == 3


def test_a_client_is_its_address_and_an_ipv6_one_its_64() -> None:
    assert client_of("192.0.2.1") == "192.0.2.1"
    assert client_of("::ffff:192.0.2.1") == "192.0.2.1"
    assert client_of("2001:db8:1:2:aaaa::1") == client_of("2001:db8:1:2:bbbb::2")
    assert client_of("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert client_of("2001:db8:1:3::1") != client_of("2001:db8:1:2::1")
    assert client_of(None) == client_of("") == "local"


# ----------------------------------------------------------------- the secret's length


def short_secret_config(tmp_path: Path, secret: str, *, console: bool = True) -> Path:
    (tmp_path / "admin.token").write_text(secret + "\n")
    (tmp_path / "admin.token").chmod(0o600)
    text = (
        '[server]\ndatabase = "masd.db"\nadmin_token_file = "admin.token"\n\n'
        '[domains."help.example".types.ticket]\nrole = "master"\n'
    )
    path = tmp_path / "masd.toml"
    path.write_text(console_on(text) if console else text)
    return path


def test_an_admin_secret_too_short_for_the_console_is_refused(tmp_path: Path) -> None:
    path = short_secret_config(tmp_path, "ab")
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    said = str(caught.value)
    assert "server.admin_token_file: the admin secret is 2 characters" in said, said
    assert f"must be at least {CONSOLE_SECRET_MIN}" in said
    # One short of the bound is refused; the bound itself is taken.
    with pytest.raises(ConfigErrors, match="is 31 characters"):
        load_config(short_secret_config(tmp_path, "x" * (CONSOLE_SECRET_MIN - 1)))
    assert load_config(short_secret_config(tmp_path, "y" * CONSOLE_SECRET_MIN)).server.console
    # Without the console a short secret is the operator's choice (the API has no form).
    assert not load_config(short_secret_config(tmp_path, "ab", console=False)).server.console


def test_check_config_and_serve_refuse_a_short_secret_with_the_console_on(tmp_path: Path) -> None:
    path = short_secret_config(tmp_path, "ab")
    for command in (["check-config", "--config", str(path)], ["serve", "--config", str(path)]):
        done = CliRunner().invoke(main, command)
        assert done.exit_code == 1, (command, done.output)
        assert done.stderr.startswith("server.admin_token_file: the admin secret is 2 characters")
        assert f"masd: 1 error in {path}" in done.stderr
        assert done.exception is None or isinstance(done.exception, SystemExit)


# ----------------------------------------------------------------- headers on every answer


def test_every_console_answer_carries_the_console_headers_errors_too(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path, adjust=console_on) as r:
            for method, path in (
                ("GET", "/console/nope"),
                ("GET", "/console/static/nope.css"),
                ("DELETE", "/console/cases"),
                ("PUT", "/console/sign-in"),
                ("GET", "/console/cases/x/y/z"),
            ):
                answer = await r.client.request(method, path)
                assert answer.status_code in (404, 405), (path, answer.status_code)
                guarded(answer)
            too_big = await r.client.post(
                "/console/sign-in",
                content=b"secret=" + b"x" * 300_000,
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            assert too_big.status_code == 413
            guarded(too_big)
            # Outside the console nothing changes.
            other = await r.client.get("/nope")
            assert other.status_code == 404
            assert "content-security-policy" not in other.headers

    asyncio.run(main())
