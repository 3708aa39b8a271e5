"""RFC 5322 addresses and message ids, read strictly and repaired only where mail breaks.

One account of the address grammar (RFC 5322 §3.4), with the obsolete forms §4
says a reader must accept (obs-phrase with ".", obs-local-part and obs-domain
with CFWS between words, obs-route in an angle-addr, empty list members)::

    address-list = address *("," address)
    address      = mailbox / group
    group        = display-name ":" [mailbox-list] ";"
    mailbox      = name-addr / addr-spec
    name-addr    = [display-name] "<" [obs-route] addr-spec ">"
    addr-spec    = local-part "@" domain

Comments are whitespace here: a display name comes only from the phrase, never
from a comment.  The value is cut into list members at "," outside quotes,
comments, angle brackets and groups; a member the grammar does not describe is
repaired by two rules, each one reading that real mail software writes:

* a member with an angle-addr has that address; what stands before the "<",
  whatever it is, is the display name (``alice@example.com <bob@example.com>``
  is Bob's mail, displayed as "alice@example.com");
* a member without one is the addr-specs in it, each a mailbox
  (``a@example.com b@example.com`` is two), words standing before the first one
  its display name.  Words never join an address across whitespace.

Nothing here depends on :mod:`email.utils`, whose answers changed between
Python patch releases.  Everything is linear in the length of the value.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Mailbox", "mailboxes", "msg_id", "msg_ids"]


class Mailbox(NamedTuple):
    """One mailbox: ``name`` is the display name as written (encoded words kept)."""

    name: str
    address: str


# Lexical tokens: a quoted string, a domain literal, a comment start, an atom
# run (atext and, leniently, any 8-bit character), whitespace, or one special.
_TOKEN = re.compile(
    r'"(?P<q>(?:[^"\\]|\\.)*)"?'
    r"|\[(?P<lit>[^\[\]]*)\]?"
    r"|(?P<c>\()"
    r"|(?P<atom>[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-\x80-\U0010ffff]+)"
    r"|(?P<ws>[\s]+)"
    r"|(?P<sp>.)",
    re.DOTALL,
)
_QP = re.compile(r"\\(.)", re.DOTALL)
_ATOM_ONLY = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-\x80-\U0010ffff]+")

# Token kinds: "w" atom, "q" quoted string, "l" domain literal, "s" special,
# " " whitespace, "c" comment (its text; whitespace to the grammar).
Token = tuple[str, str]


def _skip_comment(value: str, pos: int) -> int:
    """The index after the comment whose "(" is at ``pos - 1`` (nesting, quoted pairs)."""
    depth = 1
    n = len(value)
    while pos < n and depth:
        ch = value[pos]
        if ch == "\\":
            pos += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        pos += 1
    return min(pos, n)


def _tokens(value: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    n = len(value)
    while pos < n:
        m = _TOKEN.match(value, pos)
        if m is None:  # pragma: no cover - the last alternative matches any character
            break
        kind = m.lastgroup
        pos = m.end()
        if kind == "c":
            end = _skip_comment(value, pos)
            out.append(
                ("c", value[pos : end - 1] if value[end - 1 : end] == ")" else value[pos:end])
            )
            pos = end
        elif kind == "ws":
            out.append((" ", " "))
        elif kind == "q":
            out.append(("q", _QP.sub(r"\1", m.group("q"))))
        elif kind == "lit":
            out.append(("l", "[" + "".join(m.group("lit").split()) + "]"))
        elif kind == "atom":
            out.append(("w", m.group()))
        else:
            out.append(("s", m.group()))
    return out


def _members(tokens: list[Token]) -> list[list[Token]]:
    """The list members: cut at "," outside angle brackets; a group's ":" and ";" cut too."""
    members: list[list[Token]] = [[]]
    angle = False
    for tok in tokens:
        kind, text = tok
        if kind == "s":
            if text == "<":
                angle = True
            elif text == ">":
                angle = False
            elif not angle and text in ",;":
                members.append([])
                continue
            elif not angle and text == ":":
                # "display-name :" opens a group: the name is no mailbox.
                members[-1] = []
                continue
        members[-1].append(tok)
    return [m for m in members if any(k not in " c" for k, _ in m)]


