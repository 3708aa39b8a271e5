"""MAS addresses (docs/protocol.md §2): parse, normalize and compare recipient addresses.

docs/protocol.md §2 fixes the local part, "after removing a recipient-delimiter suffix
(``server.recipient_delimiter``, default ``+``: everything from the first
``+`` to the end of the local part is dropped)"::

    local  = type [ "=" id ] [ "!" mode ]
    type   = ALPHA *31( ALPHA / DIGIT / "-" )          ; case-insensitive, stored lowercase
    mode   = ALPHA *15( ALPHA / DIGIT / "-" )          ; case-insensitive, stored lowercase
    id     = 1*64( ALPHA / DIGIT / "-" / "_" / "." )   ; no leading, trailing or doubled "."

and "The whole local part is at most 64 octets (RFC 5321). The domain must be
a configured domain, compared case-insensitively (IDNA domains in A-label
form)."

The four forms of the docs/protocol.md §2 table:

=================== ===================================== ==============================
form                example                               meaning
=================== ===================================== ==============================
``type@D``          ``ticket@help.example``               intake: no case yet
``type!mode@D``     ``ticket!callback@help.example``      intake, handoff requested
``type=id@D``       ``ticket=gs-1@help.example``          resource address of a case
``type=id!mode@D``  ``ticket=gs-1!callback@help.example`` existing case, handoff requested
=================== ===================================== ==============================

Decisions this module makes where docs/protocol.md §2 leaves room (the conformance
file ``conformance/addresses.json`` pins each of them with an example):

* Order of checks: the address as a whole (angle brackets, ``@``), then the
  domain (syntax, IDNA, configured), then the local part.  A recipient at a
  domain that is not ours is ``unknown-domain`` (LMTP ``550 5.1.2``) whatever
  its local part looks like.
* The 64-octet bound applies to the local part *as received*, before the
  delimiter suffix is dropped: RFC 5321 bounds the local part that travels in
  the envelope, and a suffix is part of it.  Octets are UTF-8 octets.
* The delimiter suffix is dropped before the grammar applies, so its content
  is not checked (beyond the 64-octet bound and the absence of control
  characters): ``ticket+ü@D`` is the intake ``ticket@D``, and in
  ``ticket=gs-1+x!callback@D`` the ``!callback`` is part of the dropped
  suffix.  As with Postfix's ``recipient_delimiter``, each character of the
  delimiter string is a delimiter; the first occurrence of any of them starts
  the suffix.  An empty delimiter disables suffixes.
* A suffix that starts with ``bounce-`` makes a bounce address; the edges
  read it first (:func:`masd.core.bounce.split_bounce`) and parse the rest.
* Positions in details are 0-based offsets into the local part as received
  (or into the domain as written, for the domain).
* Domains: lowercase; U-labels are converted to A-labels with the standard
  library's IDNA codec, and only when the conversion is exact (converting the
  A-label back gives the domain as written, up to case and the ideographic
  full stops).  Mappings IDNA 2003 would apply silently (``ß`` to ``ss``,
  deleting joiners, fullwidth letters) are refused, since IDNA 2008 names a
  different domain for them.  A-labels (``xn--``) are checked as Punycode
  only, so IDNA 2008 A-labels such as ``xn--strae-oqa`` are accepted as
  written.

Every refusal is an :class:`~masd.core.errors.AddressError` whose ``part`` is
``address``, ``local``, ``type``, ``id``, ``mode`` or ``domain``; ``code`` is
``unknown-domain`` when the domain is not configured and ``bad-address``
otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from masd.core.errors import AddressError

__all__ = [
    "ID_MAX",
    "LOCAL_MAX",
    "MODE_MAX",
    "RESOURCE_MAX",
    "TYPE_MAX",
    "Address",
    "case_ref",
    "check_case_ref",
    "check_id",
    "check_id_grammar",
    "normalize_domain",
    "parse_address",
    "parse_local",
    "split_key",
]

# Bounds of docs/protocol.md §2.
LOCAL_MAX = 64  # "The whole local part is at most 64 octets (RFC 5321)."
TYPE_MAX = 32  # type = ALPHA *31(...)
MODE_MAX = 16  # mode = ALPHA *15(...)
ID_MAX = 64  # id = 1*64(...)
# "An id ... that would make `type=id!mode` longer than 64 octets for a mode
# name of the longest length, 16 (so `type=id` over 47 octets ...) is refused."
RESOURCE_MAX = LOCAL_MAX - 1 - MODE_MAX

# RFC 1035 / RFC 5890 bounds on a domain name in text form.
_LABEL_MAX = 63
_DOMAIN_MAX = 253

# The fast path: a local part (suffix already dropped) that is well formed.
# The id's dot rules are checked apart (three substring tests).
_LOCAL_RE = re.compile(
    r"([A-Za-z][A-Za-z0-9-]{0,31})"
    r"(?:=([A-Za-z0-9_.-]{1,64}))?"
    r"(?:!([A-Za-z][A-Za-z0-9-]{0,15}))?"
)
_TYPE_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")
_ID_RE = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
# First character that is not allowed in each part (for the details).
_TYPE_BAD = re.compile(r"[^A-Za-z0-9-]")
_ALPHA = re.compile(r"[A-Za-z]")
_ID_BAD = re.compile(r"[^A-Za-z0-9_.-]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
# A domain in A-label form: LDH labels separated by single dots.
_LDH_DOMAIN_RE = re.compile(
    r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*"
)
# Label separators UTS #46 and IDNA 2003 treat as ".".
_ALT_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})

_TYPE_CHARS = '(letters, digits, "-")'
_ID_CHARS = '(letters, digits, "-", "_", ".")'
_DOMAIN_CHARS = '(letters, digits, "-", ".")'


def _show(ch: str) -> str:
    """A character as a detail shows it: quoted when printable, as a U+ code point otherwise."""
    if ch.isprintable() and not ch.isspace():
        return f'"{ch}"'
    return f"U+{ord(ch):04X}"


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed MAS address.

    ``kind`` is ``resource`` exactly when there is an id.  ``type`` and
    ``mode`` are lowercase, ``id`` is as written (docs/protocol.md §2: "id as
    assigned"), ``domain`` is lowercase A-label form.  Build one with
    :func:`parse_address`; the constructor does not check the grammar.
    """

    kind: Literal["intake", "resource"]
    type: str
    id: str | None
    mode: str | None
    domain: str

    def __post_init__(self) -> None:
        if (self.kind == "resource") != (self.id is not None):
            raise ValueError(f"Address kind {self.kind!r} with id {self.id!r}")

    @property
    def canonical(self) -> str:
        """``type=id@domain`` for a resource (docs/protocol.md §2 "Canonical resource
        address: type and domain lowercase, id as assigned"), ``type@domain``
        for an intake.  Never carries the mode."""
        if self.id is None:
            return f"{self.type}@{self.domain}"
        return f"{self.type}={self.id}@{self.domain}"

    @property
    def key(self) -> str:
        """docs/protocol.md §2 "Equivalence key: ``type=casefold(id)@domain``. Two
        addresses with the same key are the same case."  For an intake it is
        the canonical form."""
        if self.id is None:
            return f"{self.type}@{self.domain}"
        return f"{self.type}={self.id.casefold()}@{self.domain}"

    def format(self) -> str:
        """The whole address, mode included: ``type[=id][!mode]@domain``."""
        local = self.type
        if self.id is not None:
            local = f"{local}={self.id}"
        if self.mode is not None:
            local = f"{local}!{self.mode}"
        return f"{local}@{self.domain}"

    def with_id(self, id: str) -> Address:
        """The resource address of case ``id`` under this address's type and
        domain, without a mode.

        The id must match the ``id`` grammar and ``type=id`` must fit the
        64-octet local part, or the address could never receive mail.
        """
        _check_id_grammar(id, 0)
        size = len(self.type) + 1 + len(id)
        if size > LOCAL_MAX:
            raise AddressError(
                f'id: "{self.type}={id}" is {size} octets, over {LOCAL_MAX}', part="id"
            )
        return Address("resource", self.type, id, None, self.domain)


