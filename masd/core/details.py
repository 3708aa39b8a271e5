"""Handoff details from mail text (docs/protocol.md §6).

"handoff.request.details holds subject and each field of the endpoint's
fields list found in the mail's text as a name: value line (name
case-insensitive)."  A negotiation question lists each needed field as an
empty ``name:`` line; a reply fills them in the same way.

The text searched is the event's ``reply_text`` (profile §21): the sender's
own words, so a ``name: value`` line of the quoted question, of an Outlook
header block or of a signature is never taken for the sender's answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

#: Bounds on what is taken from a line: field values are short by nature.
MAX_VALUE: Final = 512
_LINE: Final = re.compile(r"^[ \t]*([A-Za-z][A-Za-z0-9_-]{0,63})[ \t]*:[ \t]*(.*?)[ \t]*$", re.M)


def find_fields(text: str, names: Iterable[str]) -> dict[str, str]:
    """The first non-empty ``name: value`` line for each of ``names``.

    Quoted lines (``> phone: ...``) do not match: they repeat someone else's
    words, not the sender's.
    """
    wanted = {n.lower() for n in names}
    found: dict[str, str] = {}
    for match in _LINE.finditer(text):
        name = match.group(1).lower()
        value = match.group(2)[:MAX_VALUE]
        if name in wanted and value:
            found.setdefault(name, value)
    return {name: found[name] for name in sorted(found)}


def question_lines(needs: Iterable[str]) -> str:
    """The empty ``name:`` lines of a negotiation question."""
    return "".join(f"{name}:\n" for name in needs)
