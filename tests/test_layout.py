"""The shape of masd/: SQL only in the store, no module over 600 lines, no function over 60,
at most 8 modules directly in masd/.

Each rule walks every module under masd/ and names, per module, what breaks it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import masd

ROOT = Path(masd.__file__).resolve().parent
STORE = ROOT / "store"

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
#: Modules directly in masd/ (the rest sit in packages that name their concern).
MAX_TOP_MODULES = 8

#: A statement of SQL, as a string in a module (the forms masd writes).
SQL = re.compile(
    r"SELECT .* FROM|INSERT (OR [A-Z]+ )?INTO|UPDATE [a-z_]+ SET|DELETE FROM|CREATE TABLE"
)
#: Database modules (and greenlet, which runs the store's jobs on the event loop) only the
#: store may import.
DATABASE_MODULES = frozenset({"sqlite_utils", "sqlite3", "psycopg", "greenlet"})


def modules() -> Iterator[Path]:
    yield from sorted(ROOT.rglob("*.py"))


def name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def imported(node: ast.AST) -> set[str]:
    """The top-level modules an import statement imports (none for other nodes)."""
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return {node.module.split(".")[0]}
    return set()


def sql_found(path: Path) -> list[str]:
    """Why ``path`` breaks the SQL rule: each SQL string and database import in it."""
    if path.is_relative_to(STORE):
        return []
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if SQL.search(node.value):
                found.append(f"line {node.lineno}: SQL {node.value[:60]!r}")
        else:
            found_modules = sorted(imported(node) & DATABASE_MODULES)
            found += [f"line {getattr(node, 'lineno', 0)}: imports {m}" for m in found_modules]
    return found


def too_long(path: Path) -> list[str]:
    """Why ``path`` breaks the module-size rule."""
    lines = len(path.read_text().splitlines())
    return [f"{lines} lines"] if lines > MAX_MODULE_LINES else []


def long_functions(path: Path) -> list[str]:
    """Why ``path`` breaks the function-size rule: each function over the limit."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


RULES: dict[str, Callable[[Path], list[str]]] = {
    "sql": sql_found,
    "module-size": too_long,
    "function-size": long_functions,
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_module_keeps_the_rule(rule: str) -> None:
    broken = {name(p): why for p in modules() if (why := RULES[rule](p))}
    assert broken == {}


def top_modules(root: Path) -> list[str]:
    """The modules directly in ``root`` (not in a package under it)."""
    return sorted(p.name for p in root.glob("*.py"))


def test_few_modules_sit_directly_in_masd() -> None:
    found = top_modules(ROOT)
    assert len(found) <= MAX_TOP_MODULES, found


def test_the_sql_rule_sees_the_store() -> None:
    # Not vacuous: the store's modules hold the SQL the rule looks for.
    assert len([p for p in STORE.glob("*.py") if SQL.search(p.read_text())]) >= 5


def test_the_rules_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    bad.write_text(
        "import sqlite3\n"
        "from sqlite_utils import Database\n"
        "Q = 'SELECT key FROM cases'\n"
        "W = 'INSERT OR IGNORE INTO cases (key) VALUES (?)'\n"
        "U = 'UPDATE outbox SET state = 1'\n"
        f"def f() -> None:\n{body}\n" + "# filler\n" * MAX_MODULE_LINES
    )
    assert len(sql_found(bad)) == 5
    assert too_long(bad) != []
    assert [f.split(" ")[0] for f in long_functions(bad)] == ["f"]
    good = tmp_path / "good.py"
    good.write_text("'''Select a case from the list.'''\ndef f() -> None:\n    pass\n")
    assert (sql_found(good), too_long(good), long_functions(good)) == ([], [], [])
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    for i in range(MAX_TOP_MODULES + 1):
        (crowded / f"m{i}.py").write_text("")
    assert len(top_modules(crowded)) > MAX_TOP_MODULES
