"""The operator console over HTTP, against the running HTTP edge on loopback: off it is 404;
sign-in with the admin secret only; the session cookie's flags; CSRF on every change; the
security headers on every answer; nothing loaded from outside masd; values escaped."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.http import ADMIN, Running, deliver, serving

from masd.config import ConfigErrors, load_config
from masd.console.sessions import MAX_SESSIONS, Sessions
from masd.edges.http.console import COOKIE, ROUTES, SECURITY_HEADERS

CSP = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
PAGES = ("cases", "outbox", "intakes", "suppressions", "health")


def console_on(text: str) -> str:
    return text.replace("[server]\n", "[server]\nconsole = true\n", 1)


def run(
    tmp_path: Path, body: Callable[[Running], Awaitable[None]], *, on: bool = True, **kw: Any
) -> None:
    async def main() -> None:
        async with serving(tmp_path, adjust=console_on if on else None, **kw) as running:
            await body(running)

    asyncio.run(main())


async def sign_in(client: httpx.AsyncClient, secret: str = ADMIN) -> httpx.Response:
    return await client.post("/console/sign-in", data={"secret": secret})


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page
    return found[1]


def guarded(response: httpx.Response) -> None:
    """The console's headers, on every answer it gives."""
    for name, value in SECURITY_HEADERS.items():
        assert response.headers.get(name) == value, (response.url, name)
    assert response.headers["content-security-policy"] == CSP


#: Any URL in an attribute or a style that does not start with one slash (a path of masd's).
_OUTSIDE = re.compile(
    r"""(?:src|href|action|data-feed)\s*=\s*(?!["']?/[^/])|url\(|//[a-z0-9.-]+[:/]""", re.I
)


def nothing_from_outside(page: str) -> None:
    assert _OUTSIDE.search(page) is None, _OUTSIDE.search(page)


