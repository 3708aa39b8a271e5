"""Which Authentication-Results masd believes, and which mail is automated.

docs/protocol.md §4 (docs/protocol.md §4.4, Principle 10) in three rules:

* **Trusted block.** "The headers from the top of the message down to the
  first ``Received`` header whose ``by`` host is not in
  ``server.trusted_hosts``."  Every MTA prepends its ``Received`` line, so the
  headers above the first foreign hop were written by our own hosts; anything
  below it was in the message when it reached them and may be forged.
* **Trusted A-R.** "Only ``Authentication-Results`` in that block whose
  authserv-id is in ``server.trusted_authserv_ids`` count; of those, the
  topmost DMARC result is the one."  Blocks are never combined.
* **DMARC pass** "means that result is ``dmarc=pass`` and its ``header.from``
  equals the domain of the single From address (case-insensitive, A-labels).
  A message with several From addresses is not authenticated."
* **Automated**: "``Auto-Submitted`` present and not ``no``; ``Precedence`` is
  ``bulk``, ``list`` or ``junk``; null envelope sender ``<>``", a
  ``List-Id`` header (list traffic, RFC 2919: RFC 3834 §2 advises no
  automatic answer to it), or ``X-Auto-Response-Suppress`` naming ``All``
  or ``AutoReply`` (the sender's client asks for no automatic answer).

Decisions where the profile is silent (each is tested in tests/test_trust.py):

1. The trusted block ends *at* the first ``Received`` with a foreign ``by``
   host: that header and everything below it are outside.  A ``Received``
   whose ``by`` clause cannot be read counts as foreign (fail closed).
2. The DMARC result is the topmost *dmarc result* among trusted A-R headers,
   not the dmarc result of the topmost trusted A-R: an MTA commonly writes
   one A-R per milter (DKIM, SPF, DMARC) under the same authserv-id, and the
   DMARC one need not be on top.  A trusted A-R without a dmarc result is
   passed over.
3. A trusted A-R is cut at its top-level ``;`` into the authserv-id and
   its resinfos; the first resinfo whose method is ``dmarc`` is parsed with
   ``authres``.  If that resinfo does not parse, the result is
   ``permerror``: it is our own MTA's verdict and we cannot read it, so it
   cannot authenticate, and a lower one must not take its place.  The other
   resinfos (dkim, spf, arc, ...) are not read, so damage there does not
   matter.  A trusted A-R without a dmarc resinfo is passed over
   (decision 2).
4. Result values outside ``pass | fail | none | temperror | permerror`` are
   mapped: ``bestguesspass`` (OpenDMARC: no policy published) to ``none``,
   anything else to ``permerror``.
5. ``header.from`` may be written as a domain or (by some MTAs) as an
   address; the part after the last ``@`` is compared.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import authres
import authres.dmarc

from masd.core.comments import _FLAT_COMMENT, strip_comments

__all__ = [
    "AUTOMATION_HEADERS",
    "DMARC_RESULTS",
    "MAX_RESINFO",
    "AuthVerdict",
    "Automation",
    "TrustCause",
    "TrustSettings",
    "domain_key",
    "read_auth",
    "read_automation",
    "strip_comments",
    "trust_cause",
]

#: The values ``auth.dmarc`` may take in a gateway event (docs/protocol.md §15).
DMARC_RESULTS = frozenset({"pass", "fail", "none", "temperror", "permerror", "absent"})

_AUTHRES = authres.FeatureContext(authres.dmarc)
#: Longest dmarc resinfo (with its authserv-id, comments removed) read.
MAX_RESINFO = 1024
_RAW_RESULTS = frozenset({"pass", "fail", "none", "temperror", "permerror"})


@dataclass(frozen=True)
class TrustSettings:
    """Which MTAs masd believes (docs/protocol.md §18 ``server.trusted_*``).

    Both sets are normalized on construction (lowercase, no final dot), and
    an empty ``trusted_hosts`` means the authserv-ids ("default:
    trusted_authserv_ids").
    """

    trusted_authserv_ids: frozenset[str]
    trusted_hosts: frozenset[str]

    def __post_init__(self) -> None:
        ids = frozenset(_norm_host(a) for a in self.trusted_authserv_ids)
        hosts = frozenset(_norm_host(h) for h in self.trusted_hosts) or ids
        object.__setattr__(self, "trusted_authserv_ids", ids)
        object.__setattr__(self, "trusted_hosts", hosts)

    @classmethod
    def of(cls, authserv_ids: Sequence[str], hosts: Sequence[str] = ()) -> TrustSettings:
        """Settings from config lists; ``hosts`` defaults to the authserv-ids."""
        return cls(trusted_authserv_ids=frozenset(authserv_ids), trusted_hosts=frozenset(hosts))


def _norm_host(name: str) -> str:
    return name.strip().lower().rstrip(".")


@dataclass(frozen=True)
class AuthVerdict:
    """The DMARC verdict masd acts on.

    ``dmarc`` is the raw trusted result, except that a ``pass`` that does not
    apply to the single From domain is reported as ``fail``; ``absent`` means
    no trusted A-R carried a dmarc result.
    """

    dmarc: str
    authserv_id: str | None
    header_from: str | None
    authenticated: bool
    reason: str


@dataclass(frozen=True)
class Automation:
    """Whether the mail is automated (Principle 10 forbids answering it)."""

    is_automated: bool
    reason: str | None


# ---------------------------------------------------------------------------
# small parsers


#: A flat comment or a ";" outside one (split_resinfo's fast path).
_COMMENT_OR_SEMI = re.compile(r"\([^()]*\)|;")


def domain_key(domain: str) -> str:
    """A domain in the form masd compares: lowercase, no final dot, A-labels.

    A label that IDNA cannot encode is kept lowercase as it is, so that two
    spellings of an invalid domain still compare equal and never equal a
    valid one.
    """
    d = domain.strip().lower().rstrip(".")
    if d.isascii():
        return d
    labels = []
    for label in d.split("."):
        if label.isascii():
            labels.append(label)
            continue
        try:
            labels.append(label.encode("idna").decode("ascii"))
        except UnicodeError:
            labels.append(label)
    return ".".join(labels)


_CLAUSE_WORDS = frozenset({"from", "by", "via", "with", "id", "for"})


def received_by(value: str) -> str | None:
    """The ``by`` host of a ``Received`` value, lowercase, or None.

    RFC 5321 §4.4: ``Received: [from ...] [by domain ...] [via] [with] [id]
    [for] ; date``.  Comments are removed first, so ``(... by x ...)`` inside
    a comment cannot pose as the clause; the word after ``from`` is skipped,
    so a client that called itself "by" cannot either.
    """
    text = strip_comments(value)
    semi = text.rfind(";")
    if semi >= 0:
        text = text[:semi]
    tokens = text.split()
    i = 0
    n = len(tokens)
    while i < n:
        word = tokens[i].lower()
        if word in _CLAUSE_WORDS and i + 1 < n:
            if word == "by":
                host = tokens[i + 1].strip("<>").lower().rstrip(".")
                return host or None
            i += 2
        else:
            i += 1
    return None


_NON_ASCII_TOKEN = re.compile(r'[^\s;()="\\]*[^\x00-\x7f][^\s;()="\\]*')


def _alabel_token(match: re.Match[str]) -> str:
    token = match.group()
    key = domain_key(token)
    return key if key.isascii() else token


def split_resinfo(value: str) -> list[str]:
    """An A-R value cut at each top-level ``;`` (not inside quotes or comments).

    The first piece holds the authserv-id (and version), each further piece
    one resinfo (RFC 8601 §2.2).
    """
    if '"' not in value and "\\" not in value:
        # As in strip_comments: with no quotes, no quoted-pairs and only flat
        # comments, a ";" is top-level unless a flat comment holds it.
        if "(" not in value:
            return value.split(";")
        if "(" not in _FLAT_COMMENT.sub("", value):
            found: list[str] = []
            begin = 0
            for m in _COMMENT_OR_SEMI.finditer(value):
                if m.group() == ";":
                    found.append(value[begin : m.start()])
                    begin = m.end()
            found.append(value[begin:])
            return found
    return _split_resinfo_scan(value)


def _split_resinfo_scan(value: str) -> list[str]:
    """split_resinfo for any value, one character at a time."""
    pieces: list[str] = []
    depth = 0
    quoted = False
    start = 0
    i = 0
    n = len(value)
    while i < n:
        c = value[i]
        if c == "\\" and (depth or quoted):
            i += 2
            continue
        if quoted:
            quoted = c != '"'
        elif c == "(":
            depth += 1
        elif c == ")" and depth:
            depth -= 1
        elif not depth:
            if c == '"':
                quoted = True
            elif c == ";":
                pieces.append(value[start:i])
                start = i + 1
        i += 1
    pieces.append(value[start:])
    return pieces


@dataclass(frozen=True)
class _Dmarc:
    result: str  # already one of _RAW_RESULTS
    header_from: str | None


def _authserv_id(first_piece: str) -> str | None:
    words = strip_comments(first_piece).split()
    return words[0].lower() if words else None


def _method(resinfo: str) -> str:
    return strip_comments(resinfo).split("=", 1)[0].split("/", 1)[0].strip().lower()


def _dmarc_of(first_piece: str, resinfo: str) -> _Dmarc:
    # Cached: mail from one domain repeats the same dmarc resinfo.  Only
    # short ones, so the cache stays small whatever the headers hold.
    if len(first_piece) + len(resinfo) <= 512:
        return _dmarc_cached(first_piece, resinfo)
    return _parse_dmarc(first_piece, resinfo)


@lru_cache(maxsize=4096)
def _dmarc_cached(first_piece: str, resinfo: str) -> _Dmarc:
    return _parse_dmarc(first_piece, resinfo)


def _parse_dmarc(first_piece: str, resinfo: str) -> _Dmarc:
    """The dmarc result of one trusted A-R, from its dmarc resinfo alone.

    Only the authserv-id and the dmarc resinfo are handed to ``authres``: the
    other methods do not matter here, and the parser's cost grows with the
    header.  Decision 3: a dmarc resinfo that does not parse is permerror.
    Non-ASCII tokens (U-label domains) become A-labels first, since the A-R
    grammar (RFC 8601) is ASCII and ``authres`` refuses anything else.
    """
    # Comments are removed here (they carry nothing masd reads): the
    # parser recurses on nested comments.  A dmarc resinfo longer than any
    # MTA writes is refused as unreadable, which bounds the parser's work.
    text = f"{strip_comments(first_piece)};{strip_comments(resinfo)}"
    if len(text) > MAX_RESINFO:
        return _Dmarc("permerror", None)
    if not text.isascii():
        text = _NON_ASCII_TOKEN.sub(_alabel_token, text)
    try:
        header = _AUTHRES.parse_value(text)
    except (authres.core.AuthResError, ValueError):
        return _Dmarc("permerror", None)
    for result in header.results:
        if str(getattr(result, "method", "")).lower() != "dmarc":
            continue
        raw = str(result.result).lower()
        if raw == "bestguesspass":
            raw = "none"
        elif raw not in _RAW_RESULTS:
            raw = "permerror"
        header_from = None
        for prop in result.properties:
            if str(prop.type).lower() == "header" and str(prop.name).lower() == "from":
                header_from = str(prop.value)
                break
        return _Dmarc(raw, header_from)
    return _Dmarc("permerror", None)


def trusted_block(headers: Sequence[tuple[str, str]], settings: TrustSettings) -> int:
    """How many headers, from the top, masd believes: up to the first
    ``Received`` not added by a trusted host (docs/protocol.md §4, decision 1)."""
    for i, (name, value) in enumerate(headers):
        if name.lower() == "received":
            host = received_by(value)
            if host is None or host not in settings.trusted_hosts:
                return i
    return len(headers)


def read_auth(
    headers: Sequence[tuple[str, str]],
    from_addresses: Sequence[str],
    settings: TrustSettings,
) -> AuthVerdict:
    """The DMARC verdict of a message (docs/protocol.md §4), from its headers top down.

    ``headers`` are (name, unfolded value) pairs in message order;
    ``from_addresses`` every address of every From header.
    """
    found: _Dmarc | None = None
    found_id: str | None = None
    for name, value in itertools.islice(headers, trusted_block(headers, settings)):
        if name.lower() == "authentication-results":
            pieces = split_resinfo(value)
            sid = _authserv_id(pieces[0])
            if sid is None or sid not in settings.trusted_authserv_ids:
                continue  # "Any other A-R is ignored."
            for resinfo in pieces[1:]:
                if _method(resinfo) == "dmarc":
                    found, found_id = _dmarc_of(pieces[0], resinfo), sid
                    break
            if found is not None:
                break  # "the topmost DMARC result is the one"
    if found is None:
        return AuthVerdict("absent", None, None, False, "no trusted dmarc result")
    where = f"dmarc={found.result} from {found_id}"
    if found.result != "pass":
        return AuthVerdict(found.result, found_id, found.header_from, False, where)
    if len(from_addresses) != 1:
        why = f"{where}, but the message has {len(from_addresses)} From addresses"
        return AuthVerdict("fail", found_id, found.header_from, False, why)
    from_domain = domain_key(from_addresses[0].rpartition("@")[2])
    ar_domain = domain_key((found.header_from or "").rpartition("@")[2])
    if not ar_domain or ar_domain != from_domain:
        why = f"{where}, but header.from={found.header_from} is not the From domain {from_domain}"
        return AuthVerdict("fail", found_id, found.header_from, False, why)
    return AuthVerdict("pass", found_id, found.header_from, True, where)


def _token(value: str) -> str:
    """The first word of a header value: comments and parameters removed, lowercase."""
    return strip_comments(value).split(";", 1)[0].strip().lower()


#: The headers :func:`read_automation` reads (lowercase).  A message with none
#: of them is automated only for its null sender.
AUTOMATION_HEADERS: Final = frozenset(
    {"auto-submitted", "precedence", "list-id", "x-auto-response-suppress"}
)
#: ``X-Auto-Response-Suppress`` values that ask for no automatic answer (the
#: others name out-of-office notices, receipts and the like).
_SUPPRESS_ANSWERS: Final = frozenset({"all", "autoreply"})


def read_automation(headers: Sequence[tuple[str, str]], mail_from: str) -> Automation:
    """Whether the mail is automated (docs/protocol.md §4), and the first reason found.

    ``Auto-Submitted`` (RFC 3834 §5) is checked first, then ``Precedence``,
    ``List-Id``, ``X-Auto-Response-Suppress``, then the envelope sender.  An
    ``Auto-Submitted`` header with an empty value is "present and not no",
    hence automated; a ``List-Id`` is list traffic whatever its value.  The
    reason names the header that decided it.
    """
    found: dict[str, str] = {}
    for name, value in headers:
        lname = name.lower()
        if lname == "auto-submitted":
            word = _token(value)
            if word != "no":
                return Automation(True, f"Auto-Submitted: {word or '(empty)'}"[:256])
        elif lname == "precedence" and "precedence" not in found:
            word = _token(value)
            if word in ("bulk", "list", "junk"):
                found[lname] = f"Precedence: {word}"
        elif lname == "list-id" and "list-id" not in found:
            shown = " ".join(strip_comments(value).split())[:200]
            found[lname] = f"List-Id: {shown or '(empty)'}"
        elif lname == "x-auto-response-suppress" and lname not in found:
            words = {w.strip().lower() for w in value.split(",")}
            named = sorted(words & _SUPPRESS_ANSWERS)
            if named:
                spelled = ", ".join("All" if w == "all" else "AutoReply" for w in named)
                found[lname] = f"X-Auto-Response-Suppress: {spelled}"
    for lname in ("precedence", "list-id", "x-auto-response-suppress"):
        if lname in found:
            return Automation(True, found[lname])
    if mail_from.strip() in ("", "<>"):
        return Automation(True, "null sender")
    return Automation(False, None)


# ---------------------------------------------------------------------------
# the account of one trust decision

#: Why masd does or does not take a mail as from an authenticated, non-automated
#: sender (:func:`trust_cause`); ``dmarc-<result>`` for a trusted result other
#: than pass (``dmarc-fail``, ``dmarc-none``, ``dmarc-temperror``, ``dmarc-permerror``).
TRUSTED: Final = "trusted"
NO_TRUSTED_AR: Final = "no-trusted-ar"
NO_DMARC_RESULT: Final = "no-dmarc-result"
BELOW_UNTRUSTED_HOST: Final = "below-untrusted-host"
AUTOMATED: Final = "automated"

#: What usually makes our own verifier write no dmarc result.
SKIPPED_HINT: Final = (
    "the DMARC verifier passed this mail over: OpenDMARC skips mail from its IgnoreHosts "
    "(by default 127.0.0.1, so a test mail sent on the MX itself) and, with "
    "IgnoreAuthenticatedClients, mail from SMTP-authenticated clients"
)


@dataclass(frozen=True)
class TrustCause:
    """The reason of one trust decision, as data.

    ``cause`` is one of the constants above; ``detail`` says it in a sentence.
    ``authserv_ids`` are the ids the mail's A-R carried (no-trusted-ar),
    ``host`` the ``by`` host that ends the trusted block (below-untrusted-host),
    ``header`` what made the mail automated.
    """

    cause: str
    detail: str
    authserv_ids: tuple[str, ...] = ()
    host: str | None = None
    header: str | None = None

    @property
    def trusted(self) -> bool:
        """The sender is authenticated and the mail not automated: masd may answer it."""
        return self.cause == TRUSTED


def _our_ar(headers: Sequence[tuple[str, str]], settings: TrustSettings) -> tuple[int, list[str]]:
    """The index of the first A-R under a trusted authserv-id (-1: none), and every id seen."""
    first = -1
    seen: list[str] = []
    for i, (name, value) in enumerate(headers):
        if name.lower() == "authentication-results":
            sid = _authserv_id(split_resinfo(value)[0])
            if sid is None:
                continue
            sid = sid.rstrip(".")
            if sid not in seen:
                seen.append(sid)
            if first < 0 and sid in settings.trusted_authserv_ids:
                first = i
    return first, seen


def _absent_cause(headers: Sequence[tuple[str, str]], settings: TrustSettings) -> TrustCause:
    """Why no trusted A-R carried a dmarc result."""
    ours = ", ".join(sorted(settings.trusted_authserv_ids)) or "(none trusted)"
    first, seen = _our_ar(headers, settings)
    if first < 0:
        if seen:
            detail = (
                f"no Authentication-Results from {ours} (server.trusted_authserv_ids); "
                f"the mail carries some from {', '.join(seen)}"
            )
        else:
            detail = "no Authentication-Results at all: does a DMARC verifier run in front of masd?"
        return TrustCause(NO_TRUSTED_AR, detail, authserv_ids=tuple(seen))
    size = trusted_block(headers, settings)
    if first < size:
        sid = _authserv_id(split_resinfo(headers[first][1])[0])
        return TrustCause(
            NO_DMARC_RESULT,
            f"Authentication-Results from {sid} without a dmarc= result: {SKIPPED_HINT}",
            authserv_ids=tuple(seen),
        )
    host = received_by(headers[size][1]) or "(unreadable by clause)"
    return TrustCause(
        BELOW_UNTRUSTED_HOST,
        f"Authentication-Results from {ours} only below the Received header by {host}, "
        "a host not in server.trusted_hosts (the result was in the mail before it reached "
        "a trusted host)",
        authserv_ids=tuple(seen),
        host=host,
    )


def trust_cause(
    headers: Sequence[tuple[str, str]],
    auth: AuthVerdict,
    automation: Automation,
    settings: TrustSettings,
) -> TrustCause:
    """Why masd takes the mail as from an authenticated, non-automated sender, or not.

    The account intake records, ``masd explain`` prints and ``masd doctor``
    counts.  The DMARC verdict comes first: an unauthenticated mail is named
    for that even when it is automated too.
    """
    if auth.dmarc == "absent":
        return _absent_cause(headers, settings)
    if not auth.authenticated:
        return TrustCause(f"dmarc-{auth.dmarc}", auth.reason)
    if automation.is_automated:
        why = automation.reason or "automated"
        return TrustCause(
            AUTOMATED, f"{auth.reason}, but the mail is automated ({why})", header=why
        )
    return TrustCause(TRUSTED, f"{auth.reason}, not automated")
