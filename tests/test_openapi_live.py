"""Every operation of docs/openapi.json against a live masd, with requests Schemathesis
generates from the document's own schemas.

masd runs as a real process (master type ``ticket`` with a callback endpoint, slave type
``case`` with its master; the peers' URLs lead nowhere, so what masd sends waits in its
outbox). Before the run a few mails and a status give the read side, the feed and the queue
something to show. Each generated request carries the secret its operation asks for
(the admin's, or for ``POST /mas/v0.1/messages`` the peer that may send the body's type),
and each answer must be no server error and conform to the document: a documented status,
its content type, its schema, its headers. Requests the document rules out (a parameter out
of its bounds, a body off its schema, another method, no secret, a required header missing)
must be refused.

Each operation is its own test (one pytest item each, so the count pytest announces is the
count it reports).  The contract messages are also generated one type at a time, their
``case`` and the ids they refer to pinned to what the live masd holds (no generator finds a
case address by chance), so each type is answered by its handler, past the peer's secret.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator
from schemathesis import Case
from schemathesis.checks import (
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from masd.edges.http import ROUTES, openapi
from masd.edges.http.openapi_routes import UNDOCUMENTED
from masd.testing import lmtpclient
from masd.testing.config import DOMAIN, server_table, write_config
from masd.testing.inbound import mx_mail
from masd.testing.net import free_ports
from masd.testing.process import MasdProcess

pytestmark = pytest.mark.slow

#: Generated requests per operation: the run stays well under two minutes on two cores.
MAX_EXAMPLES = 25
MESSAGE_EXAMPLES = 150
NOWHERE = "http://127.0.0.1:9"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
    unsupported_method,
    ignored_auth,
    missing_required_header,
]
MESSAGE_CHECKS = [check for check in CHECKS if check is not negative_data_rejection]


class Live:
    """The running masd: its base URL, the secrets a request may carry, and what it holds
    that a message may refer to (``refs``: ``handoff_id``, ``intake_ref``, ``message_ref``)."""

    def __init__(self, url: str, tokens: dict[str, str], refs: dict[str, str]) -> None:
        self.url = url
        self.tokens = tokens
        self.refs = refs

    def headers_for(self, case: Case) -> dict[str, str]:
        security = case.operation.definition.raw.get("security", [])
        if not security:
            return {}
        if {"admin": []} in security:
            return {"Authorization": f"Bearer {self.tokens['admin']}"}
        body = case.body if isinstance(case.body, dict) else {}
        peer = "callback" if body.get("type") == "handoff.status" else "crm"
        return {"Authorization": f"Bearer {self.tokens[peer]}"}


def _config(directory: Path) -> tuple[Path, int, int, dict[str, str]]:
    tokens = {name: f"{name}-{secrets.token_hex(16)}" for name in ("admin", "callback", "crm")}
    lmtp_port, http_port, smtp_port = free_ports(3)
    types: dict[str, Any] = {
        "ticket": {
            "role": "master",
            "modes": ["callback"],
            "id_prefix": "gs-",
            "endpoints": {
                "callback": {
                    "url": NOWHERE + "/mas",
                    "token_file": "secrets/callback.token",
                    "deadline": "2h",
                    "fields": ["phone"],
                }
            },
        },
        "case": {
            "role": "slave",
            "master": {"url": NOWHERE + "/crm", "token_file": "secrets/crm.token"},
        },
    }
    server = server_table(lmtp_port=lmtp_port, http_port=http_port, smtp_port=smtp_port)
    server["public_url"] = f"http://127.0.0.1:{http_port}"
    doc = {"server": server, "domains": {DOMAIN: {"types": types}}}
    return write_config(directory, doc, tokens), lmtp_port, http_port, tokens


#: The master-role case with a handoff, and the slave-role case the CRM is given before
#: the run, as a message's ``case``.
TICKET_CASE: Final = {"address": "ticket=gs-1@help.example", "key": "ticket=gs-1@help.example"}
SLAVE_CASE: Final = {"address": "case=c-1@help.example", "key": "case=c-1@help.example"}


async def _populate(lmtp_port: int, url: str, tokens: dict[str, str]) -> dict[str, str]:
    """A case with a handoff and a status, a slave-role case of the CRM's, two pending
    intakes, and mail waiting in the outbox; what a message may refer to."""
    rcpts = ("ticket!callback@help.example", "ticket@help.example", *["case@help.example"] * 3)
    for rcpt in rcpts:
        _, data = mx_mail("alice@example.com", rcpt, body="phone: +1 555 0100\n")
        result = await lmtpclient.deliver(
            ("127.0.0.1", lmtp_port), "alice@example.com", [rcpt], data
        )
        assert result.codes == (250,), result
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    crm = {"Authorization": f"Bearer {tokens['crm']}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        case = (await client.get("/mas/v0.1/cases/ticket=gs-1@help.example", headers=admin)).json()
        handoff = case["case"]["handoffs"][0]["handoff_id"]
        intakes = (await client.get("/mas/v0.1/intakes", headers=admin)).json()["intakes"]
        assign = {
            "mas_modes_version": "0.1",
            "type": "case.assign",
            "id": "assign-1",
            "intake_ref": intakes[1]["intake_ref"],
            "resource_id": "c-1",
        }
        got = await client.post("/mas/v0.1/messages", content=json.dumps(assign), headers=crm)
        assert got.status_code == 200, got.text
        status = {
            "mas_modes_version": "0.1",
            "type": "handoff.status",
            "id": "st-1",
            "case": TICKET_CASE,
            "handoff_id": handoff,
            "seq": 1,
            "status": "running",
        }
        got = await client.post(
            "/mas/v0.1/messages",
            content=json.dumps(status),
            headers={
                "Authorization": f"Bearer {tokens['callback']}",
                "Content-Type": "application/json",
            },
        )
        assert got.status_code == 200, got.text
    return {
        "handoff_id": handoff,
        "intake_ref": intakes[2]["intake_ref"],
        "message_ref": intakes[1]["message_ref"],
    }


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    directory = tmp_path_factory.mktemp("openapi-live")
    config, lmtp_port, http_port, tokens = _config(directory)
    masd = MasdProcess(config, directory / "masd.log")
    try:
        asyncio.run(masd.start())
    except BaseException:
        masd.close()
        raise
    url = f"http://127.0.0.1:{http_port}"
    try:
        refs = asyncio.run(_populate(lmtp_port, url, tokens))
        yield Live(url, tokens, refs)
    finally:
        code = asyncio.run(masd.terminate())
        masd.close()
        log = masd.log()
        assert code == 0, log
        assert "Traceback" not in log, log


#: (method, OpenAPI path) of every route masd serves (GET routes answer HEAD too) but the
#: console's, which the document leaves out.
SERVED = {
    (method, openapi.openapi_path(r.path))
    for r in ROUTES
    if r.auth not in UNDOCUMENTED
    for method in (("get", "head") if r.method == "GET" else (r.method.lower(),))
}
MESSAGES = "/mas/v0.1/messages"


def _schema(phases: list[str], examples: int) -> schemathesis.BaseSchema:
    schema = schemathesis.openapi.from_dict(openapi.document())
    schema.config.update(request_timeout=10)
    schema.config.phases.update(phases=phases)
    # masd ignores query parameters it does not know (a tolerant reader), so an unknown
    # parameter is no invalid request that must be refused.
    schema.config.generation.update(max_examples=examples, allow_extra_parameters=False)
    return schema


#: Every operation but POST /mas/v0.1/messages, through every phase (the examples, the
#: coverage of each schema's bounds and the negative cases, then random requests).
ROUTES_SCHEMA = _schema(["examples", "coverage", "fuzzing"], MAX_EXAMPLES).exclude(
    path=MESSAGES, method="POST"
)
#: POST /mas/v0.1/messages without the coverage phase, whose walk through the ten message
#: schemas takes minutes; random messages instead, more of them.
MESSAGES_SCHEMA = _schema(["examples", "fuzzing"], MESSAGE_EXAMPLES).include(
    path=MESSAGES, method="POST"
)


def _call(case: Case, live: Live) -> None:
    if (case.operation.method.lower(), case.operation.path) not in SERVED:
        pytest.skip(f"{case.operation.label}: described, not served yet")
    case.call_and_validate(base_url=live.url, headers=live.headers_for(case), checks=CHECKS)


def _operation_test(method: str, path: str) -> Callable[..., None]:
    """One operation's test, through every phase of :data:`ROUTES_SCHEMA`."""

    @ROUTES_SCHEMA.include(method=method, path=path).parametrize()
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def test(case: Case, live: Live) -> None:
        _call(case, live)

    return test


