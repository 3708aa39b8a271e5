"""Conformance messages (docs/protocol.md §8, §9): the schemas, and masd's answer to each file.

``conformance/messages/{valid,invalid}/*.json`` are described in
``conformance/messages/README.md``.  Here:

- every schema is a valid draft 2020-12 schema; every valid file validates
  against its type's schema, and loses that when any required field is
  dropped; every invalid file marked ``schema_fault`` is refused by the
  schema, and every other one is not (so the mark is right);
- every ``to-email`` file is played against one masd (``masd.app.App`` in
  this process, on loopback, with fake peers and an SMTP sink): the state the
  file's ``given`` names is built through the real paths (mail over LMTP,
  ``case.assign`` over HTTP), ``before`` is posted, then the message; the
  answer must be exactly the file's ``expect``;
- what masd itself sends to its peers (handoff.request, handoff.update,
  handoff.cancel, the handoff.status relay, case.intake, case.message,
  handoff.requested) validates against the same schemas.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import secrets
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from support.masd_process import free_port, mx_mail

from masd.app import App
from masd.config import load_config
from masd.core.wire import MAY_SEND, TYPES
from masd.testing import lmtpclient
from masd.testing.peers import FakePeer, Recorded, SmtpSink

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_DIR = ROOT / "conformance" / "schema"
MESSAGE_DIR = ROOT / "conformance" / "messages"
MESSAGES_PATH = "/mas/v0.1/messages"
DOMAIN = "help.example"
AUTHSERV_ID = "mx.help.example"
WAIT = 20.0  # the bound of every wait for something masd does on its own

#: Files masd answers otherwise than docs/protocol.md §9 says (the file is right), with
#: the (status, error) masd gives today.  The test checks masd still answers
#: exactly that, so an entry fails once masd is fixed and must then go.
KNOWN_DISAGREEMENTS: dict[str, tuple[int, str]] = {}

T = TypeVar("T")


# --------------------------------------------------------------------------- the files


def _load(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {"_error": f"{path.name}: {exc}"}
    return doc if isinstance(doc, dict) else {"_error": f"{path.name}: not a JSON object"}


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


FILES: dict[str, dict[str, Any]] = {
    _name(p): _load(p) for p in sorted(MESSAGE_DIR.glob("*/*.json"))
}
VALID = sorted(n for n in FILES if n.startswith("valid/"))
INVALID = sorted(n for n in FILES if n.startswith("invalid/"))
TO_EMAIL = sorted(n for n, d in FILES.items() if d.get("direction") == "to-email")
SCHEMA_FAULTS = sorted(n for n in INVALID if FILES[n].get("expect", {}).get("schema_fault"))
SCHEMA_SOUND = sorted(
    n for n in INVALID if n not in SCHEMA_FAULTS and isinstance(FILES[n].get("message"), dict)
)

#: docs/protocol.md §8: who sends each type, as (direction, sender) pairs.
DIRECTIONS: dict[str, set[tuple[str, str]]] = {
    "handoff.request": {("from-email", "email")},
    "handoff.update": {("from-email", "email")},
    "handoff.cancel": {("from-email", "email"), ("to-email", "master")},
    "handoff.status": {("to-email", "mode"), ("to-email", "webhook"), ("from-email", "email")},
    "case.intake": {("from-email", "email")},
    "case.assign": {("to-email", "master")},
    "case.message": {("from-email", "email")},
    "case.policy": {("to-email", "master")},
    "handoff.requested": {("from-email", "email")},
    "mail.send": {("to-email", "master")},
}

#: docs/protocol.md §9, every refusal in its order of checks (and §5's mail.send reasons).
PROFILE_REFUSALS = (
    (401, "unauthenticated"),
    (415, "unsupported-media-type"),
    (413, "too-large"),
    (400, "invalid-message"),
    (400, "unsupported-version"),
    (400, "unknown-type"),
    (403, "forbidden"),
    (404, "unknown-case"),
    (404, "unknown-handoff"),
    (404, "unknown-intake"),
    (409, "invalid-transition"),
    (409, "already-assigned"),
    (422, "refused"),
)
SEND_REFUSALS = (
    "unauthenticated-sender",
    "automated-sender",
    "send-cap-reached",
    "unknown-message",
)

STATES = ("none", "master-handoff", "slave-intake", "slave-case", "slave-transfer", "slave-blocked")
PEERS = {"mode": ("callback", "chat"), "master": ("crm", "other"), "webhook": ("transfer",)}
DEFAULT_PEER = {"mode": "callback", "master": "crm", "webhook": "transfer"}

_PLACEHOLDER = re.compile(r"\$\{([a-z_]+)\}")


def substitute(value: T, bindings: dict[str, str]) -> T:
    """Replace every ``${name}`` in the strings of ``value``; an unknown name is an error."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in bindings:
            raise KeyError(f"placeholder ${{{name}}} is not bound in this state")
        return bindings[name]

    if isinstance(value, str):
        return _PLACEHOLDER.sub(one, value)  # type: ignore[return-value]
    if isinstance(value, list):
        return [substitute(v, bindings) for v in value]  # type: ignore[return-value]
    if isinstance(value, dict):
        return {k: substitute(v, bindings) for k, v in value.items()}  # type: ignore[return-value]
    return value


