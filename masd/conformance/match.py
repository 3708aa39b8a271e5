"""Matching what an implementation did against what a flow expects.

- :func:`substitute` fills ``${name}`` from the flow's variables: a string
  that is exactly ``${name}`` becomes the value itself (an object, a
  number); inside a longer string the value is written as text.
- :func:`match` compares an expected JSON value with an actual one and
  returns the first difference (or None).  Objects match as a *subset*
  (keys the flow does not name may be anything); lists match element by
  element and must have the same length; scalars must be equal, with the
  same JSON type.  An object with one ``$``-key is an operator:

  ``{"$regex": "^[0-9a-f]{32,}$"}``  a string the pattern finds (``re.search``)
  ``{"$contains": x}``  a string holding the substring x, or a list with an element matching x
  ``{"$exact": x}``     like x, but objects must have no other keys (at every depth)
  ``{"$absent": true}`` as an object's value: the key must not be there
  ``{"$any": true}``    present, any value
  ``{"$len": n}``       a string, list or object of length n

- :func:`get_path` reads ``a.b.0.c`` from a value, for captures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = ["OPERATORS", "MatchError", "get_path", "match", "substitute"]

OPERATORS: Final = frozenset({"$regex", "$contains", "$exact", "$absent", "$any", "$len"})
_VAR_REF = re.compile(r"\$\{([^}]*)\}")
_MISSING: Final = object()


class MatchError(Exception):
    """A ``${name}`` with no value, or a capture path that is not there."""


def substitute(value: Any, lookup: Callable[[str], Any]) -> Any:
    """``value`` with every ``${name}`` replaced by ``lookup(name)`` (recursively)."""
    if isinstance(value, str):
        whole = _VAR_REF.fullmatch(value)
        if whole:
            return lookup(whole.group(1))
        return _VAR_REF.sub(lambda m: _text(lookup(m.group(1))), value)
    if isinstance(value, dict):
        return {substitute(k, lookup): substitute(v, lookup) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, lookup) for v in value]
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 200 else text[:200] + "…"


def _same_type(a: Any, b: Any) -> bool:
    """JSON types: a boolean is not a number, an int and a float are both numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return True
    return type(a) is type(b)


def _operator(expected: Any) -> tuple[str, Any] | None:
    if isinstance(expected, dict) and len(expected) == 1:
        ((key, arg),) = expected.items()
        if isinstance(key, str) and key.startswith("$"):
            return key, arg
    return None


def match(expected: Any, actual: Any, path: str = "") -> str | None:
    """The first difference between ``expected`` and ``actual``, or None when they match."""
    where = path or "(value)"
    op = _operator(expected)
    if op is not None:
        return _apply(op[0], op[1], actual, where)
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{where}: expected an object, got {_show(actual)}"
        for key, want in expected.items():
            sub = f"{path}.{key}" if path else str(key)
            inner = _operator(want)
            if inner is not None and inner[0] == "$absent":
                if inner[1] and key in actual:
                    return f"{sub}: expected no such key, got {_show(actual[key])}"
                continue
            if key not in actual:
                return f"{sub}: missing (expected {_show(want)})"
            diff = match(want, actual[key], sub)
            if diff is not None:
                return diff
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return f"{where}: expected a list, got {_show(actual)}"
        if len(expected) != len(actual):
            return f"{where}: expected {len(expected)} elements, got {len(actual)}: {_show(actual)}"
        for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
            diff = match(want, got, f"{path}[{i}]")
            if diff is not None:
                return diff
        return None
    if not _same_type(expected, actual) or expected != actual:
        return f"{where}: expected {_show(expected)}, got {_show(actual)}"
    return None


def _apply(op: str, arg: Any, actual: Any, where: str) -> str | None:
    if op == "$any":
        return None
    if op == "$absent":
        return f"{where}: $absent is only for an object's key"
    if op == "$exact":
        return _exact(arg, actual, where)
    if op == "$regex":
        if isinstance(actual, str) and isinstance(arg, str) and re.search(arg, actual):
            return None
        return f"{where}: expected text matching /{arg}/, got {_show(actual)}"
    if op == "$contains":
        if isinstance(actual, str) and isinstance(arg, str):
            if arg in actual:
                return None
            return f"{where}: expected text containing {_show(arg)}, got {_show(actual)}"
        if isinstance(actual, list):
            if any(match(arg, item) is None for item in actual):
                return None
            return f"{where}: expected a list with an element {_show(arg)}, got {_show(actual)}"
        return f"{where}: expected text or a list containing {_show(arg)}, got {_show(actual)}"
    if op == "$len":
        if isinstance(actual, str | list | dict) and len(actual) == arg:
            return None
        return f"{where}: expected length {arg}, got {_show(actual)}"
    return f"{where}: unknown operator {op} (known: {', '.join(sorted(OPERATORS))})"


def _exact(expected: Any, actual: Any, where: str) -> str | None:
    """Like :func:`match`, but objects must have exactly the keys named (at every depth)."""
    if isinstance(expected, dict) and _operator(expected) is None:
        if not isinstance(actual, dict):
            return f"{where}: expected an object, got {_show(actual)}"
        extra = sorted(set(actual) - set(expected))
        if extra:
            return f"{where}.{extra[0]}: not expected (exact), got {_show(actual[extra[0]])}"
        for key, want in expected.items():
            if key not in actual:
                return f"{where}.{key}: missing (expected {_show(want)})"
            diff = _exact(want, actual[key], f"{where}.{key}")
            if diff is not None:
                return diff
        return None
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
            diff = _exact(want, got, f"{where}[{i}]")
            if diff is not None:
                return diff
        return None
    return match(expected, actual, where)


def get_path(value: Any, path: str) -> Any:
    """``a.b.0.c`` inside ``value`` (``$``: all of it); :class:`MatchError` when not there."""
    if path == "$":
        return value
    current = value
    for part in path.split("."):
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            raise MatchError(f"{path}: no {part!r} in {_show(current)}")
    return current