#: (method, path) of every operation but POST /mas/v0.1/messages, as the document has them.
OPERATIONS: Final = sorted(
    (op.method.upper(), op.path) for op in (r.ok() for r in ROUTES_SCHEMA.get_all_operations())
)
# One test function per operation: Schemathesis makes one pytest item of each function
# (items of one function would share one node id, and pytest would count them as one).
for _method, _path in OPERATIONS:
    _name = "test_conforms_" + _method.lower() + re.sub(r"\W+", "_", _path).rstrip("_")
    _test = _operation_test(_method, _path)
    _test.__name__ = _test.__qualname__ = _name
    globals()[_name] = _test


def test_each_operation_is_a_test_of_its_own(request: pytest.FixtureRequest) -> None:
    """pytest announces and reports one test per operation: no two share a node id."""
    here = [item.nodeid for item in request.session.items if item.path == request.node.path]
    assert len(here) == len(set(here)), sorted(here)
    own = [name for name in globals() if name.startswith("test_conforms_")]
    assert len(own) == len(OPERATIONS) == len(set(OPERATIONS))


@MESSAGES_SCHEMA.parametrize()
@settings(max_examples=MESSAGE_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_to_a_contract_message_conforms(case: Case, live: Live) -> None:
    _call(case, live)


#: The contract messages masd takes, and whose secret sends each (the others: the CRM's).
MESSAGE_TYPES: Final = (
    "handoff.status",
    "case.assign",
    "case.policy",
    "mail.send",
    "handoff.cancel",
)
#: Answers of a message's own handler: past the secret and the schema.
DECIDED: Final = {200, 403, 404, 409, 422}


def _pinned(kind: str, live: Live) -> schemathesis.BaseSchema:
    """The document with POST /mas/v0.1/messages taking ``kind`` only, its ``case`` and
    the ids it names pinned to what ``live`` holds; every other field as the document has it."""
    doc = copy.deepcopy(openapi.document())
    schemas = doc["components"]["schemas"]
    case = TICKET_CASE if kind == "handoff.status" else SLAVE_CASE
    schemas["envelope"]["properties"]["case"] = {"const": case}
    props = schemas[kind]["properties"]
    for name, ref in (("handoff_id", "handoff_id"), ("intake_ref", "intake_ref")):
        if name in props:
            props[name] = {"const": live.refs[ref]}
    if "in_reply_to" in props:
        props["in_reply_to"] = {"const": live.refs["message_ref"]}
    if "case" in props:
        props["case"] = {"const": case}
    body = doc["paths"][MESSAGES]["post"]["requestBody"]["content"]["application/json"]
    body["schema"] = {"$ref": f"#/components/schemas/{kind}"}
    return schemathesis.openapi.from_dict(doc)


@pytest.mark.parametrize("kind", MESSAGE_TYPES)
def test_each_contract_message_is_answered_past_the_peers_secret(kind: str, live: Live) -> None:
    """Generated messages of one type with the secret of the peer that sends it: every
    answer conforms, and the handler decides some (none stops at 401 or the schema)."""
    operation = _pinned(kind, live)[MESSAGES]["POST"]
    answered: list[int] = []

    @given(case=operation.as_strategy())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    def run(case: Case) -> None:
        if isinstance(case.body, dict):
            case.body["id"] = secrets.token_hex(8)  # each one new, not an idempotent repeat
        response = case.call_and_validate(
            base_url=live.url, headers=live.headers_for(case), checks=MESSAGE_CHECKS
        )
        answered.append(response.status_code)

    run()
    assert 401 not in answered, answered
    assert DECIDED & set(answered), (kind, sorted(set(answered)))


def _conforms(method: str, path: str, got: httpx.Response) -> None:
    """``got`` has a status the operation documents, and a JSON body on its schema."""
    doc = openapi.document()
    documented = doc["paths"][path][method]["responses"]
    assert str(got.status_code) in documented, (method, path, got.status_code, got.text)
    media = documented[str(got.status_code)].get("content", {}).get("application/json")
    if media is not None and method != "head":
        schema = {**media["schema"], "components": doc["components"]}
        errors = list(Draft202012Validator(schema).iter_errors(got.json()))
        assert not errors, (path, errors[0].message)


def test_a_recorded_mail_and_its_intake_answer_as_documented(live: Live) -> None:
    """With the refs masd gave (which generated requests cannot guess): the message, its
    bytes whole, in a range and past the end, not modified, and the intake sent again."""
    message, raw = "/mas/v0.1/messages/{ref}", "/mas/v0.1/messages/{ref}/raw"
    admin = {"Authorization": f"Bearer {live.tokens['admin']}"}
    crm = {"Authorization": f"Bearer {live.tokens['crm']}"}
    with httpx.Client(base_url=live.url, timeout=10) as client:
        got = client.get("/mas/v0.1/intakes", headers=crm)
        _conforms("get", "/mas/v0.1/intakes", got)
        intake = got.json()["intakes"][0]
        ref = intake["message_ref"]
        got = client.get(f"/mas/v0.1/messages/{ref}", headers=crm)
        _conforms("get", message, got)
        size, etag = got.json()["message"]["size"], f'"{got.json()["message"]["sha256"]}"'
        answers = {
            200: client.get(f"/mas/v0.1/messages/{ref}/raw", headers=admin),
            206: client.get(f"/mas/v0.1/messages/{ref}/raw", headers={**crm, "Range": "bytes=0-9"}),
            304: client.get(
                f"/mas/v0.1/messages/{ref}/raw", headers={**crm, "If-None-Match": etag}
            ),
            416: client.get(
                f"/mas/v0.1/messages/{ref}/raw", headers={**crm, "Range": f"bytes={size}-"}
            ),
        }
        for status, answer in answers.items():
            assert answer.status_code == status, answer.text
            _conforms("get", raw, answer)
        assert len(answers[200].content) == size
        assert answers[206].headers["content-range"] == f"bytes 0-9/{size}"
        assert answers[416].headers["content-range"] == f"bytes */{size}"
        _conforms("head", raw, client.head(f"/mas/v0.1/messages/{ref}/raw", headers=crm))
        none = client.get(f"/mas/v0.1/messages/{ref}/attachments/0", headers=crm)
        assert none.json()["error"] == "unknown-message", none.text  # a mail without any
        _conforms("get", "/mas/v0.1/messages/{ref}/attachments/{n}", none)
        resend = "/mas/v0.1/intakes/{ref}/resend"
        got = client.post(f"/mas/v0.1/intakes/{intake['intake_ref']}/resend", headers=admin)
        assert got.status_code == 200, got.text
        _conforms("post", resend, got)
        assert got.json()["intake_ref"] == intake["intake_ref"]
        callback = {"Authorization": f"Bearer {live.tokens['callback']}"}
        forbidden = client.get(f"/mas/v0.1/messages/{ref}", headers=callback)
        assert forbidden.status_code == 403, forbidden.text
        _conforms("get", message, forbidden)