def sample_bindings(state: str) -> dict[str, str]:
    """Plausible values for each placeholder, to check a file offline against its schema."""
    slave = state.startswith("slave")
    return {
        "case_address": "case=CRM-1@help.example" if slave else "ticket=gs-1@help.example",
        "case_key": "case=crm-1@help.example" if slave else "ticket=gs-1@help.example",
        "handoff_id": "9f1c2d3e4a5b60718293a4b5c6d7e8f9",
        "message_ref": "0d1e2f3a4b5c6d7e8f90a1b2c3d4e5f6",
        "intake_ref": "intake-5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b",
        "resource_id": "CRM-1",
        "webhook_url": "http://127.0.0.1:9003/hooks/transfer",
        "webhook_origin": "http://127.0.0.1:9003",
        "secret": "sample-secret",
        "admin_secret": "sample-admin-secret",
    }


def file_state(doc: dict[str, Any]) -> str:
    given = doc.get("given") or {}
    return str(given.get("state", "none"))


# --------------------------------------------------------------------------- schemas


def _registry() -> Registry:
    resources = []
    for path in sorted(SCHEMA_DIR.glob("*.schema.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        resources.append((contents["$id"], Resource.from_contents(contents, DRAFT202012)))
    return Registry().with_resources(resources)


REGISTRY = _registry()
SCHEMA_BASE = "https://mas.example/schema/"


def validator(mtype: str) -> Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / f"{mtype}.schema.json").read_text(encoding="utf-8"))
    return Draft202012Validator(schema, registry=REGISTRY)


VALIDATORS = {t: validator(t) for t in TYPES}


def schema_errors(message: Any) -> list[str]:
    """Why ``message`` fails its type's schema (the envelope's when the type is unknown)."""
    mtype = message.get("type") if isinstance(message, dict) else None
    check = VALIDATORS.get(mtype) if isinstance(mtype, str) else None
    if check is None:
        check = validator("envelope")
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message[:160]}"
        for e in check.iter_errors(message)
    ]


def test_every_schema_is_a_valid_draft_2020_12_schema() -> None:
    names = sorted(p.name for p in SCHEMA_DIR.glob("*.schema.json"))
    assert names == sorted(
        [f"{t}.schema.json" for t in TYPES] + ["envelope.schema.json", "mas-event-v0.1.schema.json"]
    )
    for name in names:
        schema = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
        Draft202012Validator.check_schema(schema)
        assert schema["$id"] == SCHEMA_BASE + name


def test_the_schemas_bounds_are_masds() -> None:
    """The schema's bounds are the ones masd's decoder enforces (docs/protocol.md §9)."""
    from masd.core import wire

    env = json.loads((SCHEMA_DIR / "envelope.schema.json").read_text(encoding="utf-8"))
    defs = env["$defs"]
    assert defs["id"]["pattern"] == f"^[!-~]{{1,{wire.MAX_ID}}}$"
    assert defs["token"]["maxLength"] == wire.MAX_TOKEN
    assert defs["url"]["maxLength"] == wire.MAX_URL
    assert set(defs["refuse_reason"]["enum"]) == set(wire.REFUSE_REASONS)
    assert env["properties"]["type"]["enum"] == list(TYPES)
    status = json.loads((SCHEMA_DIR / "handoff.status.schema.json").read_text(encoding="utf-8"))
    props = status["properties"]
    assert props["seq"]["maximum"] == wire.MAX_SEQ
    assert props["needs"]["maxItems"] == wire.MAX_NEEDS
    assert props["detail"]["maxLength"] == wire.MAX_DETAIL
    send = json.loads((SCHEMA_DIR / "mail.send.schema.json").read_text(encoding="utf-8"))
    assert send["properties"]["subject"]["maxLength"] == wire.MAX_SUBJECT
    assert send["properties"]["body"]["maxLength"] == wire.MAX_BODY
    table = json.loads((ROOT / "conformance" / "transitions.json").read_text(encoding="utf-8"))
    assert props["status"]["enum"] == table["statuses"]


