"""masd.core.reply._cut_all skips, in C, the lines that hold none of the marks a cut needs;
here it is held to the same rules walked over every line (the skip turned off), on texts made
of the lines the rules look for."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masd.core import reply
from masd.core.reply import _ENDS, _cut_all

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
    """_cut_all with every line tested in Python (no line skipped)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reply._Marks, "next_marked", lambda _self, i: i)
        return _cut_all(lines, from_html)


@settings(max_examples=3000, deadline=None)
@given(
    st.lists(st.sampled_from(LINES) | st.text(alphabet="ab :-=_>：\t*", max_size=12), max_size=16),
    st.booleans(),
)
def test_the_skip_finds_what_the_walk_finds(lines: list[str], from_html: bool) -> None:
    assert _cut_all(lines, from_html) == walk(lines, from_html)


def test_the_walk_visits_every_line() -> None:
    # A cut found only on the line after a run of unmarked ones: the walk must reach it too.
    lines = ["words", "more words", "plain", "-----Original Message-----", "From: x"]
    assert walk(lines, False) == _cut_all(lines, False) == 3


def test_a_mark_in_every_kind_of_cut() -> None:
    # Each cut needs one of the marks in its own line; none may be left out of them.
    assert set("".join(reply._MARKS)) >= set(_ENDS) | set("-=_:：")
