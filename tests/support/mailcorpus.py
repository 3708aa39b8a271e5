"""The real-mail corpus of tests/mail_corpus.json, and two readings of each message.

``messages(source, workdir)`` gives (id, raw bytes) of a source: read from the
directory its Debian package installs, or written at test time by its
program.  A missing package skips the test naming it (or fails it under
MASD_REQUIRE_SYSTEM_TESTS, as ``require_program`` does).

``masd_reading`` and ``stdlib_reading`` read one message into the same shape:
the event's fields as masd fills them, and as the standard library's ``email``
package (policy ``default``) reads the same message with the same selection
rules (docs/protocol.md §15.1) applied to its parse.  HTML is turned into
text by masd's one converter on both sides, so only the MIME reading differs.
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import itertools
import json
import os
import random
import subprocess
from collections.abc import Iterator
from email.message import EmailMessage, Message
from pathlib import Path
from typing import Any

import pytest

from masd.core.event import MAX_TEXT_BYTES, _address_key, build_event
from masd.core.htmltext import html_to_text
from masd.core.mime import cap_utf8, lf
from masd.core.tnef import is_tnef, tnef_files
from masd.core.trust import TrustSettings
from support.system import REQUIRE_VARIABLE, require_program, system_tests_required

TESTS = Path(__file__).resolve().parent.parent
MANIFEST = json.loads((TESTS / "mail_corpus.json").read_text("utf-8"))
TRUST = TrustSettings.of(["mx.help.example"])
Reading = dict[str, Any]


def _missing(what: str, package: str) -> None:
    message = f"{what} is not installed (Debian: apt-get install {package})"
    if system_tests_required():
        pytest.fail(f"{message}, and {REQUIRE_VARIABLE} is set", pytrace=False)
    pytest.skip(message)


def shipped(source: dict[str, str]) -> list[tuple[str, bytes]]:
    directory = Path(source["directory"])
    if not directory.is_dir():
        _missing(str(directory), source["package"])
    found = sorted(p for p in directory.glob(source["glob"]) if p.is_file() and p.stat().st_size)
    return [(f"{source['name']}/{p.name}", p.read_bytes()) for p in found]


# ---------------------------------------------------------------------------
# Mail written at test time by mail programs


def _inputs(work: Path) -> dict[str, Path]:
    rnd = random.Random(2046)
    files = {
        "notes.txt": "Zeile eins\nline two — with a dash\n".encode() * 20,
        "latin.txt": "Caf\xe9 cr\xe8me, d\xe9j\xe0 vu\n".encode("latin-1") * 10,
        "page.html": b"<html><body><h1>Hi</h1><p>A <b>bold</b> &amp; page</p></body></html>\n",
        "data.bin": rnd.randbytes(3000),
        "Bericht März.pdf": b"%PDF-1.4\n" + rnd.randbytes(800),
        "résumé, final.txt": "Ünïcödé name\n".encode(),
        "empty.dat": b"",
        "big.bin": rnd.randbytes(100_000),
    }
    paths = {}
    for name, data in files.items():
        path = work / name
        path.write_bytes(data)
        paths[name] = path
    return paths


_SUBJECTS = [
    "Printer jams",
    "Frühstück am Montag",
    "Re: [list] Ärger mit dem Drucker — bitte sofort ansehen, es ist dringend und lang genug",
    "日本語の件名",
    "",
]
_FROMS = [
    "Pat Kim <pat@example.org>",
    "Jörg Müller <joerg@example.org>",
    '"Kim, Pat" <pat@example.org>',
    "plain@example.org",
]
_BODIES = ["notes.txt", "latin.txt", "page.html"]
_ATTACH = [
    [],
    ["data.bin"],
    ["Bericht März.pdf", "notes.txt"],
    ["résumé, final.txt"],
    ["empty.dat", "page.html"],
    ["big.bin"],
]


def _combos(count: int) -> Iterator[tuple[str, str, str, list[str]]]:
    all_combos = list(itertools.product(_SUBJECTS, _FROMS, _BODIES, _ATTACH))
    random.Random(5322).shuffle(all_combos)
    yield from all_combos[:count]


def _sink(work: Path) -> Path:
    sink = work / "sink.sh"
    sink.write_text('#!/bin/sh\ncat > "$OUT"\n')
    sink.chmod(0o755)
    return sink


def _run(argv: list[str], out: Path, stdin: bytes, work: Path) -> bytes:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "OUT": str(out)}
    env["LC_ALL"] = "C.UTF-8"
    subprocess.run(argv, input=stdin, env=env, cwd=work, check=True, timeout=60)
    return out.read_bytes()


def _snail(work: Path, files: dict[str, Path]) -> list[tuple[str, bytes]]:
    program, sink = require_program("s-nail"), _sink(work)
    out = []
    for i, (subject, sender, body, attach) in enumerate(_combos(60)):
        charset = "iso-8859-1,utf-8" if body == "latin.txt" else "utf-8"
        argv = [program, "-:/", "-Sv15-compat", f"-Smta={sink}", "-Sttycharset=utf-8"]
        argv += [f"-Ssendcharsets={charset}", "-s", subject, "-r", sender]
        for name in attach:
            argv += ["-a", str(files[name])]
        argv.append("ticket@help.example")
        stdin = files[body].read_bytes()
        if body == "latin.txt":
            stdin = stdin.decode("latin-1").encode()
        out.append((f"s-nail/{i:02d}", _run(argv, work / f"snail{i}.eml", stdin, work)))
    return out


def _mutt(work: Path, files: dict[str, Path]) -> list[tuple[str, bytes]]:
    program, sink = require_program("mutt"), _sink(work)
    out = []
    for i, (subject, sender, body, attach) in enumerate(list(_combos(120))[60:]):
        sets = f"set sendmail={sink}; set from='{sender}'; set charset=utf-8"
        sets += '; set send_charset="us-ascii:iso-8859-1:utf-8"'
        if body == "page.html":
            sets += "; set content_type=text/html"
        argv = [program, "-n", "-F", "/dev/null", "-e", sets, "-s", subject]
        if attach:
            argv += ["-a", *(str(files[name]) for name in attach)]
        argv += ["--", "ticket@help.example"]
        stdin = files[body].read_bytes()
        if body == "latin.txt":
            stdin = stdin.decode("latin-1").encode()
        out.append((f"mutt/{i:02d}", _run(argv, work / f"mutt{i}.eml", stdin, work)))
    return out


def _mpack(work: Path, files: dict[str, Path]) -> list[tuple[str, bytes]]:
    program = require_program("mpack")
    out = []
    desc = work / "description.txt"
    desc.write_text("The file you asked for.\n")
    for i, name in enumerate(sorted(files)):
        if name == "empty.dat":
            continue  # mpack refuses an empty file
        for j, extra in enumerate([[], ["-d", str(desc)], ["-c", "application/x-test"]]):
            target = work / f"mpack{i}-{j}.eml"
            argv = [program, "-s", f"File {name}", *extra, "-o", str(target), str(files[name])]
            subprocess.run(argv, cwd=work, check=True, timeout=60, capture_output=True)
            out.append((f"mpack/{i:02d}-{j}", target.read_bytes()))
    # -m: a large file split into message/partial messages (RFC 2046 §5.2.2)
    target = work / "split.eml"
    argv = [program, "-s", "Split", "-m", "20000", "-o", str(target), str(files["big.bin"])]
    subprocess.run(argv, cwd=work, check=True, timeout=60, capture_output=True)
    for piece in sorted(work.glob("split.eml.*")):
        out.append((f"mpack/split{piece.suffix}", piece.read_bytes()))
    return out


def _uuencode(work: Path, files: dict[str, Path]) -> list[tuple[str, bytes]]:
    program = require_program("uuencode")
    out = []
    encodings = ["x-uuencode", "uuencode", "x-uue"]
    for i, name in enumerate(sorted(files)):
        encoded = subprocess.run(
            [program, str(files[name]), name], capture_output=True, check=True, timeout=60
        ).stdout
        cte = encodings[i % len(encodings)]
        raw = (
            b"From: Pat Kim <pat@example.org>\nTo: ticket@help.example\nSubject: uu "
            + name.encode()
            + b"\nMessage-ID: <uu%d@example.org>\nMIME-Version: 1.0\n"
            b'Content-Type: multipart/mixed; boundary="uu"\n\n--uu\n'
            b"Content-Type: text/plain; charset=us-ascii\n\nThe file is attached.\n--uu\n"
            b"Content-Type: application/octet-stream\n"
            b"Content-Transfer-Encoding: " + cte.encode() + b"\n\n" + encoded + b"--uu--\n"
        )
        out.append((f"uuencode/{i:02d}", raw))
    return out


GENERATORS = {"s-nail": _snail, "mutt": _mutt, "mpack": _mpack, "uuencode": _uuencode}


def generated(source: dict[str, str], work: Path) -> list[tuple[str, bytes]]:
    work.mkdir(parents=True, exist_ok=True)
    return GENERATORS[source["name"]](work, _inputs(work))


# ---------------------------------------------------------------------------
# The two readings


def _words(text: str | None) -> str | None:
    return " ".join(text.split()) if text else None


def _entry(name: str | None, ctype: str, data: bytes | None) -> list[Any]:
    if data is None:  # a message/* part: the stdlib re-generates it, not its bytes
        return [name, ctype, None, None]
    return [name, ctype, len(data), hashlib.sha256(data).hexdigest()]


def masd_reading(raw: bytes) -> Reading:
    mail = build_event(
        raw,
        mail_from="a@example.org",
        rcpt_to="ticket@help.example",
        received_at="2025-01-06T10:00:05Z",
        message_ref="m-1",
        trust=TRUST,
    )
    ev = mail.event
    atts = [
        [a.filename, a.content_type, None, None]
        if a.content_type.startswith("message/")
        else [a.filename, a.content_type, a.size, a.sha256]
        for a in ev.attachments
    ]
    return {
        "text": ev.text,
        "attachments": atts,
        "from": list(mail.from_addresses),
        "name": _words(ev.from_name),
        "subject": _words(ev.subject),
        "message_id": ev.message_id,
        "in_reply_to": ev.in_reply_to,
    }


def _leaves(part: Message) -> Iterator[Message]:
    if part.get_content_maintype() == "multipart" and part.is_multipart():
        for sub in part.get_payload():
            yield from _leaves(sub)
    else:
        yield part


def _text(body: Message | None) -> str:
    if body is None:
        return ""
    text = body.get_content()  # type: ignore[attr-defined]
    text = lf(text)
    if body.get_content_type() == "text/html":
        text = html_to_text(text)
    return cap_utf8(text.replace("\x00", "\ufffd"), MAX_TEXT_BYTES)


def _std_entries(part: Message) -> Iterator[list[Any]]:
    ctype = part.get_content_type()
    name = part.get_filename()
    if ctype == "message/rfc822":
        inner = part.get_payload(0) if part.is_multipart() else None
        subject = str(inner.get("subject", "")) if inner is not None else ""
        subject = " ".join(subject.split()).replace("/", "_").replace("\\", "_")
        yield _entry(name or (f"{subject}.eml" if subject else "message.eml"), ctype, None)
        return
    if ctype.startswith("message/"):
        yield _entry(name, ctype, None)
        return
    data = part.get_payload(decode=True) or b""
    yield _entry(name, ctype, data)
    if is_tnef(ctype, name):
        for inner_name, inner in tnef_files(data):
            yield _entry(inner_name, "application/octet-stream", inner)


def _attempt(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        return f"error: {type(exc).__name__}"


def _std_from(msg: EmailMessage) -> tuple[list[str], str | None]:
    addresses: list[str] = []
    name = None
    for header in msg.get_all("from") or []:
        for address in header.addresses:
            if not address.addr_spec or "@" not in address.addr_spec:
                continue
            if not addresses:
                name = address.display_name or None
            addresses.append(_address_key(address.addr_spec))
    return addresses, name


def _header(msg: EmailMessage, name: str) -> str | None:
    value = msg[name]
    return _words(str(value)) if value is not None else None


def stdlib_reading(raw: bytes) -> Reading:
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    body = _attempt(msg.get_body, ("plain", "html"))
    text = _attempt(_text, body) if not isinstance(body, str) else body

    def attachments() -> list[list[Any]]:
        out: list[list[Any]] = []
        for part in _leaves(msg):
            if part is body:
                continue
            named = part.is_attachment() or part.get_filename() is not None  # type: ignore[attr-defined]
            if named or part.get_content_maintype() != "text":
                out.extend(_std_entries(part))
        return out[:100]

    senders = _attempt(_std_from, msg)
    addresses, name = senders if isinstance(senders, tuple) else (senders, senders)
    return {
        "text": text,
        "attachments": _attempt(attachments),
        "from": addresses,
        "name": _words(name),
        "subject": _words(_attempt(lambda: str(msg.get("subject", "")))),
        "message_id": _attempt(
            lambda: _words(str(msg["message-id"])) if msg["message-id"] else None
        ),
        "in_reply_to": _attempt(
            lambda: _words(str(msg["in-reply-to"])) if msg["in-reply-to"] else None
        ),
    }