def parse_address(
    address: str, *, delimiter: str = "+", domains: Collection[str] | None = None
) -> Address:
    """Parse a recipient address into an :class:`Address`, or refuse it.

    ``address`` may be wrapped in ``<>``.  ``delimiter`` is the recipient
    delimiter (each of its characters starts a suffix that is dropped; ``""``
    disables it).  ``domains``, when given, are the configured domains: the
    domain must be one of them, compared after lowercasing and IDNA
    conversion, else ``AddressError(code="unknown-domain", part="domain")``.
    Pass them already normalized (see :func:`normalize_domain`) for the
    fast path; others are normalized when the fast lookup misses.

    The 64-octet bound applies to the local part as received, suffix
    included (RFC 5321 bounds what travels in the envelope).
    """
    if address.startswith("<") or address.endswith(">"):
        if not (address.startswith("<") and address.endswith(">") and len(address) >= 2):
            raise AddressError(
                'address: unbalanced angle brackets ("<" and ">" go together)', part="address"
            )
        address = address[1:-1]
    if not address:
        raise AddressError("address: empty", part="address")
    if address.startswith('"'):
        raise AddressError("local part: quoted local parts are not MAS addresses", part="local")
    ats = address.count("@")
    if ats != 1:
        if ats == 0:
            raise AddressError('address: no "@"', part="address")
        raise AddressError(f'address: {ats} "@", one expected', part="address")
    local, _, raw_domain = address.partition("@")
    domain = normalize_domain(raw_domain)
    if domains is not None and domain not in domains and not _known(domain, domains):
        raise AddressError(
            f'domain: "{domain}" is not a domain configured here',
            part="domain",
            code="unknown-domain",
        )
    type_, id_, mode = parse_local(local, delimiter=delimiter)
    return Address("intake" if id_ is None else "resource", type_, id_, mode, domain)


