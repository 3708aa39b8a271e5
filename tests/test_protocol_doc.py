"""docs/protocol.md: citations into it resolve, its examples hold, its status tables are data.

- Every citation ``docs/protocol.md §N`` (or ``protocol.md §N``, and the
  further ``§M`` of a list or range after it) in the code, the README, the
  docs, the conformance README, packaging/ and systemd/ names a section that
  exists; so do the document's own ``§N`` references.
- Every JSON example parses; every contract message among them validates
  against its type's schema in ``conformance/schema/``, and the gateway event
  against the event schema.
- Every exchange whose lead-in names a file of ``conformance/messages/`` is
  that file's message with its placeholders filled in, and its answer is the
  one the file expects; every message type has such an exchange in each
  direction it travels.
- The two status tables between markers are drawn from
  ``conformance/transitions.json``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from masd.core.wire import TYPES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "protocol.md"
SCHEMA_DIR = ROOT / "conformance" / "schema"
MESSAGE_DIR = ROOT / "conformance" / "messages"
TRANSITIONS = ROOT / "conformance" / "transitions.json"
MESSAGES_PATH = "/mas/v0.1/messages"

#: Where citations of the protocol document may live.
SCANNED = ("masd", "README.md", "docs", "conformance/README.md", "packaging", "systemd")

_NUMBER = r"\d+(?:\.\d+)*"
#: ``docs/protocol.md §4``, ``protocol.md §4.4, §5``, ``docs/protocol.md §13.3-§13.4``.
CITATION = re.compile(
    rf"(?:docs/)?protocol\.md §({_NUMBER})((?:(?:,| and|, and| or| /|-|–) ?§{_NUMBER})*)"
)
_MORE = re.compile(rf"§({_NUMBER})")
_SECTION = re.compile(r"^## (\d+)\. \S", re.M)
_SUBSECTION = re.compile(r"^### (\d+\.\d+) \S", re.M)
_OLD_CITATION = re.compile(r"\b(?:CONTRACT|PROFILE) ?§")


def sections(text: str) -> list[str]:
    """The section numbers of a document, in order: ``1``, ``1.1``, ``2`` ..."""
    found = [(m.start(), m.group(1)) for m in _SECTION.finditer(text)]
    found += [(m.start(), m.group(1)) for m in _SUBSECTION.finditer(text)]
    return [number for _, number in sorted(found)]


def citations(text: str) -> Iterator[tuple[int, str]]:
    """(line, section number) of every protocol.md citation in ``text``."""
    for match in CITATION.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        yield line, match.group(1)
        for more in _MORE.finditer(match.group(2)):
            yield line, more.group(1)


def scanned_files() -> Iterator[Path]:
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            yield path
            continue
        for file in sorted(path.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                yield file


def _text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


DOC_TEXT = DOC.read_text(encoding="utf-8")


# --------------------------------------------------------------------------- citations


def unresolved(text: str, known: set[str]) -> list[str]:
    return [f"line {line}: §{n}" for line, n in citations(text) if n not in known]


def test_the_citation_finder_reads_every_form() -> None:
    text = (
        "see docs/protocol.md §4.4 and protocol.md §9\n"
        "(docs/protocol.md §4, §5), docs/protocol.md §13.3-§13.4,\n"
        "docs/protocol.md §9 and §15; docs/protocol.md §6's order.\n"
        "docs/protocol.md §21 is not there, nor is protocol.md §4.9.\n"
    )
    assert list(citations(text)) == [
        (1, "4.4"),
        (1, "9"),
        (2, "4"),
        (2, "5"),
        (2, "13.3"),
        (2, "13.4"),
        (3, "9"),
        (3, "15"),
        (3, "6"),
        (4, "21"),
        (4, "4.9"),
    ]
    known = set(sections("## 4. A\n### 4.4 B\n## 9. C\n"))
    assert unresolved("protocol.md §4.4, §9 and docs/protocol.md §4.9", known) == ["line 1: §4.9"]


def test_the_sections_are_numbered_in_order() -> None:
    numbers = sections(DOC_TEXT)
    assert numbers, "docs/protocol.md has no numbered sections"
    top = [n for n in numbers if "." not in n]
    assert top == [str(i) for i in range(1, len(top) + 1)]
    for section in top:
        subs = [n for n in numbers if n.startswith(section + ".")]
        assert subs == [f"{section}.{i}" for i in range(1, len(subs) + 1)], section
    for i, number in enumerate(numbers[1:], 1):
        if "." in number:  # a subsection follows its section or its previous subsection
            assert numbers[i - 1].split(".")[0] == number.split(".")[0], number


def test_every_citation_of_the_protocol_document_resolves() -> None:
    known = set(sections(DOC_TEXT))
    problems = []
    count = 0
    for path in scanned_files():
        text = _text(path)
        count += len(list(citations(text)))
        problems += [f"{path.relative_to(ROOT)}: {p}" for p in unresolved(text, known)]
    assert not problems, "citations of sections docs/protocol.md does not have:\n" + "\n".join(
        problems
    )
    print(f"{count} citations of docs/protocol.md resolved")


def test_the_documents_own_references_resolve() -> None:
    known = set(sections(DOC_TEXT))
    missing = []
    for match in _MORE.finditer(DOC_TEXT):
        before = DOC_TEXT[max(0, match.start() - 16) : match.start()]
        if re.search(r"RFC \d+ $", before):
            continue  # a section of an RFC
        if match.group(1) not in known:
            line = DOC_TEXT.count("\n", 0, match.start()) + 1
            missing.append(f"line {line}: §{match.group(1)}")
    assert not missing, missing


def test_no_contract_or_profile_citation_is_left() -> None:
    left = []
    for path in scanned_files():
        for number, line in enumerate(_text(path).splitlines(), 1):
            if _OLD_CITATION.search(line):
                left.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not left, f"{len(left)} lines still cite CONTRACT or PROFILE:\n" + "\n".join(left)


# --------------------------------------------------------------------------- the examples


@dataclass(frozen=True)
class Block:
    """A fenced code block of the document, with the prose since the previous block."""

    lang: str
    text: str
    line: int
    lead: str


def blocks(text: str) -> list[Block]:
    out = []
    end = 0
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S):
        line = text.count("\n", 0, match.start()) + 1
        out.append(Block(match.group(1), match.group(2), line, text[end : match.start()]))
        end = match.end()
    return out


@dataclass(frozen=True)
class Http:
    """An ``http`` block: a request (``method``, ``path``) or an answer (``status``)."""

    block: Block
    method: str
    path: str
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def is_request(self) -> bool:
        return bool(self.method)


def parse_http(block: Block) -> Http:
    head, _, raw = block.text.partition("\n\n")
    first, *rest = head.splitlines()
    headers = {}
    for line in rest:
        name, sep, value = line.partition(":")
        assert sep, f"line {block.line}: {line!r} is not a header"
        headers[name.strip().lower()] = value.strip()
    body = json.loads(raw) if raw.strip() else None
    answer = re.fullmatch(r"HTTP/1\.1 (\d{3}) .+", first)
    if answer:
        return Http(block, "", "", int(answer.group(1)), headers, body)
    request = re.fullmatch(r"(GET|POST) (/\S*) HTTP/1\.1", first)
    assert request, f"line {block.line}: {first!r} is neither a request nor an answer line"
    return Http(block, request.group(1), request.group(2), 0, headers, body)


BLOCKS = blocks(DOC_TEXT)
HTTP = [parse_http(b) for b in BLOCKS if b.lang == "http"]


def _registry() -> Registry:
    resources = []
    for path in sorted(SCHEMA_DIR.glob("*.schema.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        resources.append((contents["$id"], Resource.from_contents(contents, DRAFT202012)))
    return Registry().with_resources(resources)


REGISTRY = _registry()


def validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text(encoding="utf-8"))
    return Draft202012Validator(schema, registry=REGISTRY)


EVENT = validator("mas-event-v0.1")
EVENT_FIELDS = set(EVENT.schema["required"])


def json_examples() -> list[tuple[Block, Any]]:
    """Every JSON value the document shows: ``json`` blocks and ``http`` bodies."""
    out = [(b, json.loads(b.text)) for b in BLOCKS if b.lang == "json"]
    out += [(h.block, h.body) for h in HTTP if h.body is not None]
    return out


def test_the_document_has_examples() -> None:
    assert len(HTTP) >= 20
    assert len(json_examples()) >= 25


def test_every_json_example_parses() -> None:
    # json_examples() raises on the first one that does not; name it instead.
    for block in BLOCKS:
        if block.lang == "json":
            try:
                json.loads(block.text)
            except ValueError as exc:
                pytest.fail(f"line {block.line}: {exc}")


def schema_for(value: Any) -> Draft202012Validator | None:
    if isinstance(value, dict) and "mas_modes_version" in value:
        assert value.get("type") in TYPES, f"{value.get('type')!r} is not a message type"
        return validator(value["type"])
    if isinstance(value, dict) and EVENT_FIELDS <= value.keys():
        return EVENT
    return None


def test_every_message_and_event_example_validates() -> None:
    checked = 0
    for block, value in json_examples():
        check = schema_for(value)
        if check is None:
            continue
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in check.iter_errors(value)
        ]
        assert not errors, f"line {block.line}: {errors}"
        checked += 1
    assert checked >= 20


# --------------------------------------------------------------------------- exchanges and files

_FILE_NAME = re.compile(r"(?<![\w./-])((?:valid/|invalid/)?[a-z0-9][a-z0-9-]*)\.json\b")
_PLACEHOLDER = re.compile(r"\$\{([a-z_]+)\}")


def cited_file(block: Block) -> tuple[str, dict[str, Any]] | None:
    """The conformance message file the prose before ``block`` names last, if any."""
    names = _FILE_NAME.findall(block.lead)
    if not names:
        return None
    name = names[-1]
    if "/" in name:
        paths = [MESSAGE_DIR / f"{name}.json"]
    else:
        paths = [MESSAGE_DIR / d / f"{name}.json" for d in ("valid", "invalid")]
    found = [p for p in paths if p.is_file()]
    assert len(found) == 1, f"line {block.line}: {name}.json is not one file of {MESSAGE_DIR}"
    path = found[0]
    return f"{path.parent.name}/{path.stem}", json.loads(path.read_text(encoding="utf-8"))


def match(pattern: Any, value: Any, bound: dict[str, str], where: str = "") -> None:
    """``value`` is ``pattern`` with its ``${name}`` placeholders filled in, consistently."""
    if isinstance(pattern, str) and _PLACEHOLDER.search(pattern):
        assert isinstance(value, str), f"{where}: {value!r} is not a string"
        regex, names = "", []
        for i, part in enumerate(_PLACEHOLDER.split(pattern)):
            if i % 2 == 0:
                regex += re.escape(part)
            elif part in bound:
                regex += re.escape(bound[part])
            elif part in names:
                regex += f"(?P={part})"
            else:
                names.append(part)
                regex += f"(?P<{part}>.+?)"
        found = re.fullmatch(regex, value)
        assert found, f"{where}: {value!r} is not {pattern!r} (with {bound})"
        bound.update({n: found.group(n) for n in names})
    elif isinstance(pattern, dict):
        assert isinstance(value, dict), f"{where}: {value!r} is not an object"
        assert pattern.keys() == value.keys(), (
            f"{where}: keys {sorted(value)}, not {sorted(pattern)}"
        )
        for key in pattern:
            match(pattern[key], value[key], bound, f"{where}.{key}")
    elif isinstance(pattern, list):
        assert isinstance(value, list), f"{where}: {value!r} is not a list"
        assert len(value) == len(pattern), f"{where}: {len(value)} items, not {len(pattern)}"
        for i, (p, v) in enumerate(zip(pattern, value, strict=True)):
            match(p, v, bound, f"{where}[{i}]")
    else:
        assert type(value) is type(pattern), f"{where}: {value!r} is not a {type(pattern)}"
        assert value == pattern, f"{where}: {value!r} != {pattern!r}"


def exchanges() -> Iterator[tuple[Http, Http | None]]:
    """Each POST request with the answer right after it (None if there is none)."""
    for i, h in enumerate(HTTP):
        if h.is_request and h.method == "POST":
            after = HTTP[i + 1] if i + 1 < len(HTTP) else None
            answer = after if after is not None and not after.is_request else None
            if answer is not None and BLOCKS.index(answer.block) != BLOCKS.index(h.block) + 1:
                answer = None
            yield h, answer


def test_every_request_has_its_answer() -> None:
    for request, answer in exchanges():
        assert answer is not None, f"line {request.block.line}: a request with no answer after it"
        assert request.headers.get("content-type") == "application/json", request.block.line
        assert isinstance(request.body, dict), request.block.line
        assert isinstance(answer.body, dict), answer.block.line
    for h in HTTP:
        if not h.is_request:
            assert isinstance(h.body, dict), h.block.line
            assert isinstance(h.body.get("ok"), bool), h.block.line
            if h.status >= 400:
                assert h.body["ok"] is False, h.block.line
                assert isinstance(h.body.get("error"), str), h.block.line
                assert isinstance(h.body.get("detail"), str), h.block.line
            else:
                assert h.body["ok"] is True, h.block.line


def check_answer(name: str, doc: dict[str, Any], answer: Http, bound: dict[str, str]) -> None:
    expect = doc.get("expect")
    where = f"line {answer.block.line} ({name})"
    if doc["direction"] == "from-email":
        assert answer.status == 200, where
        assert answer.body == {"ok": True}, where
    elif name.startswith("valid/"):
        if expect is None:
            assert answer.status == 200, where
            assert answer.body.get("ok") is True, where
        else:
            assert answer.status == expect["status"], where
            match(expect["body"], answer.body, bound, where)
    else:
        assert expect is not None, f"{where}: an invalid file without expect"
        assert answer.status == expect["status"], where
        assert answer.body.get("error") == expect["error"], where
        assert answer.body.get("reason") == expect.get("reason"), where
        names = expect["detail_names"]
        options = [names] if isinstance(names, str) else names
        assert any(n in answer.body["detail"] for n in options), (
            f"{where}: detail names none of {options}"
        )


def check_headers(name: str, doc: dict[str, Any], request: Http) -> None:
    where = f"line {request.block.line} ({name})"
    changes = {k.lower(): v for k, v in (doc.get("headers") or {}).items()}
    for header in ("authorization", "content-type"):
        if header in changes and changes[header] is None:
            assert header not in request.headers, f"{where}: {header} should be left out"
        elif header in changes:
            assert request.headers.get(header) == changes[header], where
        else:
            assert header in request.headers, f"{where}: no {header} header"
    if doc["direction"] == "to-email" and "authorization" not in changes:
        secret = request.headers["authorization"]
        sender = doc.get("sender")
        assert re.fullmatch(rf"Bearer <{sender} secret>|Bearer <callback secret>", secret), where


def test_exchanges_are_their_conformance_files() -> None:
    checked = 0
    for request, answer in exchanges():
        cited = cited_file(request.block)
        if cited is None:
            continue
        name, doc = cited
        where = f"line {request.block.line} ({name})"
        assert (request.path == MESSAGES_PATH) == (doc["direction"] == "to-email"), where
        bound: dict[str, str] = {}
        match(doc["message"], request.body, bound, where)
        check_headers(name, doc, request)
        assert answer is not None
        check_answer(name, doc, answer, bound)
        checked += 1
    for block, value in json_examples():
        cited = cited_file(block) if block.lang == "json" else None
        if cited is not None and isinstance(value, dict) and "mas_modes_version" in value:
            match(cited[1]["message"], value, {}, f"line {block.line} ({cited[0]})")
            checked += 1
    assert checked >= 20


def directions() -> set[tuple[str, str]]:
    """(type, "to-email" or "from-email") for every way each message type travels."""
    out = set()
    for mtype, senders in TYPES.items():
        for sender in senders.split("|"):
            out.add((mtype, "from-email" if sender == "email" else "to-email"))
    return out


def test_every_type_has_an_exchange_in_each_direction() -> None:
    shown = set()
    for request, _ in exchanges():
        cited = cited_file(request.block)
        if cited is not None and cited[0].startswith("valid/"):
            direction = "to-email" if request.path == MESSAGES_PATH else "from-email"
            shown.add((request.body["type"], direction))
    assert shown == directions(), f"missing: {sorted(directions() - shown)}"


# --------------------------------------------------------------------------- the status tables


def _table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TRANSITIONS.read_text(encoding="utf-8"))
    return data


def render_transitions(table: dict[str, Any]) -> str:
    lines = ["| from | allowed next statuses |", "| --- | --- |"]
    for source, targets in table["transitions"].items():
        lines.append(f"| {source} | {', '.join(targets)} |")
    return "\n".join(lines) + "\n"


def _fields(spec: Any) -> str:
    if isinstance(spec, dict):
        return "; ".join(f"`{name}`: {_fields(value)}" for name, value in spec.items())
    if isinstance(spec, list):
        return " \\| ".join(f"`{v}`" for v in spec)
    return str(spec)


def render_statuses(table: dict[str, Any]) -> str:
    lines = ["| status | terminal | recorded by | fields |", "| --- | --- | --- | --- |"]
    for status in table["statuses"]:
        terminal = "yes" if status in table["terminal"] else "no"
        who = ", ".join(table["recorded_by"][status]).replace("timeout-owner", "timeout owner")
        fields = _fields(table["fields"].get(status, {})) or "-"
        lines.append(f"| `{status}` | {terminal} | {who} | {fields} |")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("marker", "render"),
    [("transitions", render_transitions), ("statuses", render_statuses)],
)
def test_status_tables_are_drawn_from_transitions_json(marker: str, render: Any) -> None:
    block = re.search(rf"<!-- {marker}:begin -->\n(.*?)<!-- {marker}:end -->", DOC_TEXT, re.S)
    assert block is not None, f"docs/protocol.md has no {marker} markers"
    expected = render(_table())
    assert block.group(1) == expected, f"replace the {marker} table with:\n{expected}"


def test_the_transitions_table_reads_back_as_the_data() -> None:
    # The rendering itself: every row parses back to the table's own lists.
    rows = {}
    for line in render_transitions(_table()).splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = [s.strip() for s in cells[1].split(",")]
    assert rows == _table()["transitions"]
