"""The JSON masd reads (docs/protocol.md §9.5): the screen in ``wire.loads`` and the walk.

``loads`` parses most messages without walking their values; whatever its screen cannot
vouch for is parsed again and walked.  The refusals are the walk's, anywhere in the body,
unknown fields included: each class is pinned here with its exact detail, and arbitrary
texts around the screen's limits get the same answer either way.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masd.core import wire
from masd.core.errors import WireError

STATUS = (
    '{"mas_modes_version": "0.1", "type": "handoff.status", "id": "st-1", '
    '"case": {"address": "ticket=gs-1@help.example", "key": "ticket=gs-1@help.example"}, '
    '"handoff_id": "h1", "seq": 7, "status": "running", "detail": "\\u00e9 \u00e9"'
)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


#: A field masd does not know, and the detail its value is refused with.
UNKNOWN_FIELD = [
    ('"x-note": "a\\u0000b"', "x-note: a string with a NUL character"),
    (
        '"x-note": {"k": "\\ud800"}',
        "x-note.k: a string with an unpaired surrogate (not Unicode text)",
    ),
    (
        '"x-note": ["ok", "\\uDFFF"]',
        "x-note[1]: a string with an unpaired surrogate (not Unicode text)",
    ),
    ('"x\\u0000": 1', '"x\\u0000" (the name): a string with a NUL character'),
    ('"x-note": {"k": 1, "k": 2}', "x-note.k: given twice in one object"),
    ('"x-note": 1, "x-note": 2', "x-note: given twice in one object"),
    ('"x-note": 9007199254740993', "x-note: the integer 9007199254740993 is outside ±2^53"),
    ('"x-note": -9007199254740993', "x-note: the integer -9007199254740993 is outside ±2^53"),
    (
        '"x-note": [' + "1" * 30 + "]",
        "x-note[0]: the integer 11111111111111111111... (30 characters) is outside ±2^53",
    ),
    ('"x-note": 1e999', "x-note: a number too large for a double"),
    ('"x-note": {"k": -1.8e308}', "x-note.k: a number too large for a double"),
    ('"x-note": ' + _nested(32), "x-note: JSON nested deeper than 32 levels"),
    ('"x-note": NaN', "body: not JSON (NaN is not a JSON value)"),
    ('"x-note": -Infinity', "body: not JSON (-Infinity is not a JSON value)"),
]


@pytest.mark.parametrize(("field", "detail"), UNKNOWN_FIELD)
def test_a_fault_in_an_unknown_field_is_refused_by_name(field: str, detail: str) -> None:
    with pytest.raises(WireError) as refused:
        wire.parse_envelope(f"{STATUS}, {field}}}".encode())
    assert (refused.value.code, refused.value.detail) == ("invalid-message", detail)


#: Values at the screen's limits that masd keeps.
KEPT = [
    '"x-note": 999999999999999',  # 15 digits: within the screen
    '"x-note": [9007199254740992, -9007199254740992]',  # ±2^53: walked, kept
    '"x-note": 1.7976931348623157e308',
    '"x-note": 0.0000000000000000001',
    '"x-note": "\\\\u0000 is six characters, not a NUL"',
    '"x-note": "\\ud83d\\ude00"',
    '"x-note": ' + _nested(31),  # with the top object, 32 levels
    '"x-note": "{[{[{[{[{[{[{[{[{[{[{[{[{[{[{[{[{["',  # brackets in a string
]


@pytest.mark.parametrize("field", KEPT)
def test_values_at_the_screens_limits_are_kept(field: str) -> None:
    text = f"{STATUS}, {field}}}"
    assert wire.parse_envelope(text.encode()).body == json.loads(text)


def test_a_plain_status_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    def walked(text: str) -> Any:
        raise AssertionError("walked")

    monkeypatch.setattr(wire, "_walked", walked)
    body = wire.parse_envelope(f"{STATUS}, {KEPT[0]}}}".encode()).body
    assert (body["seq"], body["detail"]) == (7, "\u00e9 \u00e9")


# --------------------------------------------------------------------------- screen against walk

_SCALARS = st.sampled_from(
    [
        "0",
        "-1",
        "999999999999999",
        "-999999999999999",
        "9007199254740992",
        "-9007199254740993",
        "1" * 17,
        "1.5",
        "1e308",
        "1e309",
        "-2E+400",
        "1e-400",
        "1" * 320 + ".0",
        "true",
        "null",
        "NaN",
        "Infinity",
    ]
)
_PIECES = st.sampled_from(
    ["a", " ", "\u00e9", "\\u00e9", "\\u0000", "\\\\u0000", "\\ud800", "\\uDBFF\\uDC00", "{", "]"]
)
_STRINGS = st.lists(_PIECES, max_size=4).map(lambda parts: '"' + "".join(parts) + '"')
_KEYS = st.sampled_from(['"a"', '"b"', '"\\u0000"', '"\\udc00"'])


def _containers(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    arrays = st.lists(inner, max_size=3).map(lambda items: "[" + ",".join(items) + "]")
    objects = st.lists(st.tuples(_KEYS, inner), max_size=3).map(
        lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"
    )
    deep = st.tuples(st.integers(28, 34), inner).map(lambda d: "[" * d[0] + d[1] + "]" * d[0])
    return arrays | objects | deep


_VALUES = st.recursive(_SCALARS | _STRINGS, _containers, max_leaves=12)


def _answer(read: Any, text: str) -> tuple[str, Any]:
    try:
        return "kept", read(text)
    except WireError as exc:
        return exc.code, exc.detail


@given(value=_VALUES, cut=st.integers(0, 2))
@settings(max_examples=600, deadline=None)
def test_the_screen_answers_as_the_walk_does(value: str, cut: int) -> None:
    text = '{"x-note": ' + value + "}"
    text = text[: len(text) - cut]  # cut short: not JSON
    assert _answer(lambda t: wire.loads(t.encode()), text) == _answer(wire._walked, text)