def _known(domain: str, domains: Collection[str]) -> bool:
    """Slow path of the configured-domain test: normalize each configured name."""
    for candidate in domains:
        try:
            if normalize_domain(candidate) == domain:
                return True
        except AddressError:
            continue
    return False


def parse_local(local: str, *, delimiter: str = "+") -> tuple[str, str | None, str | None]:
    """Parse a local part as received into ``(type, id, mode)``.

    ``type`` and ``mode`` come back lowercase, ``id`` as written; ``id`` and
    ``mode`` are ``None`` when absent.  Checks, in order: no control
    character, at most 64 octets as received, suffix dropped, ASCII, grammar.
    """
    if not local:
        raise AddressError("local part: empty", part="local")
    bad = _CONTROL.search(local)
    if bad is not None:
        raise AddressError(
            f"local part: control character {_show(bad.group())} at position {bad.start()}",
            part="local",
        )
    try:
        size = len(local) if local.isascii() else len(local.encode("utf-8"))
    except UnicodeEncodeError as exc:
        # Bytes that are not UTF-8 reach here as lone surrogates (an SMTP
        # server decodes with surrogateescape).
        raise AddressError(
            f"local part: octets at position {exc.start} are not UTF-8", part="local"
        ) from exc
    if size > LOCAL_MAX:
        raise AddressError(f"local part: {size} octets, over {LOCAL_MAX}", part="local")
    if delimiter:
        if len(delimiter) == 1:
            cut = local.find(delimiter)
        else:
            cut = min((i for i in map(local.find, delimiter) if i >= 0), default=-1)
        if cut == 0:
            raise AddressError(f'local part: empty before the delimiter "{local[0]}"', part="local")
        if cut > 0:
            local = local[:cut]
    # Fast path: the common, well-formed case costs one match and three
    # substring tests.
    m = _LOCAL_RE.fullmatch(local)
    if m is not None:
        type_, id_, mode = m.groups()
        if id_ is None or not (id_[0] == "." or id_[-1] == "." or ".." in id_):
            return type_.lower(), id_, None if mode is None else mode.lower()
    return _diagnose(local)


