"""aiosmtpd's private names: used in one module only, present in the installed aiosmtpd.

masd's LMTP session overrides and reads a few of aiosmtpd's underscore
names (:mod:`masd.edges.lmtp_session`).  A new aiosmtpd may rename them;
these tests then fail and name what is missing, before any mail is lost to
a session that silently behaves differently.
"""

from __future__ import annotations

import ast
import asyncio
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from aiosmtpd.lmtp import LMTP
from packaging.specifiers import SpecifierSet

from masd.edges import lmtp_session
from masd.edges.lmtp_session import (
    PRIVATE_ATTRIBUTES,
    PRIVATE_METHODS,
    LmtpProtocol,
    missing_private_names,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_private_names_masd_uses_exist_in_the_installed_aiosmtpd() -> None:
    missing = asyncio.run(missing_private_names())
    assert not missing, (
        f"aiosmtpd {version('aiosmtpd')} has no {', '.join(missing)}: "
        "masd/edges/lmtp_session.py relies on them; adapt it (and the version range "
        "in pyproject.toml) to this aiosmtpd"
    )


def test_a_missing_name_is_reported_by_name() -> None:
    missing = asyncio.run(missing_private_names(("_getaddr", "_gone"), ("_reader", "_vanished")))
    assert missing == ["SMTP._gone", "SMTP()._vanished"]


def test_the_aiosmtpd_version_is_held_to_the_tested_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (requirement,) = [d for d in project["project"]["dependencies"] if d.startswith("aiosmtpd")]
    specifier = SpecifierSet(requirement.removeprefix("aiosmtpd"))
    assert "<" in str(specifier), f"{requirement}: no upper bound"
    assert version("aiosmtpd") in specifier, f"aiosmtpd {version('aiosmtpd')} not in {specifier}"


def test_every_aiosmtpd_name_the_session_overrides_is_declared() -> None:
    # A masd name that happens to shadow one of aiosmtpd's would change aiosmtpd's
    # behaviour unseen: every underscore name defined here that aiosmtpd also has
    # must be one of the declared ones.
    own = {n for n in vars(LmtpProtocol) if n.startswith("_") and not n.startswith("__")}
    shadowing = {n for n in own if hasattr(LMTP, n)}
    assert shadowing <= set(PRIVATE_METHODS), sorted(shadowing - set(PRIVATE_METHODS))


def _aiosmtpd_private_uses(path: Path) -> set[str]:
    """Underscore names of aiosmtpd's SMTP used as attributes in a module importing aiosmtpd."""
    tree = ast.parse(path.read_text())
    imports = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    if not any(name.startswith("aiosmtpd") for name in imports):
        return set()
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and _aiosmtpd_has(node.attr)
    }


def test_no_other_module_uses_aiosmtpd_private_names() -> None:
    session = Path(lmtp_session.__file__).resolve()
    assert _aiosmtpd_private_uses(session), "the check below would find nothing"
    offenders = {}
    for path in sorted((ROOT / "masd").rglob("*.py")):
        if path.resolve() != session and (used := _aiosmtpd_private_uses(path)):
            offenders[str(path.relative_to(ROOT))] = sorted(used)
    assert not offenders, offenders


def test_the_session_uses_only_the_declared_private_names() -> None:
    # Every self._name the session module reads that aiosmtpd defines is declared.
    text = Path(lmtp_session.__file__).read_text()
    used = set(re.findall(r"\bself\.(_[a-z][a-z_]*)", text)) | set(
        re.findall(r"session\.(_[a-z][a-z_]*)", text)
    )
    from_aiosmtpd = {n for n in used if not n.startswith("_masd") and _aiosmtpd_has(n)}
    declared = set(PRIVATE_METHODS) | set(PRIVATE_ATTRIBUTES)
    assert from_aiosmtpd <= declared, sorted(from_aiosmtpd - declared)


def _aiosmtpd_has(name: str) -> bool:
    import aiosmtpd.smtp

    source = Path(aiosmtpd.smtp.__file__).read_text()
    return hasattr(LMTP, name) or f"self.{name} =" in source or f"self.{name}:" in source


class _Counted:
    """An argument that counts how often a log line was made of it."""

    def __init__(self) -> None:
        self.shown = 0

    def __repr__(self) -> str:
        self.shown += 1
        return "<counted>"


def test_a_command_line_is_masked_and_logged_when_its_logger_is_enabled() -> None:
    import logging

    import aiosmtpd.smtp

    lmtp_session.lazy_command_log()
    logger = logging.getLogger("mail.log")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    before = logger.level
    logger.addHandler(handler)
    try:
        logger.setLevel(logging.INFO)
        aiosmtpd.smtp.sanitized_log(logger.info, "%r >> %r", "peer", b"AUTH PLAIN c2VjcmV0\r\n")
        assert [r.getMessage() for r in records] == ["'peer' >> b'AUTH PLAIN ********\\r\\n'"]
        # Below the logger's level nothing is masked or formatted, and nothing logged.
        counted = _Counted()
        aiosmtpd.smtp.sanitized_log(logger.debug, "%r", counted)
        logger.setLevel(logging.WARNING)
        aiosmtpd.smtp.sanitized_log(logger.info, "%r >> %r", counted, b"MAIL FROM:<a@b>")
        assert len(records) == 1
        assert counted.shown == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def test_sessions_use_the_level_aware_command_log() -> None:
    import aiosmtpd.smtp

    loop = asyncio.new_event_loop()
    try:
        LmtpProtocol(object(), hostname="probe", loop=loop)
    finally:
        loop.close()
    assert aiosmtpd.smtp.sanitized_log is lmtp_session._sanitized_log_if_enabled


class _Transport(asyncio.Transport):
    """A transport that counts the pauses and resumes of its reading."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses = self.resumes = 0

    def pause_reading(self) -> None:
        self.pauses += 1

    def resume_reading(self) -> None:
        self.resumes += 1

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default


def test_the_reader_pauses_past_a_mail_not_past_two_command_lines() -> None:
    async def fed(size: int) -> tuple[int, int, int]:
        session = LmtpProtocol(object(), hostname="probe", loop=asyncio.get_running_loop())
        reader = session._stream_reader  # type: ignore[attr-defined]
        transport = _Transport()
        reader.set_transport(transport)
        reader.feed_data(b"x" * size)
        paused = transport.pauses
        await reader.readexactly(size)
        return paused, transport.resumes, reader._limit

    # A mail of 50 KB (past 2 x 1,001 octets, where a plain aiosmtpd reader pauses) is
    # read without a pause; past PAUSE_BYTES the reading pauses and resumes as before.
    assert asyncio.run(fed(50_000)) == (0, 0, lmtp_session.LINE_LIMIT)
    assert asyncio.run(fed(lmtp_session.PAUSE_BYTES + 1)) == (1, 1, lmtp_session.LINE_LIMIT)


def test_a_plain_aiosmtpd_reader_pauses_for_each_mail() -> None:
    async def fed() -> int:
        plain = asyncio.StreamReader(limit=lmtp_session.LINE_LIMIT)  # what aiosmtpd makes
        transport = _Transport()
        plain.set_transport(transport)
        plain.feed_data(b"x" * 50_000)
        return transport.pauses

    assert asyncio.run(fed()) == 1
