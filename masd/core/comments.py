"""RFC 5322 comments in header values: the one helper both the MIME reader and
the trust rules use (:mod:`masd.core.mime`, :mod:`masd.core.trust`)."""

from __future__ import annotations

import re

__all__ = ["strip_comments"]

#: One comment holding no other comment (no "(" inside).
_FLAT_COMMENT = re.compile(r"\([^()]*\)")


def strip_comments(value: str) -> str:
    """Remove RFC 5322 comments ``( ... )`` (nested, with quoted-pairs).

    Quoted strings are kept as they are: a parenthesis inside quotes is not a
    comment.  An unclosed comment runs to the end of the value.  Linear time.
    """
    if "(" not in value:
        return value
    if '"' not in value and "\\" not in value:
        # Without quotes and quoted-pairs, a comment holding no "(" is just
        # "(" ... the first ")" (what the loop below reads), so flat comments
        # can go in one C-level pass.  A "(" left over belongs to a nested or
        # unclosed comment: the loop reads those.
        flat = _FLAT_COMMENT.sub(" ", value)
        if "(" not in flat:
            return flat
    return _strip_comments_scan(value)


def _strip_comments_scan(value: str) -> str:
    """strip_comments for any value, one character at a time."""
    out: list[str] = []
    depth = 0
    quoted = False
    i = 0
    n = len(value)
    while i < n:
        c = value[i]
        if c == "\\" and (depth or quoted):
            if not depth:
                out.append(value[i : i + 2])
            i += 2
            continue
        if depth:
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if not depth:
                    out.append(" ")
        elif quoted:
            out.append(c)
            if c == '"':
                quoted = False
        elif c == "(":
            depth = 1
        else:
            out.append(c)
            if c == '"':
                quoted = True
        i += 1
    return "".join(out)