def _diagnose(local: str) -> tuple[str, str | None, str | None]:
    """Find and name the first fault of a local part the fast path refused.

    Falls through to a parse only if no fault is found, which keeps the two
    paths honest with each other.
    """
    bad = _NON_ASCII.search(local)
    if bad is not None:
        raise AddressError(
            f"local part: character {_show(bad.group())} at position {bad.start()} "
            "is not ASCII (MAS local parts are ASCII)",
            part="local",
        )
    eq = local.find("=")
    bang = local.find("!")
    if eq >= 0 and (second := local.find("=", eq + 1)) >= 0:
        raise AddressError(
            f'local part: a second "=" at position {second} (at most one "=")', part="local"
        )
    if bang >= 0 and (second := local.find("!", bang + 1)) >= 0:
        raise AddressError(
            f'local part: a second "!" at position {second} (at most one "!")', part="local"
        )
    if eq >= 0 and 0 <= bang < eq:
        raise AddressError(
            f'local part: "=" at position {eq} after "!" (the order is type=id!mode)',
            part="local",
        )
    type_end = eq if eq >= 0 else bang if bang >= 0 else len(local)
    type_ = local[:type_end]
    if not type_:
        raise AddressError(f'type: empty (the local part starts with "{local[0]}")', part="type")
    _check_name(type_, 0, "type", TYPE_MAX)
    id_: str | None = None
    if eq >= 0:
        id_end = bang if bang >= 0 else len(local)
        id_ = local[eq + 1 : id_end]
        if not id_:
            raise AddressError(f'id: empty after "=" at position {eq}', part="id")
        _check_id_grammar(id_, eq + 1)
    mode: str | None = None
    if bang >= 0:
        mode = local[bang + 1 :]
        if not mode:
            raise AddressError(f'mode: empty after "!" at position {bang}', part="mode")
        _check_name(mode, bang + 1, "mode", MODE_MAX)
    return type_.lower(), id_, None if mode is None else mode.lower()


def _check_name(value: str, offset: int, part: str, limit: int) -> None:
    """Check a ``type`` or ``mode``: ALPHA, then ALPHA / DIGIT / "-", up to ``limit``."""
    if not value:
        raise AddressError(f"{part}: empty", part=part)
    if _ALPHA.fullmatch(value[0]) is None:
        raise AddressError(
            f"{part}: character {_show(value[0])} at position {offset} is not allowed "
            "at the start (a letter)",
            part=part,
        )
    bad = _TYPE_BAD.search(value)
    if bad is not None:
        raise AddressError(
            f"{part}: character {_show(bad.group())} at position {offset + bad.start()} "
            f"is not allowed {_TYPE_CHARS}",
            part=part,
        )
    if len(value) > limit:
        raise AddressError(f"{part}: longer than {limit} characters ({len(value)})", part=part)


def _check_id_grammar(id: str, offset: int) -> None:
    """Check an id against docs/protocol.md §2: ``1*64( ALPHA / DIGIT / "-" / "_" / "." )``
    with "no leading, trailing or doubled "."."  ``offset`` places positions."""
    if len(id) <= ID_MAX and _ID_RE.fullmatch(id) is not None:
        return
    if not id:
        raise AddressError("id: empty", part="id")
    bad = _ID_BAD.search(id)
    if bad is not None:
        raise AddressError(
            f"id: character {_show(bad.group())} at position {offset + bad.start()} "
            f"is not allowed {_ID_CHARS}",
            part="id",
        )
    if id[0] == ".":
        raise AddressError(f'id: starts with "." (position {offset})', part="id")
    if id[-1] == ".":
        raise AddressError(f'id: ends with "." (position {offset + len(id) - 1})', part="id")
    doubled = id.find("..")
    if doubled >= 0:
        raise AddressError(f'id: doubled "." at position {offset + doubled}', part="id")
    raise AddressError(f"id: longer than {ID_MAX} characters ({len(id)})", part="id")


