"""masd.core.reply._cut_all skips, in C, the lines that hold none of the marks a cut needs;
here it is held to the plain walk over every line it replaced, on texts made of the lines
the rules look for."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from masd.core import reply
from masd.core.reply import (
    _ENDS,
    _FORWARD_INTRO,
    _MAX_INTRO,
    _above_rule,
    _attribution_start,
    _cut_all,
    _header_block,
    _is_separator,
    _unmarked_attribution,
    has_words,
)

#: lines the rules act on, plain words, and lines holding a mark by chance
LINES = (
    "hello there", "Thanks,", "Ann", "", " ", "> quoted", ">", "-- ", "--",
    "-----Original Message-----", "From: Ann <a@b.c>", "Sent: Monday", "To: x@y.z",
    "Subject: hi", "On Mon, 1 Jan 2026, Ann wrote:", "Ann wrote:", "wrote:",
    "________________________________", "=====", "Le lun. 1 janv. 2026, Ann a écrit :",
    "写道：", "---------- Forwarded message ---------", "https://example.org/x", "a - b",
    "x = y", "snake_case", "10:30", "* bullet", "  indented words", "Von: Ann", "-", ":",
    "：", "=", "_", "**From:** Ann", "Begin forwarded message:", "Sent from my iPhone",
)  # fmt: skip


def walk(lines: list[str], from_html: bool) -> int:
    """_cut_all as it was: every line tested in Python."""
    words = False
    for i, line in enumerate(lines):
        head = line.lstrip(" \t*")[:1]
        if not head or head == ">":
            continue
        colon = ":" in line or "：" in line
        end = line.rstrip()[-1:]
        if (
            (head in "-=_" and _is_separator(line))
            or (end in _ENDS and len(line) <= _MAX_INTRO and _FORWARD_INTRO.match(line))
            or (colon and _header_block(lines, i))
        ):
            if words:
                return _above_rule(lines, i)
            continue
        if not from_html and end in _ENDS and _unmarked_attribution(lines, i):
            start = _attribution_start(lines, i, strong=True) or 0
            if any(has_words(x) for x in lines[:start]):
                return start
        words = words or has_words(line)
    return len(lines)


@settings(max_examples=3000, deadline=None)
@given(
    st.lists(st.sampled_from(LINES) | st.text(alphabet="ab :-=_>：\t*", max_size=12), max_size=16),
    st.booleans(),
)
def test_the_skip_finds_what_the_walk_finds(lines: list[str], from_html: bool) -> None:
    assert _cut_all(lines, from_html) == walk(lines, from_html)


def test_a_mark_in_every_kind_of_cut() -> None:
    # Each cut needs one of the marks in its own line; none may be left out of them.
    assert set("".join(reply._MARKS)) >= set(_ENDS) | set("-=_:：")
