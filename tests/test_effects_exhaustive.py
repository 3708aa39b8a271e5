"""Every effect the engine can answer has a handler, and mypy says so when one has none.

masd/service/apply.py carries effects out with a ``match`` over the union
:data:`masd.core.engine.Effect` that ends in ``assert_never``.  The first test
checks that the match names every member of the union and nothing else; the
second runs mypy on a match that forgets one member, to show that the
``assert_never`` ending is what turns a forgotten effect into a type error
(the strict mypy run of ``make test`` checks the real match).
"""

from __future__ import annotations

import ast
import importlib
import typing
from pathlib import Path

import pytest
from mypy import api as mypy_api

from masd.core import engine

APPLY = Path(str(importlib.import_module("masd.service.apply").__file__))


def _carry_out() -> ast.Match:
    tree = ast.parse(APPLY.read_text(), filename=str(APPLY))
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_carry_out"]
    assert len(funcs) == 1
    matches = [n for n in funcs[0].body if isinstance(n, ast.Match)]
    assert len(matches) == 1
    return matches[0]


def test_the_match_handles_every_effect_once_and_ends_in_assert_never() -> None:
    match = _carry_out()
    *named, last = match.cases
    classes = [c.pattern.cls for c in named if isinstance(c.pattern, ast.MatchClass)]
    assert len(classes) == len(named)
    handled = [c.id for c in classes if isinstance(c, ast.Name)]
    members = [t.__name__ for t in typing.get_args(engine.Effect)]
    assert len(members) >= 10
    assert sorted(handled) == sorted(members)
    assert len(set(handled)) == len(handled)
    assert isinstance(last.pattern, ast.MatchAs)
    assert last.pattern.pattern is None
    call = last.body[0]
    assert isinstance(call, ast.Expr)
    assert isinstance(call.value, ast.Call)
    assert isinstance(call.value.func, ast.Name)
    assert call.value.func.id == "assert_never"


_SNIPPET = """\
from typing import assert_never

from masd.core.engine import Effect, {imports}


def carry_out(effect: Effect) -> None:
    match effect:
{cases}
        case _:
            assert_never(effect)
"""


def _snippet(members: list[str]) -> str:
    cases = "".join(f"        case {m}():\n            pass\n" for m in members)
    return _SNIPPET.format(imports=", ".join(members), cases=cases)


@pytest.mark.slow
def test_mypy_names_an_effect_without_a_handler(tmp_path: Path) -> None:
    members = [t.__name__ for t in typing.get_args(engine.Effect)]
    forgotten = members[-1]
    complete = tmp_path / "complete.py"
    complete.write_text(_snippet(members))
    partial = tmp_path / "partial.py"
    partial.write_text(_snippet(members[:-1]))
    args = ["--strict", "--no-incremental", "--follow-imports=silent", "--no-error-summary"]
    args += ["--cache-dir", str(tmp_path / "cache")]
    out, err, status = mypy_api.run([*args, str(complete)])
    assert (status, out, err) == (0, "", "")
    out, err, status = mypy_api.run([*args, str(partial)])
    assert status == 1, out
    assert "assert_never" in out
    assert forgotten in out, out