# --------------------------------------------------------------------------- the files' form

_TOP = {
    "description",
    "clauses",
    "direction",
    "type",
    "sender",
    "peer",
    "recipient",
    "given",
    "before",
    "message",
    "headers",
    "raw_body",
    "expect",
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_file_form(name: str) -> None:
    """Each file follows conformance/messages/README.md."""
    doc = FILES[name]
    assert "_error" not in doc, doc.get("_error")
    assert set(doc) <= _TOP, f"unknown keys {sorted(set(doc) - _TOP)}"
    assert isinstance(doc.get("description"), str)
    assert doc["description"].strip()
    assert doc.get("direction") in ("to-email", "from-email")
    assert doc.get("type") in TYPES or name.startswith("invalid/")
    sender = doc.get("sender")
    if doc["direction"] == "from-email":
        assert sender == "email"
        assert name.startswith("valid/"), "a from-email file is an example of what email sends"
        assert doc.get("recipient") in ("mode", "master", "webhook")
        assert set(doc) & {"given", "before", "headers", "raw_body", "expect"} == set()
    else:
        assert sender in PEERS, sender
        assert doc.get("peer", DEFAULT_PEER[sender]) in PEERS[sender]
        assert file_state(doc) in STATES
    assert isinstance(doc.get("message"), dict) or "raw_body" in doc
    if isinstance(doc.get("message"), dict) and isinstance(doc.get("type"), str):
        assert doc["message"].get("type") in (doc["type"], None) or name.startswith("invalid/")
    expect = doc.get("expect")
    if name.startswith("invalid/"):
        assert isinstance(expect, dict)
        assert isinstance(expect.get("status"), int)
        assert 400 <= expect["status"] < 500
        assert (expect["status"], expect.get("error")) in PROFILE_REFUSALS
        names = expect.get("detail_names")
        assert isinstance(names, str) or (
            isinstance(names, list) and names and all(isinstance(n, str) for n in names)
        )
        assert isinstance(expect.get("schema_fault"), bool)
        if expect["error"] == "refused":
            assert expect.get("reason") in SEND_REFUSALS
    elif expect is not None:
        assert set(expect) <= {"status", "body"}
        assert 200 <= expect["status"] < 300
        assert isinstance(expect["body"], dict)
    for step in doc.get("before", []):
        assert set(step) <= {"sender", "peer", "message", "expect"}
        assert step["sender"] in PEERS
        assert isinstance(step["message"], dict)
        assert isinstance(step["expect"]["status"], int)


def _ids_by_peer(name: str) -> set[tuple[str, str]]:
    doc = FILES[name]
    out: set[tuple[str, str]] = set()
    steps = [*doc.get("before", []), doc]
    for step in steps:
        message = step.get("message")
        if isinstance(message, dict) and isinstance(message.get("id"), str):
            sender = str(step.get("sender"))
            out.add((str(step.get("peer", DEFAULT_PEER.get(sender, sender))), message["id"]))
    return out


def test_message_ids_are_unique_across_files() -> None:
    """One masd plays every file, and it keeps (peer, id) for idempotency (docs/protocol.md §9)."""
    seen: dict[tuple[str, str], str] = {}
    for name in TO_EMAIL:
        for key in _ids_by_peer(name):
            assert key not in seen, f"{name} reuses id {key[1]!r} of {seen[key]} (peer {key[0]})"
            seen[key] = name


def test_the_files_cover_every_type_direction_and_refusal() -> None:
    assert len(FILES) >= 80, len(FILES)
    pairs = {(d["type"], (d["direction"], d["sender"])) for n, d in FILES.items() if n in VALID}
    for mtype, wanted in DIRECTIONS.items():
        for direction in wanted:
            assert (mtype, direction) in pairs, f"no valid {mtype} {direction}"
    assert {FILES[n]["type"] for n in INVALID} >= set(TYPES), "an invalid file of every type"
    refusals = {(FILES[n]["expect"]["status"], FILES[n]["expect"]["error"]) for n in INVALID}
    assert refusals == set(PROFILE_REFUSALS)
    reasons = {FILES[n]["expect"].get("reason") for n in INVALID}
    assert set(SEND_REFUSALS) <= reasons
    bodies = [FILES[n].get("expect", {}).get("body") for n in VALID]
    assert {"ok": True, "ignored": "stale"} in bodies, "a stale status (docs/protocol.md §7)"
    assert any(FILES[n].get("before") for n in VALID if n in TO_EMAIL), "a repeated id"
    # Every peer kind sends a type it may not send, and is refused (docs/protocol.md §9's 403).
    forbidden_senders = {
        FILES[n]["sender"]
        for n in INVALID
        if FILES[n]["expect"]["error"] == "forbidden"
        and FILES[n]["type"] not in MAY_SEND[FILES[n]["sender"]]
    }
    assert forbidden_senders == set(PEERS)


# --------------------------------------------------------------------------- offline: schemas


@pytest.mark.parametrize("name", VALID)
def test_valid_file_validates(name: str) -> None:
    doc = FILES[name]
    message = substitute(doc["message"], sample_bindings(file_state(doc)))
    assert schema_errors(message) == []
    if message["type"] == "case.message":
        # docs/protocol.md §15: the event's message_ref is the message's message_ref.
        assert message["event"]["message_ref"] == message["message_ref"]


@pytest.mark.parametrize("name", VALID)
def test_valid_file_loses_validity_without_a_required_field(name: str) -> None:
    """Each field a schema requires is checked: dropping it is refused."""
    doc = FILES[name]
    message = substitute(doc["message"], sample_bindings(file_state(doc)))
    required = _required(message["type"])
    assert {"mas_modes_version", "type", "id"} <= required
    for field in sorted(required):
        if field == "type":
            continue  # without a type, the envelope schema is what applies (checked below)
        cut = {k: v for k, v in message.items() if k != field}
        assert schema_errors(cut), f"{name} still validates without {field}"
    assert schema_errors({k: v for k, v in message.items() if k != "type"})


def _required(mtype: str) -> set[str]:
    """Every property name the type's schema requires (its own, the envelope's, ``if``s aside)."""
    schema = json.loads((SCHEMA_DIR / f"{mtype}.schema.json").read_text(encoding="utf-8"))
    env = json.loads((SCHEMA_DIR / "envelope.schema.json").read_text(encoding="utf-8"))
    return set(schema.get("required", [])) | set(env["required"])


@pytest.mark.parametrize("name", SCHEMA_FAULTS)
def test_schema_fault_is_refused_by_the_schema(name: str) -> None:
    doc = FILES[name]
    message = substitute(doc["message"], sample_bindings(file_state(doc)))
    assert schema_errors(message), f"{name}: the schema accepts what the file calls a fault"


@pytest.mark.parametrize("name", SCHEMA_SOUND)
def test_other_refusals_are_not_schema_faults(name: str) -> None:
    """A file not marked ``schema_fault`` is refused for another reason: its body validates."""
    doc = FILES[name]
    message = substitute(doc["message"], sample_bindings(file_state(doc)))
    assert schema_errors(message) == []


# --------------------------------------------------------------------------- one masd for all


def build_mail(sender: str, rcpt: str, **kw: Any) -> tuple[str, bytes]:
    """A mail as the MX hands it over (see ``mx_mail``), with this suite's defaults."""
    kw.setdefault("subject", "Printer jams")
    kw.setdefault("body", "Please call me back.\n")
    return mx_mail(sender, rcpt, **kw)


def raw_body(recipe: Any) -> bytes:
    """``raw_body``: a string (sent as UTF-8), ``{"text", "encoding"}``, or
    ``{"prefix", "fill", "size"}``: ``prefix`` then ``fill`` repeated, cut at ``size`` octets."""
    if isinstance(recipe, str):
        return recipe.encode("utf-8")
    if "text" in recipe:
        return str(recipe["text"]).encode(str(recipe["encoding"]))
    prefix = str(recipe.get("prefix", "")).encode("utf-8")
    fill = str(recipe["fill"]).encode("utf-8")
    size = int(recipe["size"])
    body = prefix + fill * ((size - len(prefix)) // len(fill) + 1)
    return body[:size]


class Masd:
    """masd (``App``) on loopback in a thread of its own, with its peers and SMTP relay.

    Tests hand coroutines to :meth:`call`; everything runs on masd's loop.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="masd", daemon=True)
        self.counter = itertools.count(1)
        self.secrets = {
            name: f"{name}-{secrets.token_hex(12)}"
            for name in ("admin", "callback", "chat", "crm", "other", "transfer")
        }

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self.peers: dict[str, FakePeer] = {}
        for name in ("callback", "chat", "crm", "other", "transfer"):
            self.peers[name] = await FakePeer().start()
        self.sink = await SmtpSink().start()
        secret_dir = self.directory / "secrets"
        secret_dir.mkdir()
        for name, value in self.secrets.items():
            path = secret_dir / f"{name}.token"
            path.write_text(value + "\n")
            path.chmod(0o600)
        self.webhook_base = self.peers["transfer"].url + "hooks/"
        p = {name: peer.url for name, peer in self.peers.items()}
        lmtp_port, http_port = free_port(), free_port()
        while http_port == lmtp_port:
            http_port = free_port()
        config = self.directory / "masd.toml"
        config.write_text(
            f"""\
[server]
lmtp = "127.0.0.1:{lmtp_port}"
http = "127.0.0.1:{http_port}"
database = "masd.db"
smtp_relay = "127.0.0.1:{self.sink.port}"
trusted_authserv_ids = ["{AUTHSERV_ID}"]
admin_token_file = "secrets/admin.token"
retry_for = "1h"

[domains."{DOMAIN}".types.ticket]
role = "master"
modes = ["callback", "chat"]
id_prefix = "gs-"

[domains."{DOMAIN}".types.ticket.endpoints.callback]
url = "{p["callback"]}mas"
token_file = "secrets/callback.token"
deadline = "1h"
fields = ["phone"]

[domains."{DOMAIN}".types.ticket.endpoints.chat]
url = "{p["chat"]}mas"
token_file = "secrets/chat.token"
deadline = "2s"

[domains."{DOMAIN}".types.case]
role = "slave"
master = {{ url = "{p["crm"]}mas", token_file = "secrets/crm.token" }}
policy = {{ autonomous_send = false, transfers = "block" }}
send_cap = {{ per_case = 2, per_recipient_per_day = 10 }}

[[domains."{DOMAIN}".types.case.webhooks]]
url = "{self.webhook_base}"
token_file = "secrets/transfer.token"
fields = ["phone"]

[domains."{DOMAIN}".types.order]
role = "slave"
master = {{ url = "{p["other"]}mas", token_file = "secrets/other.token" }}

[domains."other.example".types.case]
role = "slave"
master = {{ url = "{p["other"]}mas", token_file = "secrets/other.token" }}
"""
        )
        self.app = App(load_config(config))
        listening = await self.app.start()
        self.lmtp = listening.lmtp.sockets[0].getsockname()[:2]
        http = listening.http.addresses[0]
        assert isinstance(http, tuple)
        self.client = httpx.AsyncClient(base_url=f"http://{http[0]}:{http[1]}", timeout=30)

    async def stop(self) -> None:
        """Close whatever :meth:`start` got as far as starting."""
        if hasattr(self, "client"):
            await self.client.aclose()
        if hasattr(self, "app"):
            await self.app.stop()
        for peer in getattr(self, "peers", {}).values():
            await peer.close()
        if hasattr(self, "sink"):
            await self.sink.close()

    # ---------------------------------------------------------------- real paths

    async def mail(self, sender: str, rcpt: str, *, null_sender: bool = False, **kw: Any) -> str:
        """Deliver a mail over LMTP (it must be accepted); returns its Message-ID."""
        message_id, raw = build_mail(sender, rcpt, **kw)
        result = await lmtpclient.deliver(self.lmtp, "" if null_sender else sender, [rcpt], raw)
        (got,) = result.recipients
        assert got.delivered, f"LMTP {rcpt}: {got.final.code} {got.final.text}"
        return message_id

    async def row(self, sql: str, *params: Any) -> tuple[Any, ...]:
        assert self.app.store is not None
        found = await self.app.store.read(lambda db: db.execute(sql, params).fetchone())
        assert found is not None, f"nothing for {sql} {params}"
        return tuple(found)

    def headers(self, sender: str, peer: str | None) -> dict[str, str]:
        name = peer or DEFAULT_PEER[sender]
        return {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self.secrets[name]}",
        }

    async def post(
        self,
        sender: str,
        peer: str | None,
        message: Any,
        *,
        headers: dict[str, str | None] | None = None,
        body: bytes | None = None,
    ) -> httpx.Response:
        sent: dict[str, str] = self.headers(sender, peer)
        for name, value in (headers or {}).items():
            sent.pop(name, None)
            if value is not None:
                sent[name] = value
        content = body if body is not None else json.dumps(message).encode("utf-8")
        return await self.client.post(MESSAGES_PATH, content=content, headers=sent)

    async def given(self, spec: dict[str, Any]) -> dict[str, str]:
        """Build the state ``spec`` names through the real paths; returns its bindings."""
        state = spec.get("state", "none")
        opening = dict(spec.get("mail", {}))
        n = next(self.counter)
        b = {
            "webhook_url": self.webhook_base + "transfer",
            "webhook_origin": self.webhook_base.removesuffix("/hooks/"),
            "admin_secret": self.secrets["admin"],
        }
        if state == "none":
            return b
        participant = f"p{n}-{secrets.token_hex(3)}@example.org"
        b["participant"] = participant
        if state == "master-handoff":
            mid = await self.mail(participant, f"ticket!callback@{DOMAIN}", **opening)
            ref, key = await self.row(
                "SELECT message_ref, case_key FROM messages WHERE message_id = ?", mid
            )
            (address,) = await self.row("SELECT address FROM cases WHERE key = ?", key)
            (handoff,) = await self.row("SELECT handoff_id FROM handoffs WHERE case_key = ?", key)
            return b | {
                "message_ref": ref,
                "case_key": key,
                "case_address": address,
                "handoff_id": handoff,
            }
        assert state in ("slave-intake", "slave-case", "slave-transfer", "slave-blocked"), state
        rid = f"CRM-{n}"
        b |= {
            "resource_id": rid,
            "case_address": f"case={rid}@{DOMAIN}",
            "case_key": f"case={rid.lower()}@{DOMAIN}",
        }
        mid = await self.mail(participant, f"case@{DOMAIN}", **opening)
        ref, intake = await self.row(
            "SELECT message_ref, intake_ref FROM messages WHERE message_id = ?", mid
        )
        b |= {"message_ref": ref, "intake_ref": intake}
        if state == "slave-intake":
            return b
        assign: dict[str, Any] = {
            "mas_modes_version": "0.1",
            "type": "case.assign",
            "id": f"given-{secrets.token_hex(8)}",
            "intake_ref": intake,
            "resource_id": rid,
        }
        if state == "slave-transfer":
            assign["policy"] = {"transfers": {"webhook": b["webhook_url"]}}
        answer = await self.post("master", "crm", assign)
        assert answer.status_code == 200, answer.text
        if state == "slave-transfer":
            await self.mail(
                participant, f"case={rid}!callback@{DOMAIN}", body="phone: +1 555 0100\n"
            )
            (handoff,) = await self.row(
                "SELECT handoff_id FROM handoffs WHERE case_key = ?", b["case_key"]
            )
            b["handoff_id"] = handoff
        if state == "slave-blocked":
            await self.mail(participant, f"case={rid}!callback@{DOMAIN}")
            requested = await self.wait_for(
                "crm",
                "handoff.requested",
                lambda m: (
                    m.get("type") == "handoff.requested" and m["case"]["key"] == b["case_key"]
                ),
            )
            b["handoff_id"] = requested["handoff_id"]
        return b

    async def play(self, doc: dict[str, Any]) -> tuple[httpx.Response, dict[str, str]]:
        """Build the file's state, post its ``before`` steps, then its message."""
        b = await self.given(doc.get("given") or {})
        for i, step in enumerate(doc.get("before", [])):
            peer = step.get("peer")
            b["secret"] = self.secrets[peer or DEFAULT_PEER[step["sender"]]]
            answer = await self.post(step["sender"], peer, substitute(step["message"], b))
            want = step["expect"]
            assert answer.status_code == want["status"], f"before[{i}]: {answer.text}"
            if "error" in want:
                assert answer.json().get("error") == want["error"], f"before[{i}]: {answer.text}"
        b["secret"] = self.secrets[doc.get("peer") or DEFAULT_PEER[doc["sender"]]]
        headers = substitute(doc.get("headers"), b)
        body = raw_body(substitute(doc["raw_body"], b)) if "raw_body" in doc else None
        message = substitute(doc.get("message"), b)
        answer = await self.post(
            doc["sender"], doc.get("peer"), message, headers=headers, body=body
        )
        return answer, b

    async def wait_for(
        self, peer: str, what: str, match: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        """The first JSON message ``peer`` received that ``match`` accepts (bounded wait)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + WAIT
        while True:
            for rec in self.peers[peer].requests:
                if isinstance(rec.json, dict) and match(rec.json):
                    return rec.json
            if loop.time() > until:
                got = [r.json.get("type") for r in self.peers[peer].requests if r.json]
                raise AssertionError(f"{peer} never received {what}; it got {got}")
            await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def masd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Masd]:
    running = Masd(tmp_path_factory.mktemp("conformance"))
    running.thread.start()
    try:
        running.call(running.start())
        yield running
    finally:
        try:
            running.call(running.stop())
            running.call(running.loop.shutdown_asyncgens())
        finally:
            running.loop.call_soon_threadsafe(running.loop.stop)
            running.thread.join(30)
            running.loop.close()


# --------------------------------------------------------------------------- played against masd


def check_answer(name: str, doc: dict[str, Any], answer: httpx.Response, b: dict[str, str]) -> None:
    try:
        body = answer.json()
    except ValueError:
        pytest.fail(f"{name}: {answer.status_code} with a body that is not JSON: {answer.text!r}")
    got = f"{answer.status_code} {body}"
    expect = doc.get("expect")
    if name.startswith("valid/"):
        if expect is None:
            assert answer.status_code == 200, got
            assert body.get("ok") is True, got
        else:
            assert answer.status_code == expect["status"], got
            assert body == substitute(expect["body"], b), got
        return
    assert expect is not None
    assert answer.status_code == expect["status"], got
    assert isinstance(body, dict), got
    assert body.get("ok") is False, got
    assert body.get("error") == expect["error"], got
    if "reason" in expect:
        assert body.get("reason") == expect["reason"], got
    names = expect["detail_names"]
    options = [names] if isinstance(names, str) else list(names)
    detail = str(body.get("detail", ""))
    assert any(n in detail for n in options), f"detail {detail!r} names none of {options}"


@pytest.mark.parametrize("name", TO_EMAIL)
def test_masd_answers_as_the_file_says(masd: Masd, name: str) -> None:
    doc = FILES[name]
    answer, b = masd.call(masd.play(doc))
    if name in KNOWN_DISAGREEMENTS:
        got = (answer.status_code, answer.json().get("error"))
        assert got == KNOWN_DISAGREEMENTS[name], (
            f"{name}: masd now answers {got}; if that is the file's expect, "
            "remove the file from KNOWN_DISAGREEMENTS"
        )
        return
    check_answer(name, doc, answer, b)


# --------------------------------------------------------------------------- what masd sends


@pytest.mark.slow
def test_what_masd_sends_validates(masd: Masd) -> None:
    """Drive masd so it sends every type it sends, then check each against its schema."""
    masd.call(_send_everything(masd))
    seen: dict[str, int] = {}
    for peer_name, peer in masd.peers.items():
        for rec in peer.requests:
            _check_outbound(masd, peer_name, rec)
            seen[rec.json["type"]] = seen.get(rec.json["type"], 0) + 1
    sent_by_email = {t for t, pairs in DIRECTIONS.items() if ("from-email", "email") in pairs}
    assert set(seen) == sent_by_email, seen


def _check_outbound(masd: Masd, peer_name: str, rec: Recorded) -> None:
    message = rec.json
    assert rec.method == "POST"
    assert rec.headers.get("content-type", "").startswith("application/json")
    # docs/protocol.md §9: "masd sends the same header to that peer".
    assert rec.headers.get("authorization") == f"Bearer {masd.secrets[peer_name]}"
    assert isinstance(message, dict), rec.body[:200]
    assert schema_errors(message) == [], (message.get("type"), schema_errors(message))
    if message["type"] in ("case.message",):
        # docs/protocol.md §15: event.message_ref equals the message's top-level message_ref.
        assert message["event"]["message_ref"] == message["message_ref"]


async def _send_everything(m: Masd) -> None:
    # Master role: handoff.request, then negotiation gives a handoff.update.
    b = await m.given({"state": "master-handoff"})
    case = {"address": b["case_address"], "key": b["case_key"]}
    request = await m.wait_for(
        "callback", "handoff.request", lambda j: j.get("handoff_id") == b["handoff_id"]
    )
    assert request["type"] == "handoff.request"
    # An added field of the master role (docs/protocol.md §8.6): the handoff's deadline.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", request["deadline_at"])
    negotiating = {
        "mas_modes_version": "0.1",
        "type": "handoff.status",
        "id": f"out-{secrets.token_hex(6)}",
        "case": case,
        "handoff_id": b["handoff_id"],
        "seq": 1,
        "status": "negotiating",
        "needs": ["phone"],
    }
    assert (await m.post("mode", "callback", negotiating)).status_code == 200
    await m.mail(b["participant"], b["case_address"], body="phone: +1 555 0199\n")
    await m.wait_for(
        "callback",
        "handoff.update",
        lambda j: j.get("type") == "handoff.update" and j.get("handoff_id") == b["handoff_id"],
    )
    # The deadline (2 s for chat): timed-out, and handoff.cancel to the mode.
    chat = f"p-chat-{secrets.token_hex(3)}@example.org"
    await m.mail(chat, f"ticket!chat@{DOMAIN}")
    cancel = await m.wait_for("chat", "handoff.cancel", lambda j: j.get("type") == "handoff.cancel")
    assert cancel["reason"] == "timed-out"
    # Slave role: case.intake with and without requested_mode, case.message.
    await m.given({"state": "slave-intake"})
    who = f"p-intake-{secrets.token_hex(3)}@example.org"
    await m.mail(who, f"case!callback@{DOMAIN}")
    await m.wait_for(
        "crm", "case.intake with a mode", lambda j: j.get("requested_mode") == "callback"
    )
    s = await m.given({"state": "slave-case"})
    await m.mail(s["participant"], s["case_address"], subject="More")
    await m.wait_for(
        "crm",
        "case.message",
        lambda j: j.get("type") == "case.message" and j["case"]["key"] == s["case_key"],
    )
    # transfers block: handoff.requested, not forwarded.
    await m.mail(s["participant"], f"case={s['resource_id']}!callback@{DOMAIN}")
    await m.wait_for(
        "crm",
        "handoff.requested (block)",
        lambda j: j.get("type") == "handoff.requested" and j["case"]["key"] == s["case_key"],
    )
    # A webhook: handoff.request to it, handoff.requested forwarded, the
    # status relayed to the master, and the master's cancel forwarded.
    t = await m.given({"state": "slave-transfer"})
    to_webhook = await m.wait_for(
        "transfer", "handoff.request", lambda j: j.get("handoff_id") == t["handoff_id"]
    )
    assert "deadline_at" not in to_webhook  # timeouts belong to the master
    tcase = {"address": t["case_address"], "key": t["case_key"]}
    running = {**negotiating, "id": f"out-{secrets.token_hex(6)}", "case": tcase}
    running |= {"handoff_id": t["handoff_id"], "status": "running"}
    del running["needs"]
    assert (await m.post("webhook", "transfer", running)).status_code == 200
    await m.wait_for(
        "crm",
        "handoff.status relay",
        lambda j: j.get("type") == "handoff.status" and j.get("handoff_id") == t["handoff_id"],
    )
    stop = {
        "mas_modes_version": "0.1",
        "type": "handoff.cancel",
        "id": f"out-{secrets.token_hex(6)}",
        "case": tcase,
        "handoff_id": t["handoff_id"],
        "reason": "customer-withdrew",
    }
    assert (await m.post("master", "crm", stop)).status_code == 200
    await m.wait_for(
        "transfer",
        "handoff.cancel",
        lambda j: j.get("type") == "handoff.cancel" and j.get("handoff_id") == t["handoff_id"],
    )
    # Blocked (docs/protocol.md §4): a !MODE from someone else than the participant.
    await m.mail(
        f"stranger-{secrets.token_hex(3)}@example.org", f"case={s['resource_id']}!chat@{DOMAIN}"
    )
    await m.wait_for("crm", "handoff.requested (blocked)", lambda j: j.get("reason") == "blocked")
    # Everything sent so far has arrived: the outbox is empty.
    await _outbox_drained(m)


async def _outbox_drained(m: Masd) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + WAIT
    while True:
        (pending,) = await m.row(
            "SELECT COUNT(*) FROM outbox WHERE state = 'pending' AND kind = 'contract'"
        )
        if pending == 0:
            return
        assert loop.time() < until, f"{pending} contract messages still pending"
        await asyncio.sleep(0.05)