@lru_cache(maxsize=512)
def normalize_domain(domain: str) -> str:
    """A domain in the form masd compares: lowercase, A-labels, syntax checked.

    Refuses (``part="domain"``) an empty domain, characters other than
    letters, digits, ``-`` and ``.`` in ASCII, empty labels, labels over 63
    octets or with a leading or trailing ``-``, a name over 253 octets,
    address literals, U-labels IDNA cannot convert exactly, and A-labels that
    do not decode.
    """
    if not domain:
        raise AddressError("domain: empty", part="domain")
    if domain.isascii():
        ascii_domain = domain.lower()
        if _LDH_DOMAIN_RE.fullmatch(ascii_domain) is None:
            _diagnose_domain(domain)
    else:
        ascii_domain = _to_a_labels(domain)
    if len(ascii_domain) > _DOMAIN_MAX:
        raise AddressError(f"domain: {len(ascii_domain)} octets, over {_DOMAIN_MAX}", part="domain")
    for label in ascii_domain.split("."):
        if len(label) > _LABEL_MAX:
            raise AddressError(
                f'domain: label "{label[:20]}…" is {len(label)} octets, over {_LABEL_MAX}',
                part="domain",
            )
        if label.startswith("xn--"):
            _check_a_label(label)
    return ascii_domain


def _diagnose_domain(domain: str) -> None:
    """Name the first syntax fault of an ASCII domain (offsets as written)."""
    _check_domain_chars(domain)
    _check_domain_dots(domain)
    offset = 0
    for label in domain.split("."):
        if label[0] == "-" or label[-1] == "-":
            end = "starts" if label[0] == "-" else "ends"
            raise AddressError(
                f'domain: label "{label}" at position {offset} {end} with "-"', part="domain"
            )
        offset += len(label) + 1
    raise AddressError(f'domain: "{domain}" is not a domain name', part="domain")


def _check_domain_chars(domain: str) -> None:
    """Refuse ASCII characters other than letters, digits, "-" and "." (the
    rest of the ASCII range cannot appear in a host name, nor an address
    literal in a MAS address).  Non-ASCII characters are left to IDNA."""
    for pos, ch in enumerate(domain):
        if ch.isascii() and not (ch.isalnum() or ch in "-."):
            raise AddressError(
                f"domain: character {_show(ch)} at position {pos} is not allowed {_DOMAIN_CHARS}",
                part="domain",
            )


def _check_domain_dots(domain: str) -> None:
    """Refuse empty labels: a leading, trailing or doubled "."."""
    if domain[0] == ".":
        raise AddressError('domain: starts with "."', part="domain")
    if domain[-1] == ".":
        raise AddressError('domain: ends with "."', part="domain")
    doubled = domain.find("..")
    if doubled >= 0:
        raise AddressError(f'domain: doubled "." at position {doubled}', part="domain")


def _to_a_labels(domain: str) -> str:
    """Convert a domain with U-labels to A-labels, refusing inexact conversions."""
    written = domain.translate(_ALT_DOTS).lower()
    _check_domain_chars(written)
    _check_domain_dots(written)
    try:
        ascii_domain = written.encode("idna").decode("ascii")
        back = ascii_domain.encode("ascii").decode("idna")
    except UnicodeError as exc:
        reason = str(exc).rpartition("UnicodeError: ")[2].rstrip(")") or "refused by IDNA"
        raise AddressError(
            f'domain: "{domain}" is not a valid internationalized domain name ({reason})',
            part="domain",
        ) from None
    if back != written:
        raise AddressError(
            f'domain: "{domain}" does not convert exactly to A-labels (IDNA maps it to "{back}")',
            part="domain",
        )
    if _LDH_DOMAIN_RE.fullmatch(ascii_domain) is None:
        _diagnose_domain(ascii_domain)
    return ascii_domain


def _check_a_label(label: str) -> None:
    """An ``xn--`` label must be Punycode for a non-ASCII label and encode back
    to itself.  Only Punycode is checked (not the IDNA 2003 mapping), so an
    IDNA 2008 A-label such as ``xn--strae-oqa`` stays valid."""
    try:
        unicode = label[4:].encode("ascii").decode("punycode")
        exact = unicode.encode("punycode").decode("ascii") == label[4:]
    except UnicodeError:
        exact = False
    else:
        exact = exact and not unicode.isascii()
    if not exact:
        raise AddressError(
            f'domain: label "{label}" is not a valid A-label (not Punycode for a non-ASCII label)',
            part="domain",
        )


