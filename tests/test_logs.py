"""masd.logs: the log line is the standard library's, whatever the second."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import given, settings
from hypothesis import strategies as st
from support.keys import pem
from support.ticket import write_ticket_config

from masd import logs
from masd.config.model import Dkim
from masd.logs import (
    FORMAT,
    REDACT,
    JsonFormatter,
    LineFormatter,
    config_secrets,
    parser_refusal,
    scrub,
)


def _record(created: float, msg: str = "outbox done outbox_id=1") -> logging.LogRecord:
    record = logging.LogRecord("masd.outbox", logging.INFO, __file__, 1, msg, None, None)
    record.created = created
    record.msecs = (created - int(created)) * 1000
    return record


def test_lines_equal_the_standard_formatters_across_seconds() -> None:
    mine, stock = LineFormatter(), logging.Formatter(FORMAT)
    times = [1_780_000_000.0, 1_780_000_000.999, 1_780_000_001.001, 1_780_000_001.5]
    times += [1_780_003_599.9995, 1_780_003_600.0, 1_780_000_000.25]  # an hour turns; back again
    for created in times:
        record = _record(created)
        assert mine.format(record) == stock.format(record), created


def test_an_explicit_date_format_is_honoured() -> None:
    record = _record(1_780_000_000.5)
    assert LineFormatter().formatTime(record, "%Y") == logging.Formatter().formatTime(record, "%Y")


def test_libraries_that_log_every_request_are_kept_to_warnings() -> None:
    import masd.logs

    names = ("mail.log", "httpx")
    saved = {n: logging.getLogger(n).level for n in names}
    flags = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    srcfile = logging._srcfile
    try:
        masd.logs.configure_logging("INFO")
        for name in names:  # one line per decision, not one per LMTP command or HTTP request
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
            assert logging.getLogger(name).isEnabledFor(logging.WARNING), name
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
        logging.logThreads, logging.logProcesses, logging.logMultiprocessing = flags
        logging._srcfile = srcfile


# ---------------------------------------------------- secrets and control characters

SECRET = "peer-s3cret-0123456789abcdef"


@pytest.fixture
def secret() -> Iterator[str]:
    REDACT.add([SECRET, "back\\slash'quote"])
    yield SECRET
    REDACT.clear()


@pytest.mark.usefixtures("secret")
@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        (f"token {SECRET} here", "token <redacted> here"),
        ("b'Authorization: Bearer other\\x01'", "b'Authorization: <redacted>'"),
        ("Authorization : Basic dXNlcjpwdw==", "Authorization : <redacted>"),
        ("authorization=Bearer abc def", "authorization=<redacted>"),
        ("sent Bearer abc.def and more", "sent Bearer <redacted> and more"),
        ("x back\\\\slash\\'quote y", "x <redacted> y"),  # the secret as repr() writes it
        ("a\nb\rc\x00d\x1be\x7ff\x85g", "a\\x0ab\\x0dc\\x00d\\x1be\\x7ff\\x85g"),
        ("bad byte \udcff and \u2028", "bad byte \\xff and \\u2028"),
        ("Authorization: Bearer x\r\n folded", "Authorization: <redacted>"),
        ("ünïcode stays", "ünïcode stays"),
    ],
)
def test_scrub_redacts_secrets_and_escapes_control_characters(raw: str, shown: str) -> None:
    assert scrub(raw) == shown


#: pieces of log lines: plain words, the secrets, control and separator characters, a byte
#: that was not UTF-8, and the words the credential rules look for
_PIECES = (
    "rcpt=ticket@help.example", " ", "key=x", SECRET, SECRET[:9], "back\\slash\\'quote",
    "back\\slash'quote", "\n", "\r", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\udcff",
    "Authorization: ", "Bearer ", "basic", "ünï", "'",
)  # fmt: skip


@pytest.mark.usefixtures("secret")
@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join), st.booleans())
def test_the_quick_tests_skip_only_lines_the_patterns_leave_alone(
    text: str, keep_lines: bool
) -> None:
    # scrub tests a line cheaply before each of its patterns; the patterns alone must agree.
    unsafe = logs._UNSAFE_BUT_LF if keep_lines else logs._UNSAFE
    pattern, _ = REDACT._rules
    assert pattern is not None
    whole = REDACT(pattern.sub(logs.REDACTED, unsafe.sub(logs._escaped, text)))
    assert scrub(text, keep_lines=keep_lines) == whole


def _exc_record(msg: str) -> logging.LogRecord:
    try:
        raise ValueError(f"client sent {msg}")
    except ValueError:
        info = sys.exc_info()
    record = logging.LogRecord("masd.http", logging.ERROR, __file__, 1, "fault %s", (msg,), info)
    record.created, record.msecs = 1_780_000_000.25, 250.0
    return record


@pytest.mark.usefixtures("secret")
def test_a_traceback_keeps_its_lines_each_marked_as_the_records() -> None:
    forged = f"x\n2026-01-01 00:00:00,000 INFO masd.http forged {SECRET}"
    text = LineFormatter().format(_exc_record(forged))
    first, *rest = text.split("\n")
    assert first.endswith(
        " ERROR masd.http fault x\\x0a2026-01-01 00:00:00,000 INFO masd.http forged <redacted>"
    )
    assert rest
    assert all(line.startswith(first[:23] + " ERROR masd.http | ") for line in rest)
    assert rest[0].endswith("| Traceback (most recent call last):")
    assert SECRET not in text


@pytest.mark.usefixtures("secret")
def test_json_lines_escape_as_json_does_and_carry_case_and_message_ref() -> None:
    record = _exc_record(f"a\nb\x00 {SECRET}")
    record.case, record.message_ref = "ticket=t-1@help.example", "msg-1"
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert SECRET not in line
    doc = json.loads(line)
    assert doc["time"] == "2026-05-28T20:26:40.250Z"
    assert (doc["level"], doc["logger"]) == ("ERROR", "masd.http")
    assert doc["message"] == "fault a\nb\x00 <redacted>"
    assert (doc["case"], doc["message_ref"]) == ("ticket=t-1@help.example", "msg-1")
    assert doc["exc"].startswith("Traceback")
    assert "<redacted>" in doc["exc"]
    plain = JsonFormatter().format(_record(1_780_000_000.0))
    assert set(json.loads(plain)) == {"time", "level", "logger", "message"}


def test_the_http_parsers_refusals_keep_the_reason_not_the_line() -> None:
    quoted = (
        "400, message:\n  Invalid header value char:\n\n"
        "    b'Authorization: Bearer s3cret\\x01'\n                ^"
    )
    assert parser_refusal(quoted) == (
        "400, message: Invalid header value char (in the Authorization field)"
    )
    fold = "400, message:\n  Unexpected whitespace after header value:\n\n    b' s3cret'\n   ^"
    assert parser_refusal(fold) == "400, message: Unexpected whitespace after header value"


def test_every_configured_secret_is_kept_out(tmp_path: Path) -> None:
    """The admin and peer tokens and each DKIM key (whole, and line by line) are
    what :func:`masd.logs.config_secrets` names; the PEM armour lines are not."""
    admin = tmp_path / "admin.token"
    admin.write_text("admin-9f8e7d6c5b4a\n")
    admin.chmod(0o600)
    config = write_ticket_config(tmp_path, server='admin_token_file = "admin.token"')
    key = pem(ed25519.Ed25519PrivateKey.generate())
    domain = config.domains["help.example"]
    dkim = (Dkim("mas", tmp_path / "k.pem", key),)
    config = dataclasses.replace(
        config, domains={"help.example": dataclasses.replace(domain, dkim_keys=dkim)}
    )
    found = config_secrets(config)
    callback = (tmp_path / "callback.token").read_text().strip()
    assert "admin-9f8e7d6c5b4a" in found
    assert callback in found
    body = key.decode().splitlines()[1]
    assert key.decode().strip() in found
    assert body in found
    assert not [s for s in found if "-----" in s and "\n" not in s]
