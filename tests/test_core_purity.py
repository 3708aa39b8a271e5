"""masd/core/ is pure: it imports no event loop, database or network client."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import masd.core

FORBIDDEN = {"asyncio", "sqlite3", "httpx", "aiosmtpd", "sqlite_utils", "aiohttp", "socket"}
#: The stdlib email package (allowed in the core) imports socket itself, for
#: email.utils.make_msgid; the core's own sources still may not.
LOADED_FORBIDDEN = FORBIDDEN - {"socket"}
CORE = Path(masd.core.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_core_sources_import_nothing_forbidden() -> None:
    files = sorted(CORE.glob("*.py"))
    assert len(files) >= 3
    offenders = {f.name: _imports(f) & FORBIDDEN for f in files if _imports(f) & FORBIDDEN}
    assert offenders == {}


def test_importing_the_core_loads_nothing_forbidden() -> None:
    modules = [f"masd.core.{m.name}" for m in pkgutil.iter_modules([str(CORE)])]
    script = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + f"print(sorted(set(sys.modules) & set({sorted(LOADED_FORBIDDEN)!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out == "[]", f"importing {modules} pulled in {out}"


def test_the_purity_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncio\nfrom sqlite3 import connect\n")
    assert _imports(bad) & FORBIDDEN == {"asyncio", "sqlite3"}