def check_id_grammar(id: str) -> str:
    """The ``id`` rule of docs/protocol.md §2 alone, whatever the type; returns ``id``."""
    _check_id_grammar(id, 0)
    return id


def check_id(id: str, *, type: str) -> str:
    """Check a resource id the master assigned (slave role, docs/protocol.md §2).

    "An id that does not match ``id``, or that would make ``type=id!mode``
    longer than 64 octets for a mode name of the longest length, 16 (so
    ``type=id`` over 47 octets ...), is refused (``400 invalid-message``)."
    The edge maps the :class:`AddressError` to that reply.  Returns ``id``.
    """
    if _TYPE_RE.fullmatch(type) is None:
        _check_name(type, 0, "type", TYPE_MAX)
    _check_id_grammar(id, 0)
    size = len(type) + 1 + len(id)
    if size > RESOURCE_MAX:
        raise AddressError(
            f'id: "{type.lower()}={id}" is {size} octets, over {RESOURCE_MAX} '
            f"(type=id!mode must fit {LOCAL_MAX} octets with a {MODE_MAX}-character mode)",
            part="id",
        )
    return id


def _parse_case_address(text: str) -> Address:
    """Parse a canonical resource address or a key (no suffix, no mode)."""
    addr = parse_address(text, delimiter="")
    if addr.id is None:
        raise AddressError(f'address: "{text}" is not a resource address (no "=id")', part="id")
    if addr.mode is not None:
        raise AddressError(
            f'mode: "{text}" carries "!{addr.mode}"; a case address has no mode', part="mode"
        )
    return addr


def case_ref(canonical_or_key: str) -> dict[str, str]:
    """The envelope's ``case`` field, ``{"address": canonical, "key": key}``
    (CONTRACT: "case {address, key}: canonical resource address and
    equivalence key"), from a resource address without a mode.

    Type and domain are normalized; the id is kept as given, so pass the
    canonical address to keep the id "as assigned".
    """
    addr = _parse_case_address(canonical_or_key)
    return {"address": addr.canonical, "key": addr.key}


def check_case_ref(ref: Mapping[str, object]) -> Address:
    """Check a received envelope ``case`` field and return its address.

    docs/protocol.md §2: "a receiver refuses a message whose key does not match its
    address (``invalid-message``)".  The address must be canonical (as
    :attr:`Address.canonical` writes it) and the key must be its key; any
    fault is an :class:`AddressError` the edge turns into that refusal.
    """
    address = ref.get("address")
    key = ref.get("key")
    if not isinstance(address, str):
        raise _not_a_string("address", address)
    if not isinstance(key, str):
        raise _not_a_string("key", key)
    addr = _parse_case_address(address)
    if addr.canonical != address:
        raise AddressError(
            f'address: "{address}" is not canonical (expected "{addr.canonical}")',
            part="address",
        )
    if addr.key != key:
        raise AddressError(
            f'key: "{key}" does not match address "{address}" (expected "{addr.key}")',
            part="key",
        )
    return addr


def _not_a_string(name: str, value: object) -> AddressError:
    """``name`` of an envelope's case is missing or not a string."""
    said = "missing" if value is None else f"{type(value).__name__} {str(value)[:40]!r}"
    return AddressError(
        f'{name}: {said}, not a string (case carries "address" and "key")', part=name
    )


def split_key(key: str) -> tuple[str, str | None, str]:
    """``(type, casefolded id or None, domain)`` of a key or canonical address.

    Accepts any spelling of a case or intake address without a mode and
    returns the parts of its key, so ``"type=id@domain"`` built from them
    is the key.
    """
    addr = parse_address(key, delimiter="")
    if addr.mode is not None:
        raise AddressError(f'mode: "{key}" carries "!{addr.mode}"; a key has no mode', part="mode")
    return addr.type, None if addr.id is None else addr.id.casefold(), addr.domain