def _phrase(tokens: list[Token]) -> str:
    """A display name: words joined by one space where whitespace stood, "." kept."""
    parts: list[str] = []
    space = False
    for kind, text in tokens:
        if kind in " c":
            space = bool(parts)
            continue
        if space:
            parts.append(" ")
        parts.append(text)
        space = False
    return "".join(parts).strip()


def _local(words: list[str], quoted: bool) -> str:
    local = ".".join(words)
    if not quoted or _dot_atom(local):
        return local
    return '"' + local.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dot_atom(text: str) -> bool:
    return all(_ATOM_ONLY.fullmatch(piece) for piece in text.split(".")) and bool(text)


def _addr_spec(tokens: list[Token], i: int) -> tuple[str | None, int]:
    """An addr-spec starting at token ``i`` (CFWS allowed around "." and "@").

    (text, end) when there is one; else (None, stop), ``stop`` the token that
    broke it: no addr-spec starts between ``i`` and ``stop`` either (each
    would run into the same token), so a caller goes on from ``stop``.
    """
    n = len(tokens)

    def skip(j: int) -> int:
        while j < n and tokens[j][0] in " c":
            j += 1
        return j

    words: list[str] = []
    quoted = False
    j = i
    while True:
        if j >= n or tokens[j][0] not in "wq":
            return None, max(j, i + 1)
        quoted = quoted or tokens[j][0] == "q"
        words.append(tokens[j][1])
        k = skip(j + 1)
        if k < n and tokens[k] == ("s", "."):
            j = skip(k + 1)
            continue
        if k < n and tokens[k] == ("s", "@"):
            j = skip(k + 1)
            break
        return None, k
    if j < n and tokens[j][0] == "l":
        return f"{_local(words, quoted)}@{tokens[j][1]}", j + 1
    labels: list[str] = []
    while j < n and tokens[j][0] == "w":
        labels.append(tokens[j][1])
        k = skip(j + 1)
        if k < n and tokens[k] == ("s", ".") and skip(k + 1) < n and tokens[skip(k + 1)][0] == "w":
            j = skip(k + 1)
            continue
        j += 1
        break
    if not labels:
        return None, j
    return f"{_local(words, quoted)}@{'.'.join(labels)}", j


def _angle(tokens: list[Token], lt: int) -> str | None:
    """The addr-spec inside the angle brackets opened at ``lt`` (an obs-route dropped)."""
    end = next((k for k in range(lt + 1, len(tokens)) if tokens[k] == ("s", ">")), len(tokens))
    inner = tokens[lt + 1 : end]
    colon = next((k for k, t in enumerate(inner) if t == ("s", ":")), -1)
    if colon >= 0 and all(t[0] in " cw" or t[1] in "@.," for t in inner[:colon]):
        inner = inner[colon + 1 :]
    start = next((k for k, t in enumerate(inner) if t[0] not in " c"), len(inner))
    text, stop = _addr_spec(inner, start)
    if text is None:
        return None
    if any(t[0] not in " c" for t in inner[stop:]):
        return None
    return text


def _member(tokens: list[Token]) -> list[Mailbox]:
    lt = next((k for k, t in enumerate(tokens) if t == ("s", "<")), -1)
    if lt >= 0:
        address = _angle(tokens, lt)
        return [Mailbox(_phrase(tokens[:lt]), address)] if address else []
    found: list[Mailbox] = []
    name_end = -1
    i = 0
    n = len(tokens)
    while i < n:
        if tokens[i][0] in "wq":
            spec, stop = _addr_spec(tokens, i)
            if spec is not None:
                if not found:
                    name_end = i
                found.append(Mailbox("", spec))
            i = stop  # words of a name (or junk) up to there
            continue
        i += 1
    if found and any(t[0] in "wq" for t in tokens[:name_end]):
        found[0] = Mailbox(_phrase([t for t in tokens[:name_end] if t[0] != "s"]), found[0][1])
    return found


