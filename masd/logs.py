"""masd's log lines: time, level, component, then ``key=value`` pairs.

One line per decision goes to standard error (the journal, under systemd).
The line is the standard library's ``%(asctime)s %(levelname)s %(name)s
%(message)s``; :class:`LineFormatter` writes the same text, formatting each
second's date and time once instead of once per line (a line is written per
delivery, per status and per outbox attempt).  With ``server.log_format =
"json"``, :class:`JsonFormatter` writes one JSON object a line instead.

Both formatters pass every record through :func:`scrub`, the one place that
keeps secrets and clients' control characters out of the log:

- the value of an ``Authorization`` header, the credentials after ``Bearer``
  or ``Basic``, and every secret masd was configured with (the admin and peer
  tokens, DKIM keys; :func:`keep_secrets`) are written ``<redacted>``;
- in text lines every control character (CR, LF, NUL, the others; a byte
  that is not UTF-8) is written ``\\xNN``, so a client cannot end a line or
  begin one that looks like masd's.  A traceback keeps its own line breaks;
  each of its lines is prefixed with the record's time, level and name and
  ``|``.  JSON lines escape as JSON does.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from masd.config import Config

FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
REDACTED: Final = "<redacted>"
#: Record attributes (``extra=``) a JSON line carries when the log call gives them.
FIELDS: Final = ("case", "message_ref")

#: Characters a client could use to break a line or hide text: C0, DEL, C1,
#: the Unicode line and paragraph separators, lone surrogates (bytes that were
#: not UTF-8, kept by ``surrogateescape``).
_UNSAFE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_UNSAFE_BUT_LF: Final = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
#: An Authorization header's value: up to a closing quote (a ``repr`` of the
#: raw line), a line break not followed by a fold, or the end.
_AUTHORIZATION: Final = re.compile(
    r"""(?i)(\b(?:proxy-)?authorization\s*[:=]\s*)(.+?)(?=['"](?:\s|$)|\n(?![ \t])|$)""", re.S
)
_CREDENTIALS: Final = re.compile(r"""(?i)\b(bearer|basic)(\s+)[^\s'"\\]+""")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte decoded with surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


class Redactor:
    """The configured secrets, and the rules that hide them."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        #: the pattern and the secrets it matches, replaced together (a line may be
        #: formatted on another thread while secrets are added)
        self._rules: tuple[re.Pattern[str] | None, tuple[str, ...]] = (None, ())

    def add(self, secrets: Iterable[str]) -> None:
        """Hide each of ``secrets`` (and its backslash-escaped spellings) from now on."""
        for secret in secrets:
            if secret:
                self._secrets.add(secret)
                self._secrets.add(secret.replace("\\", "\\\\"))
                self._secrets.add(secret.replace("\\", "\\\\").replace("'", "\\'"))
                self._secrets.add(json.dumps(secret)[1:-1])
        ordered = tuple(sorted(self._secrets, key=len, reverse=True))  # a longer one first
        pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._rules = (pattern, ordered)

    def clear(self) -> None:
        self._secrets.clear()
        self._rules = (None, ())

    def __call__(self, text: str) -> str:
        pattern, hidden = self._rules
        # A search for each secret (in C) is cheaper than the pattern's scan of the line,
        # and most lines hold none.
        if pattern is not None and any(secret in text for secret in hidden):
            text = pattern.sub(REDACTED, text)
        lowered = text.lower()  # the patterns are slow; most lines need neither
        if "authorization" in lowered:
            text = _AUTHORIZATION.sub(lambda m: m.group(1) + REDACTED, text)
        if "bearer" in lowered or "basic" in lowered:
            text = _CREDENTIALS.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
        return text


#: The process's redactor: both formatters use it.
REDACT: Final = Redactor()


#: What a log line writes for a value that is not there (never ``None``).
ABSENT: Final = "-"


def shown(value: object) -> object:
    """``value`` as a log line writes it: :data:`ABSENT` for None or an empty string."""
    return ABSENT if value is None or value == "" else value


def scrub(text: str, *, escape: bool = True, keep_lines: bool = False) -> str:
    """``text`` with control characters escaped (unless ``escape`` is false: JSON
    escapes them itself) and secrets redacted; ``keep_lines`` keeps LF."""
    # Printable ASCII holds none of them (both tests are quicker than the pattern's scan).
    if escape and not (text.isascii() and text.isprintable()):
        text = (_UNSAFE_BUT_LF if keep_lines else _UNSAFE).sub(_escaped, text)
    return REDACT(text)


def config_secrets(config: Config) -> list[str]:
    """Every secret ``config`` holds: tokens, and DKIM keys (whole and line by line)."""
    found = [config.server.admin_token or ""]
    for domain in config.domains.values():
        for key in domain.dkim_keys:
            pem = key.key.decode("ascii", "replace")
            found.append(pem.strip())
            found.extend(  # each line of base64; not the BEGIN and END lines
                line for line in pem.splitlines() if len(line) >= 16 and "-----" not in line
            )
        for type_config in domain.types.values():
            found.extend(e.token for e in type_config.endpoints.values())
            found.extend(w.token for w in type_config.webhooks)
            if type_config.master is not None:
                found.append(type_config.master.token)
    return [s for s in found if s]


def keep_secrets(config: Config) -> None:
    """Redact ``config``'s secrets in every log line from now on."""
    REDACT.add(config_secrets(config))


class LineFormatter(logging.Formatter):
    """:data:`FORMAT`, with the ``asctime`` of each second computed once; scrubbed."""

    def __init__(self) -> None:
        super().__init__(FORMAT)
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:  # handlers format under their lock: no race here
            self._stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = second
        return f"{self._stamp},{int(record.msecs):03d}"  # the default_msec_format, "%s,%03d"

    def format(self, record: logging.LogRecord) -> str:
        record.message = scrub(record.getMessage())
        record.asctime = self.formatTime(record)
        line = self.formatMessage(record)
        if not (record.exc_info or record.exc_text or record.stack_info):
            return line  # most lines: no traceback to look for
        trace = _trace(self, record)
        if not trace:
            return line
        prefix = f"{record.asctime} {record.levelname} {record.name} | "
        lines = scrub(trace, keep_lines=True).split("\n")
        return line + "".join(f"\n{prefix}{part}" for part in lines)


def _trace(formatter: logging.Formatter, record: logging.LogRecord) -> str:
    """The record's traceback and stack, as the standard formatter writes them."""
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    parts = [record.exc_text or "", formatter.formatStack(record.stack_info or "")]
    return "\n".join(p.rstrip("\n") for p in parts if p)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC), level, logger, message, and
    :data:`FIELDS` when the record has them; ``exc`` holds a traceback."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        doc: dict[str, object] = {
            "time": f"{self._stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": scrub(record.getMessage(), escape=False),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                doc[name] = value if isinstance(value, int) else scrub(str(value), escape=False)
        trace = _trace(self, record)
        if trace:
            doc["exc"] = scrub(trace, escape=False)
        return json.dumps(doc, ensure_ascii=True)


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """Log at ``level`` (DEBUG, INFO, WARNING or ERROR) to standard error, as
    ``log_format`` says (``text`` or ``json``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else LineFormatter())
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    # The format names no thread, process or source line: none is looked up
    # for every record (the logging HOWTO's "Optimization" table).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None  # the HOWTO's documented switch
    # aiosmtpd logs every LMTP command at INFO (about 8 lines per delivery,
    # a quarter of intake throughput) and httpx every request; masd logs one
    # line per decision (the outbox's names the answer httpx would log);
    # flufl.bounce logs each of its 17 detectors it runs on a bounce.
    for chatty in ("mail.log", "httpx", "flufl.bounce"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.root.level))


_EXCERPT: Final = re.compile(r"""\bb?(['"])(.*)\1\s*$""")
_FIELD_NAME: Final = re.compile(r"""^([!#$%&'*+.^_`|~0-9A-Za-z-]+)\s*:""")


def parser_refusal(text: str) -> str:
    """What an HTTP parser refused, from its error ``text``, without the bytes it
    quotes (a header line, its value a secret perhaps): the reason, and the
    header field's name when the quoted line begins with one."""
    reason: list[str] = []
    field = ""
    for line in text.splitlines():
        excerpt = _EXCERPT.search(line.strip())
        if excerpt is not None:
            name = _FIELD_NAME.match(excerpt.group(2))
            field = f" (in the {name.group(1)} field)" if name else ""
            break
        if line.strip() and line.strip() != "^":
            reason.append(line.strip())
    return " ".join(" ".join(reason).split()).rstrip(":") + field
