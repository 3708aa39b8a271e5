"""Every refusal of the HTTP listener is raised as one exception and answered in one place;
a fault of masd's own is 503 without a traceback; the package has no import cycle."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from support.http import ADMIN, CALLBACK, Running, serving

import masd.edges.http
from masd.core.errors import Answer, Refusal
from masd.edges.http import REPLIES, ROUTES, HttpRefusal, Route
from masd.edges.http.shared import RETRY_AFTER, status_of

PACKAGE = Path(masd.edges.http.__file__).parent
#: A value for each path parameter a route takes.
PARAMS = {
    "key": "ticket=gs-404@help.example",
    "id": "987654",
    "ref": "msg-404",
    "n": "0",
}


def run(tmp_path: Path, body: Callable[[Running], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        async with serving(tmp_path, **kw) as running:
            await body(running)

    asyncio.run(main())


def concrete(route: Route) -> str:
    """The route's path with a value for each ``{name}`` or ``{name:regex}``."""
    return re.sub(r"\{(\w+)(:[^{}]*(\{[^{}]*\}[^{}]*)*)?\}", lambda m: PARAMS[m[1]], route.path)


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kinds :meth:`HttpRefusal.response` answered, in order."""
    kinds: list[str] = []
    original = HttpRefusal.response

    def spy(self: HttpRefusal) -> Any:
        kinds.append(self.kind)
        return original(self)

    monkeypatch.setattr(HttpRefusal, "response", spy)
    return kinds


def refused(response: httpx.Response, status: int, kind: str, detail: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    body = response.json()
    assert (body["ok"], body["error"]) == (False, kind), body
    assert detail in body["detail"], body
    assert set(body) == {"ok", "error", "detail"}


def test_every_route_declares_who_may_use_it() -> None:
    needs = {(r.method, r.path): r.auth for r in ROUTES}
    assert needs.pop(("POST", "/mas/v0.1/messages")) == "peer"
    assert needs.pop(("GET", "/healthz")) == "anyone"
    assert needs.pop(("GET", "/metrics")) == "anyone"
    # The operator console's pages check their own session (tests/test_console_http.py).
    console = {path for (_, path), need in needs.items() if need == "console"}
    assert console
    assert all(path.startswith("/console") for path in console)
    needs = {route: need for route, need in needs.items() if need != "console"}
    assert needs.pop(("GET", "/openapi.json")) == "anyone"
    assert needs
    # The read side (docs/protocol.md §16.10): the admin, or a master for its own types.
    readers = {path for (method, path), need in needs.items() if need == "reader"}
    assert readers == {
        "/mas/v0.1/cases",
        "/mas/v0.1/cases/{key}",
        "/mas/v0.1/cases/{key}/thread",
        "/mas/v0.1/events",
        "/mas/v0.1/intakes",
        "/mas/v0.1/messages/{ref}",
        "/mas/v0.1/messages/{ref}/raw",
        "/mas/v0.1/messages/{ref}/attachments/{n}",
    }
    assert {need for need in needs.values() if need != "reader"} == {"admin"}, needs
    assert len({(r.method, r.path) for r in ROUTES}) == len(ROUTES)


def test_a_wrong_secret_on_every_route_is_refused_by_the_one_handler(
    tmp_path: Path, answered: list[str]
) -> None:
    async def body(r: Running) -> None:
        guarded = [route for route in ROUTES if route.auth in ("peer", "admin")]
        for route in guarded:
            path = concrete(route)
            nothing = await r.client.request(route.method, path)
            refused(nothing, 401, "unauthenticated", "no Bearer secret")
            assert nothing.headers["www-authenticate"] == 'Bearer realm="masd"'
            # The admin secret is no peer's: 401 on a peer route.  A mode endpoint's
            # secret is known: it may not use an admin route (403), as it reads nothing.
            other = ADMIN if route.auth == "peer" else CALLBACK
            wrong = await r.client.request(
                route.method, path, headers={"Authorization": f"Bearer {other}"}
            )
            if route.auth == "peer":
                refused(wrong, 401, "unauthenticated", "matches no peer")
                continue
            refused(wrong, 403, "forbidden", "not the admin secret")
            assert "www-authenticate" not in wrong.headers
            unknown = await r.client.request(
                route.method, path, headers={"Authorization": f"Bearer nobody-{'0' * 32}"}
            )
            refused(unknown, 401, "unauthenticated", "not the admin secret")
        admins = sum(route.auth == "admin" for route in guarded)
        assert answered.count("unauthenticated") == 2 * len(guarded)
        assert answered.count("forbidden") == admins

    run(tmp_path, body)


def test_a_get_route_answers_head_with_the_same_guard(tmp_path: Path) -> None:
    async def body(r: Running) -> None:
        health = await r.client.head("/healthz")
        assert (health.status_code, health.content) == (200, b"")
        assert (await r.client.head("/mas/v0.1/cases")).status_code == 401
        assert (await r.client.head("/mas/v0.1/cases", headers=auth())).status_code == 200

    run(tmp_path, body)


def test_bad_parameters_and_unknown_names_are_refused_by_the_one_handler(
    tmp_path: Path, answered: list[str]
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN}"}
    asked = [
        ("GET", "/mas/v0.1/cases/ticket=gs-1@help.example/thread?after=x", 400, "after"),
        ("GET", "/mas/v0.1/cases?limit=0", 400, "limit"),
        ("GET", "/mas/v0.1/cases?state=ajar", 400, "state"),
        ("GET", "/mas/v0.1/events?wait=99999", 400, "wait"),
        ("GET", "/mas/v0.1/events?after=zz", 400, "after"),
        ("GET", "/mas/v0.1/admin/outbox?limit=-1", 400, "limit"),
        ("GET", "/mas/v0.1/cases/ticket=gs-404@help.example", 404, "no case"),
        ("GET", "/mas/v0.1/events?case=ticket=gs-404@help.example", 404, "no case"),
        ("POST", "/mas/v0.1/admin/outbox/987654/retry", 404, "no outbox item"),
        ("POST", "/mas/v0.1/admin/outbox/x/retry", 404, "is not served here"),
        ("DELETE", "/mas/v0.1/cases", 405, "DELETE"),
    ]
    kinds = {400: "invalid-message", 404: "unknown-case", 405: "method-not-allowed"}

    async def body(r: Running) -> None:
        for method, path, status, detail in asked:
            kind = kinds[status]
            if "outbox/" in path:
                kind = "unknown-item" if "987654" in path else "not-found"
            refused(await r.client.request(method, path, headers=admin), status, kind, detail)
        assert len(answered) == len(asked)

    run(tmp_path, body)


def test_a_fault_in_a_handler_is_503_unavailable_without_a_traceback(
    tmp_path: Path, answered: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    async def body(r: Running) -> None:
        async def broken(job: object) -> object:
            raise RuntimeError("a bug with a secret-looking text 5f1e")

        r.store.read = broken  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="masd.http"):
            answer = await r.client.get(f"/mas/v0.1/cases/{PARAMS['key']}", headers=auth())
        refused(answer, 503, "unavailable", "masd failed; retry later (see its log)")
        assert answer.headers["retry-after"] == str(RETRY_AFTER)
        assert "5f1e" not in answer.text
        assert "Traceback" not in answer.text
        (logged,) = [rec for rec in caplog.records if rec.getMessage().startswith("fault")]
        assert logged.exc_info is not None  # the traceback goes to the log
        assert answered == ["unavailable"]

    run(tmp_path, body)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN}"}


# --------------------------------------------------------------------------- layout


def _imports(path: Path) -> tuple[set[str], list[int]]:
    """The masd.edges.http modules ``path`` imports, and the lines of imports inside a
    function (lazy ones)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    lazy: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lazy += [n.lineno for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("masd.edges.http"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if (PACKAGE / f"{alias.name}.py").exists() else str(node.module))
    return found, lazy


def test_the_package_has_no_lazy_import_and_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        name = "masd.edges.http" + ("" if path.stem == "__init__" else f".{path.stem}")
        found, lazy = _imports(path)
        assert not lazy, f"{path.name}: imports inside a function at lines {lazy}"
        graph[name] = found - {name}
    # Only the package itself imports it; a module imports modules, never the package.
    assert all("masd.edges.http" not in deps for name, deps in graph.items())
    done: set[str] = set()
    while len(done) < len(graph):
        ready = {n for n, deps in graph.items() if n not in done and deps <= done}
        assert ready, f"an import cycle among {sorted(set(graph) - done)}"
        done |= ready


def test_a_refusal_body_is_json_of_its_kind() -> None:
    response = HttpRefusal("unauthenticated", "no").response()
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert json.loads(response.text or "") == {
        "ok": False,
        "error": "unauthenticated",
        "detail": "no",
    }
    busy = HttpRefusal("unavailable", "later").response()
    assert (busy.status, busy.headers["Retry-After"]) == (503, str(RETRY_AFTER))


# --------------------------------------------------------------------------- the status table


def test_the_table_gives_each_kind_of_answer_its_status() -> None:
    """The core names answers by kind (docs/protocol.md §9.3); the edge's table alone
    turns them into statuses."""
    assert set(get_args(Refusal)) < set(get_args(Answer))
    assert {kind: status_of(kind) for kind in get_args(Answer)} == {
        "ok": 200,
        "refused": 422,
        "invalid-message": 400,
        "unsupported-version": 400,
        "unknown-type": 400,
        "forbidden": 403,
        "unknown-case": 404,
        "unknown-handoff": 404,
        "unknown-intake": 404,
        "invalid-transition": 409,
        "already-assigned": 409,
    }
    own = {kind: status for kind, status in REPLIES.items() if kind not in get_args(Answer)}
    assert own == {
        "unauthenticated": 401,
        "unsupported-media-type": 415,
        "too-large": 413,
        "unknown-item": 404,
        "wrong-state": 409,
        "unknown-message": 404,
        "range-not-satisfiable": 416,
        "not-found": 404,
        "method-not-allowed": 405,
        "expectation-failed": 417,
        "unavailable": 503,
        "store": 503,
    }


def test_a_refusal_takes_its_status_from_the_table() -> None:
    for kind, status in REPLIES.items():
        assert HttpRefusal(kind, "x").status == status
    with pytest.raises(KeyError):
        HttpRefusal("no-such-kind", "x")