# The plain forms most mail is written in, read in one match: ``local@domain``
# or ``[phrase] <local@domain>``, the phrase one quoted string (no backslash)
# or atoms separated by spaces, local part and domain ASCII dot-atoms.  On
# them the general reading below gives the same mailbox (tests/test_rfc5322.py
# holds the two together).
_DOT_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
_ADDR_SPEC = rf"{_DOT_ATOM}@{_DOT_ATOM}"
_PHRASE_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-\x80-\U0010ffff]+"
_PLAIN = re.compile(
    rf"[ ]*(?:(?P<bare>{_ADDR_SPEC})"
    r'|(?:"(?P<quoted>[^"\\]*)"[ ]*'
    rf"|(?P<atoms>{_PHRASE_ATOM}(?:[ .]+{_PHRASE_ATOM})*\.?)[ ]*)?"
    rf"<(?P<angle>{_ADDR_SPEC})>)[ ]*"
)


def _plain(value: str) -> Mailbox | None:
    m = _PLAIN.fullmatch(value)
    if m is None:
        return None
    bare, quoted, atoms, angle = m.group("bare", "quoted", "atoms", "angle")
    if bare is not None:
        return Mailbox("", bare)
    if quoted is not None:
        return Mailbox(quoted.strip(), angle)
    return Mailbox(_join_atoms(atoms) if atoms else "", angle)


def _join_atoms(atoms: str) -> str:
    """A phrase of atoms and "." as ``_phrase`` joins it: one space where spaces stood."""
    return " ".join(atoms.split())


def mailboxes(value: str) -> list[Mailbox]:
    """Every mailbox of an address-list header value (From, To, Cc, Sender...)."""
    plain = _plain(value)
    return [plain] if plain is not None else read_mailboxes(value)


def read_mailboxes(value: str) -> list[Mailbox]:
    """``mailboxes`` by the general reading alone."""
    out: list[Mailbox] = []
    for member in _members(_tokens(value)):
        out.extend(_member(member))
    return out


# ---------------------------------------------------------------------------
# Message ids (RFC 5322 §3.6.4; obs-id-left / obs-id-right allow CFWS inside)

_ID_SPAN = re.compile(r"<([^<>]*)(?:>|(?=<)|$)")


def _strip_comments(value: str) -> str:
    if "(" not in value:
        return value
    out: list[str] = []
    pos = 0
    n = len(value)
    while pos < n:
        ch = value[pos]
        if ch == "(":
            pos = _skip_comment(value, pos + 1)
            out.append(" ")
            continue
        if ch == '"':
            end = value.find('"', pos + 1)
            end = n if end < 0 else end + 1
            out.append(value[pos:end])
            pos = end
            continue
        out.append(ch)
        pos += 1
    return "".join(out)


def _clean_id(inner: str) -> str | None:
    text = "".join(inner.split())
    return f"<{text}>" if text else None


def msg_ids(value: str) -> list[str]:
    """Every message id of a References or In-Reply-To value, as ``<left@right>``.

    Damage seen in real mail is repaired: an id missing its ">" ends where
    the next "<" or the value does; whitespace and comments inside an id (the
    obsolete syntax) are removed.  A value with no "<" at all is read as
    bare ids, one per whitespace-separated word that has an "@".
    """
    text = _strip_comments(value)
    if "<" in text:
        ids = [_clean_id(m.group(1)) for m in _ID_SPAN.finditer(text)]
        return [i for i in ids if i]
    words = text.split()
    if len(words) == 1:
        return [f"<{words[0]}>"]
    joined = "".join(words)
    if joined.count("@") == 1 and all("@" not in w or w == "@" for w in words[1:-1]):
        return [f"<{joined}>"]  # "left @ right": one id written with spaces
    return [f"<{w}>" for w in words if "@" in w]


def msg_id(value: str) -> str | None:
    """The first message id of a Message-ID (or In-Reply-To) value, else None."""
    ids = msg_ids(value)
    return ids[0] if ids else None
