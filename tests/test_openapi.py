"""The OpenAPI description (masd.edges.http.openapi): the file in docs/ is what masd serves, it
is a valid OpenAPI 3.1 document that resolves every reference from itself, and it describes
exactly the routes masd serves, each with the secret it needs and the refusals it can give.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from support.http import ADMIN, CALLBACK, serving, status_message

from masd.edges.http import ROUTES, openapi
from masd.edges.http.openapi_routes import INBOUND, OUTBOUND, UNDOCUMENTED
from masd.edges.http.shared import REPLIES

ROOT = Path(__file__).resolve().parents[1]
DOC_FILE = ROOT / "docs" / "openapi.json"
METHODS = ("get", "head", "post", "put", "patch", "delete", "options", "trace")

#: Routes that the document describes before the listener serves them; each leaves this set
#: when its route is added to ROUTES.
ARRIVING: frozenset[tuple[str, str]] = frozenset()

#: The routes the document describes: all but those of an undocumented auth kind (the
#: operator console's HTML pages, a user interface rather than part of the API).
API_ROUTES = tuple(r for r in ROUTES if r.auth not in UNDOCUMENTED)

DOC = openapi.document()


def _registry() -> Registry:
    resources = []
    for path in sorted((ROOT / "conformance" / "schema").glob("*.schema.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        resources.append((contents["$id"], Resource.from_contents(contents, DRAFT202012)))
    return Registry().with_resources(resources)


REGISTRY = _registry()


def operations(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    }


def served() -> set[tuple[str, str]]:
    """(method, OpenAPI path) of every route, with HEAD beside each GET as aiohttp adds it."""
    out = set()
    for route in API_ROUTES:
        path = openapi.openapi_path(route.path)
        out.add((route.method.lower(), path))
        if route.method == "GET":
            out.add(("head", path))
    return out


def test_the_file_in_docs_is_the_document() -> None:
    assert DOC_FILE.read_bytes() == openapi.rendered(), (
        "docs/openapi.json is stale: run `make openapi`"
    )


def test_the_module_prints_the_document() -> None:
    out = subprocess.run(
        [sys.executable, "-W", "error", "-m", "masd.edges.http"],
        capture_output=True,
        check=True,
        cwd=ROOT,
    )
    assert out.stdout == openapi.rendered()
    assert out.stderr == b""


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(json.loads(DOC_FILE.read_text(encoding="utf-8")))
    assert DOC["openapi"].startswith("3.1.")


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for item in node for r in _refs(item)]
    return []


def test_every_ref_resolves_inside_the_document() -> None:
    refs = _refs(DOC)
    assert len(refs) > 100
    for ref in set(refs):
        assert ref.startswith("#/"), ref
        node: Any = DOC
        for part in ref[2:].split("/"):
            assert isinstance(node, dict), ref
            assert part in node, ref
            node = node[part]
    text = json.dumps(DOC)
    assert '"$id"' not in text
    assert "schema.json" not in text.replace("docs/openapi.json", "")


def test_every_route_has_an_operation_and_every_operation_a_route() -> None:
    described = set(operations(DOC))
    routes = served()
    assert routes - described == set(), "routes the document does not describe"
    assert described - routes == ARRIVING - routes, "operations no route serves"
    arrived = ARRIVING & routes
    assert not arrived, f"served now: remove from ARRIVING {sorted(arrived)}"


def test_each_operation_asks_for_the_secret_its_route_needs() -> None:
    schemes = {
        "anyone": [],
        "admin": [{"admin": []}],
        "peer": [{"peer": []}],
        "reader": [{"admin": []}, {"peer": []}],
    }
    ops = operations(DOC)
    for route in API_ROUTES:
        for method in ("get", "head") if route.method == "GET" else (route.method.lower(),):
            op = ops[(method, openapi.openapi_path(route.path))]
            assert op["security"] == schemes[route.auth], (method, route.path)
            if route.auth != "anyone":
                assert "401" in op["responses"], route.path
                assert "WWW-Authenticate" in op["responses"]["401"]["headers"]
            if route.auth == "reader":
                assert "403" in op["responses"], route.path


def test_no_operation_describes_an_undocumented_route() -> None:
    left_out = {openapi.openapi_path(r.path) for r in ROUTES if r.auth in UNDOCUMENTED}
    assert left_out, "the console's routes"
    assert not left_out & set(DOC["paths"])


def _kinds(response: dict[str, Any]) -> list[str]:
    schema = response["content"]["application/json"]["schema"]
    kinds: list[str] = schema["allOf"][1]["properties"]["error"]["enum"]
    return kinds


def test_every_refusal_is_listed_under_its_status_from_replies() -> None:
    for (method, path), op in operations(DOC).items():
        assert "503" in op["responses"], (method, path)
        assert "Retry-After" in op["responses"]["503"]["headers"]
        if method == "head":
            continue
        for status, response in op["responses"].items():
            if int(status) < 400 or "content" not in response:
                continue
            for kind in _kinds(response):
                assert openapi.status_of(kind) == int(status), (path, kind)
    posted = operations(DOC)[("post", "/mas/v0.1/messages")]["responses"]
    listed = {kind for status in posted if int(status) >= 400 for kind in _kinds(posted[status])}
    contract = set(REPLIES) - {"ok", "unknown-item", "wrong-state", "not-found"}
    contract -= {"method-not-allowed", "store", "unknown-message", "range-not-satisfiable"}
    assert listed == contract


def test_arriving_kinds_are_not_in_replies_yet() -> None:
    # Once REPLIES lists a kind, the document takes its status from there.
    assert not set(openapi.ARRIVING_REPLIES) & set(REPLIES)


def test_messages_take_every_inbound_type_and_webhooks_every_outbound_one() -> None:
    body = operations(DOC)[("post", "/mas/v0.1/messages")]["requestBody"]
    one_of = body["content"]["application/json"]["schema"]["oneOf"]
    assert [r["$ref"].rsplit("/", 1)[1] for r in one_of] == list(INBOUND)
    sent = set()
    for path in sorted((ROOT / "conformance" / "messages" / "valid").glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc["direction"] == "from-email":
            sent.add(doc["message"]["type"])
    assert sent == set(OUTBOUND) == set(DOC["webhooks"])


def test_bundled_schemas_accept_and_refuse_as_the_files_do() -> None:
    """Every conformance message is valid against its bundled component exactly when it is
    valid against its schema file (with the files' own $id and $ref)."""
    files = REGISTRY
    checked = refused = 0
    for path in sorted((ROOT / "conformance" / "messages").glob("*/*.json")):
        message = json.loads(path.read_text(encoding="utf-8")).get("message")
        if not isinstance(message, dict) or message.get("type") not in OUTBOUND.keys() | INBOUND:
            continue
        mtype = message["type"]
        by_file = Draft202012Validator(
            {"$ref": f"https://mas.example/schema/{mtype}.schema.json"}, registry=files
        ).is_valid(message)
        root = {"$ref": f"#/components/schemas/{mtype}", "components": DOC["components"]}
        assert Draft202012Validator(root).is_valid(message) == by_file, path.name
        checked += 1
        refused += not by_file
    assert checked > 80
    assert refused > 10


def test_get_openapi_json_serves_the_file_without_a_secret(tmp_path: Path) -> None:
    async def main() -> None:
        async with serving(tmp_path) as r:
            got = await r.client.get("/openapi.json")
            assert got.status_code == 200
            assert got.headers["content-type"] == "application/json; charset=utf-8"
            assert got.content == DOC_FILE.read_bytes()
            head = await r.client.head("/openapi.json")
            assert head.status_code == 200

    asyncio.run(main())


def _concrete(path: str) -> str:
    for name, value in (("{key}", "ticket=gs-1@help.example"), ("{id}", "1"), ("{n}", "0")):
        path = path.replace(name, value)
    return path.replace("{ref}", "m-1")


def test_answers_under_a_store_fault_are_the_documented_503s(tmp_path: Path) -> None:
    """With the store closed, every route that needs it answers the 503 its operation
    documents (body and Retry-After); the others answer as usual."""
    secrets = {"admin": ADMIN, "reader": ADMIN, "peer": CALLBACK}
    message = status_message("ticket=gs-1@help.example", "0" * 32, 1, "running")

    async def main() -> None:
        async with serving(tmp_path) as r:
            await r.open_callback_case()
            r.store.close()
            statuses = []
            for route in API_ROUTES:
                path = openapi.openapi_path(route.path)
                headers = {"Content-Type": "application/json"}
                if route.auth != "anyone":
                    headers["Authorization"] = f"Bearer {secrets[route.auth]}"
                body = json.dumps(message).encode() if route.auth == "peer" else None
                got = await r.client.request(
                    route.method, _concrete(path), headers=headers, content=body
                )
                documented = operations(DOC)[(route.method.lower(), path)]["responses"]
                assert str(got.status_code) in documented, (route.path, got.text)
                media = documented[str(got.status_code)]["content"]["application/json"]
                schema = {**media["schema"], "components": DOC["components"]}
                errors = list(Draft202012Validator(schema).iter_errors(got.json()))
                assert not errors, (route.path, errors[0].message)
                if got.status_code == 503:
                    assert int(got.headers["retry-after"]) > 0
                statuses.append(got.status_code)
            assert statuses.count(503) >= len(API_ROUTES) - 1  # /openapi.json needs no store

    asyncio.run(main())


def test_an_empty_query_value_is_refused_where_the_document_refuses_it(tmp_path: Path) -> None:
    """Each string query parameter sent empty (``?after=``): where its schema in the
    document takes the empty string masd does not refuse it 400 naming it, and where the
    schema refuses it masd answers a 4xx."""
    empty: list[tuple[str, str, bool]] = []
    for (method, path), op in operations(DOC).items():
        for param in op.get("parameters", []):
            schema = param.get("schema", {})
            if method == "get" and param["in"] == "query" and schema.get("type") == "string":
                accepted = Draft202012Validator(schema).is_valid("")
                empty.append((_concrete(path), param["name"], accepted))
    assert {(p, n) for p, n, _ in empty} >= {
        ("/mas/v0.1/cases", "after"),
        ("/mas/v0.1/events", "after"),
        ("/mas/v0.1/intakes", "after"),
    }

    async def main() -> list[str]:
        wrong = []
        async with serving(tmp_path) as r:
            for path, name, accepted in empty:
                got = await r.client.get(
                    f"{path}?{name}=", headers={"Authorization": f"Bearer {ADMIN}"}
                )
                named = got.status_code == 400 and got.json()["detail"].startswith(name)
                if named if accepted else not 400 <= got.status_code < 500:
                    wrong.append(f"{path}?{name}= answered {got.status_code} {got.text[:80]}")
        return wrong

    wrong = asyncio.run(main())
    assert not wrong, "\n".join(wrong)