def test_the_console_off_is_not_served(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        assert r.config.server.console is False
        for route in ROUTES:
            path = route.path.replace("{name}", "console.css").replace("{key}", "x")
            path = path.replace("{ref}", "m1").replace("{n}", "0")
            path = re.sub(r"\{id:[^}]*\}\}", "1", path).replace("{what:retry|drop}", "retry")
            answer = await r.client.request(route.method, path)
            assert answer.status_code == 404, (route.path, answer.text)
            assert answer.json()["error"] == "not-found"
        assert "set-cookie" not in (await sign_in(r.client)).headers

    run(tmp_path, body, on=False)


def test_a_wrong_secret_is_refused_and_opens_no_session(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        for secret in ("wrong", "", ADMIN + "x", ADMIN[:-1]):
            refused = await sign_in(r.client, secret)
            assert refused.status_code == 401, secret
            assert "not the admin secret" in refused.text
            assert "set-cookie" not in refused.headers
            guarded(refused)
        assert len(r.client.cookies) == 0
        # Without a session a page sends the browser to sign in; a change is 401.
        page = await r.client.get("/console/cases")
        assert (page.status_code, page.headers["location"]) == (303, "/console/sign-in")
        guarded(page)
        change = await r.client.post("/console/outbox/retry", data={"csrf": "x"})
        assert change.status_code == 401
        guarded(change)
        # A forged cookie is no session either.
        forged = await r.client.get("/console/cases", headers={"Cookie": f"{COOKIE}=forged"})
        assert forged.status_code == 303

    run(tmp_path, body)


def test_the_session_cookie_flags(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        signed = await sign_in(r.client, ADMIN + "\n")  # as pasted from the file
        assert (signed.status_code, signed.headers["location"]) == (303, "/console/cases")
        guarded(signed)
        cookie = signed.headers["set-cookie"]
        flags = [part.strip().lower() for part in cookie.split(";")]
        assert flags[0].startswith(f"{COOKIE}=")
        assert len(flags[0]) > len(COOKIE) + 40
        assert {"httponly", "samesite=strict", "path=/console/"} <= set(flags), cookie
        assert "secure" not in flags  # public_url is http
        assert not any(f.startswith(("expires", "max-age")) for f in flags)  # ends with the browser
        page = await r.client.get("/console/cases")
        assert page.status_code == 200, page.text
        assert ADMIN not in page.text  # the secret is never in a page

    run(tmp_path, body)


def test_the_cookie_is_secure_when_the_public_url_is_https(tmp_path: Path) -> None:
    def https(text: str) -> str:
        return console_on(text).replace('public_url = "http://', 'public_url = "https://')

    async def main() -> None:
        async with serving(tmp_path, adjust=https) as r:
            cookie = (await sign_in(r.client)).headers["set-cookie"]
            assert "secure" in [part.strip().lower() for part in cookie.split(";")], cookie

    asyncio.run(main())


def test_every_page_is_guarded_escaped_and_loads_nothing_from_outside(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        hostile = '<script>alert("x")</script> & "quotes"'
        got = await deliver(
            r.store, r.rt, "ticket!callback@help.example", r.clock.now(), subject=hostile
        )
        sign = await r.client.get("/console/sign-in")
        assert sign.status_code == 200
        assert 'type="password"' in sign.text
        guarded(sign)
        nothing_from_outside(sign.text)
        await sign_in(r.client)
        key = got.case_key
        paths = [f"/console/{p}" for p in PAGES] + [f"/console/cases/{key}"]
        paths += ["/console/cases?state=open&participant=alice%40example.com&domain=help.example"]
        for path in paths:
            page = await r.client.get(path)
            assert page.status_code == 200, (path, page.text)
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            guarded(page)
            nothing_from_outside(page.text)
            assert "<script>alert" not in page.text, path
        timeline = (await r.client.get(f"/console/cases/{key}")).text
        assert (
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &quot;quotes&quot;" in timeline
        )
        assert 'class="entry kind-mail-in"' in timeline
        assert "handoff.request" in timeline
        listed = (await r.client.get("/console/cases?state=open")).text
        assert key in listed
        assert key not in (await r.client.get("/console/cases?state=closed")).text
        assert "No intake is waiting" in (await r.client.get("/console/intakes")).text
        assert "No suppression is recorded" in (await r.client.get("/console/suppressions")).text
        health = (await r.client.get("/console/health")).text
        assert "200 ok" in health
        assert "masd_outbox_depth" in health
        for name, kind in (("console.css", "text/css"), ("console.js", "text/javascript")):
            asset = await r.client.get(f"/console/static/{name}")
            assert asset.status_code == 200
            assert asset.headers["content-type"].startswith(kind)
            guarded(asset)
            # No address of another host, no import, no url(): the script follows its own
            # page's data-feed (checked above) and links to masd's own paths.
            assert "://" not in asset.text
            assert "url(" not in asset.text
            assert "@import" not in asset.text
            assert "import(" not in asset.text
        missing = await r.client.get("/console/cases/ticket=gs-999@help.example")
        assert missing.status_code == 404
        assert "no case" in missing.text
        guarded(missing)
        icon = await r.client.get("/console/static/favicon.svg")
        assert icon.headers["content-type"].startswith("image/svg+xml")
        guarded(icon)
        assert "href" not in icon.text  # an icon of its own: it links to nothing
        unknown = await r.client.get("/console/static/other.js")
        assert unknown.status_code == 404
        assert (await r.client.head("/console/events")).status_code == 200
        assert (await r.client.get(f"/console/cases/{key}?after=x")).status_code == 400
        bad = await r.client.get("/console/cases?state=sideways")
        assert bad.status_code == 400
        assert "state" in bad.text

    run(tmp_path, body)


async def _queue_item(r: Running) -> int:
    await r.open_callback_case()
    listing = await r.client.get(
        "/mas/v0.1/admin/outbox", headers={"Authorization": f"Bearer {ADMIN}"}
    )
    return int(listing.json()["items"][0]["id"])


def test_csrf_missing_or_wrong_is_refused_on_every_change(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        item = await _queue_item(r)
        await sign_in(r.client)
        page = (await r.client.get("/console/outbox")).text
        token = csrf_of(page)
        assert f'action="/console/outbox/{item}/drop"' in page
        changes = [
            f"/console/outbox/{item}/retry",
            f"/console/outbox/{item}/drop",
            "/console/outbox/retry",
            "/console/sign-out",
        ]
        for path in changes:
            for form in ({}, {"csrf": ""}, {"csrf": "wrong"}, {"csrf": token[:-1]}):
                refused = await r.client.post(path, data=form)
                assert refused.status_code == 403, (path, form, refused.text)
                assert "CSRF token" in refused.text
                guarded(refused)
        # Nothing changed: the item still waits, the session still works.
        assert "queued" in (await r.client.get("/console/outbox")).text
        dropped = await r.client.post(f"/console/outbox/{item}/drop", data={"csrf": token})
        assert (dropped.status_code, dropped.headers["location"]) == (303, "/console/outbox")
        after = (await r.client.get("/console/outbox")).text
        assert f"Item {item} dropped (now failed)." in after
        assert f"Item {item} dropped" not in (await r.client.get("/console/outbox")).text
        again = await r.client.post(f"/console/outbox/{item}/drop", data={"csrf": token})
        assert again.status_code == 409
        assert "withdrawn" in again.text
        unknown = await r.client.post("/console/outbox/987654/retry", data={"csrf": token})
        assert unknown.status_code == 404

    run(tmp_path, body)


def test_sign_out_ends_the_session(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        await sign_in(r.client)
        token = csrf_of((await r.client.get("/console/cases")).text)
        cookie = r.client.cookies[COOKIE]
        out = await r.client.post("/console/sign-out", data={"csrf": token})
        assert (out.status_code, out.headers["location"]) == (303, "/console/sign-in")
        assert (
            "Max-Age=0" in out.headers["set-cookie"]
            or "expires" in out.headers["set-cookie"].lower()
        )
        again = await r.client.get("/console/cases", headers={"Cookie": f"{COOKIE}={cookie}"})
        assert (again.status_code, again.headers["location"]) == (303, "/console/sign-in")

    run(tmp_path, body)


def test_the_live_feed_relays_events_to_a_session_only(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        assert (await r.client.get("/console/events")).status_code == 303
        await sign_in(r.client)
        page = (await r.client.get("/console/cases")).text
        after = re.search(r'data-feed="/console/events\?after=(e\d+)"', page)
        assert after, page
        async with r.client.stream("GET", f"/console/events?after={after[1]}") as stream:
            assert stream.headers["content-type"] == "text/event-stream; charset=utf-8"
            guarded(stream)
            await deliver(r.store, r.rt, "ticket@help.example", r.clock.now(), subject="Live one")
            text = ""
            async for chunk in stream.aiter_text():
                text += chunk
                if "\n\n" in text:
                    break
        assert text.startswith("id: e"), text
        assert '"kind":"mail.in"' in text
        assert "Live one" in text
        assert ADMIN not in text

    run(tmp_path, body)


def test_sessions_expire_end_with_a_new_secret_and_are_bounded() -> None:
    held = Sessions(idle=60, longest=300)
    token, session = held.open("s3cret", now=1000)
    assert held.find(token, "s3cret", 1059) is session  # used: 60 s more
    assert held.find(token, "s3cret", 1118) is session
    assert held.find(token, "s3cret", 1178.5) is None  # idle too long
    token, _ = held.open("s3cret", now=2000)
    for now in range(2050, 2300, 50):
        assert held.find(token, "s3cret", now) is not None
    assert held.find(token, "s3cret", 2300) is None  # the longest a session lasts
    token, _ = held.open("s3cret", now=2500)
    assert held.find(token, "s3cret", 2550, touch=False) is not None  # a look, not a use
    assert held.find(token, "s3cret", 2561, touch=False) is None
    token, _ = held.open("s3cret", now=3000)
    assert held.find(token, "rotated", 3001) is None  # a reload with a new secret
    assert held.find(token, "s3cret", 3002) is None  # and it stays ended
    first, _ = held.open("s3cret", now=4000)
    for _ in range(MAX_SESSIONS):
        held.open("s3cret", now=4000)
    assert len(held) == MAX_SESSIONS
    assert held.find(first, "s3cret", 4001) is None  # the oldest made room


def test_the_console_needs_an_admin_secret(tmp_path: Path) -> None:
    config = tmp_path / "masd.toml"
    config.write_text('[server]\nconsole = true\ndatabase = "masd.db"\n')
    with pytest.raises(ConfigErrors) as caught:
        load_config(config)
    assert "server.console: needs server.admin_token_file" in str(caught.value)


def test_the_outside_check_can_fail() -> None:
    for page in (
        '<img src="https://cdn.example/x.png">',
        '<a href="//cdn.example/x">',
        "<link href=http://x/y.css>",
        "<div style=\"background: url('/x.png')\">",
        '<form action="javascript:x">',
    ):
        with pytest.raises(AssertionError):
            nothing_from_outside(page)
    nothing_from_outside(
        '<a href="/console/cases?state=open">x</a><script src="/console/static/console.js">'
    )


def test_a_reload_turns_the_console_on_and_a_new_secret_signs_everyone_out(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        assert (await r.client.get("/console/sign-in")).status_code == 404
        path = tmp_path / "masd.toml"
        path.write_text(console_on(path.read_text()))
        r.rt.replace_config(load_config(path))
        assert (await r.client.get("/console/sign-in")).status_code == 200
        await sign_in(r.client)
        assert (await r.client.get("/console/health")).status_code == 200
        (tmp_path / "admin.token").write_text("a-new-admin-secret-0123-4e9d1c07b2a8f653\n")
        r.rt.replace_config(load_config(path))
        ended = await r.client.get("/console/health")
        assert (ended.status_code, ended.headers["location"]) == (303, "/console/sign-in")
        assert (await sign_in(r.client)).status_code == 401  # the old secret
        assert (
            await sign_in(r.client, "a-new-admin-secret-0123-4e9d1c07b2a8f653")
        ).status_code == 303

    run(tmp_path, body, on=False)


def test_a_form_that_cannot_be_read_is_400_never_5xx(tmp_path: Path) -> None:
    forms = [
        (b"\xff\xfe=\xff", "application/x-www-form-urlencoded"),
        (b"--x\r\n", "multipart/form-data; boundary=x"),
    ]

    async def body(r: Running) -> None:
        for content, kind in forms:
            headers = {"content-type": kind}
            refused = await r.client.post("/console/sign-in", content=content, headers=headers)
            assert refused.status_code == 400, refused.text
            assert "the form cannot be read" in refused.text
            guarded(refused)
        other = await r.client.post("/console/sign-in", json={"secret": ADMIN})
        assert other.status_code == 401  # a JSON body is no form: no secret in it
        await sign_in(r.client)
        for content, kind in forms:
            headers = {"content-type": kind}
            refused = await r.client.post("/console/outbox/retry", content=content, headers=headers)
            assert refused.status_code == 400, refused.text
            guarded(refused)

    run(tmp_path, body)


def test_check_config_says_whether_the_console_is_on(tmp_path: Path) -> None:
    from support.http import write_config

    from masd.config.summary import format_summary

    path = write_config(tmp_path)
    assert "console   off" in format_summary(load_config(path)).splitlines()
    path.write_text(console_on(path.read_text()))
    summary = format_summary(load_config(path)).splitlines()
    assert "console   on at http://127.0.0.1:8025/console/" in summary
