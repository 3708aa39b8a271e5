"""Dependencies inside masd point one way, and no module imports itself back.

The import graph is read from the sources with ``ast``: every ``import`` and
``from ... import`` of a masd module, at module level and inside functions
(a lazy import is still a dependency), relative ones resolved.  Two rules:

- **no cycle** between masd's modules (each is named, with the path that
  closes it), but for the ones in :data:`KNOWN_CYCLES`;
- **direction**: a module of one unit imports only from the units
  :data:`ALLOWED` names for it.

A unit is a package of masd (``core``, ``store``, ...), one of the modules
directly in masd/ (``clock``, ``metrics``, ...), or ``cli.text``; see
:func:`unit_of`.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Set
from pathlib import Path

import masd

ROOT = Path(masd.__file__).resolve().parent

#: Units that are one module, not a package (the longest prefix wins).
_MODULE_UNITS = ("masd.cli.text",)

#: What each unit may import of masd, besides itself.  Bottom to top:
#: ``_resources`` (where the conformance data lies), ``clock``, ``logs`` and
#: the root package (its version) import nothing of masd; ``core`` is pure;
#: ``store`` holds the SQL; ``service`` writes through the store and
#: ``read`` shows what it holds; the edges speak the protocols over both;
#: ``app`` wires the edges; ``ops`` and the test tools (``testing``,
#: ``conformance``, ``demo``) use all of that; ``cli`` is the entry point
#: (``python -m masd`` runs it), whose ``masd demo`` and ``masd conformance``
#: commands run the demo and the conformance runner.  ``cli.text`` renders
#: the read side's documents and imports nothing of masd, so the demo prints
#: its pages with it; ``console`` renders the same documents as the operator
#: console's HTML pages and imports nothing of masd either (pure rendering,
#: no I/O), so the HTTP edge serves them.
_BASES = frozenset({"masd", "_resources", "clock", "logs"})
#: What masd runs on: every unit below the tools and the command line.
_RUNTIME = _BASES | {
    "core",
    "config",
    "store",
    "metrics",
    "service",
    "read",
    "console",
    "edges",
    "app",
}
ALLOWED: Mapping[str, frozenset[str]] = {
    "masd": frozenset(),
    "_resources": frozenset(),
    "clock": frozenset(),
    # The scrub redacts the secrets a configuration names (masd.logs.keep_secrets).
    "logs": frozenset({"core", "config"}),
    "cli.text": frozenset(),
    "console": frozenset(),
    # core/status.py reads the transition table through _resources.
    "core": frozenset({"_resources"}),
    "config": frozenset({"core"}),
    "store": frozenset({"core"}),
    # The gauges of GET /metrics are read from the store.
    "metrics": frozenset({"core", "store"}),
    "service": frozenset({"logs", "core", "config", "store", "metrics"}),
    "read": frozenset({"core", "store"}),
    "edges": frozenset(
        {
            "masd",
            "_resources",
            "clock",
            "logs",
            "core",
            "config",
            "store",
            "metrics",
            "service",
            "read",
            "console",
        }
    ),
    "app": _RUNTIME - {"app"},
    "ops": frozenset({"core", "config", "store", "metrics", "service", "read", "edges"}),
    "testing": _RUNTIME | {"ops"},
    "conformance": _RUNTIME | {"ops", "testing"},
    "demo": _RUNTIME | {"ops", "testing", "cli.text"},
    "cli": _RUNTIME | {"ops", "testing", "conformance", "demo", "cli.text"},
    "__main__": frozenset({"cli"}),  # python -m masd
}

#: Cycles known today, each to be undone (a set of the modules in it).
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()

Graph = Mapping[str, frozenset[str]]


def module_name(path: Path) -> str:
    parts = ["masd", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST, package: str, known: Set[str]) -> list[str]:
    """The masd modules one import statement names (none for other nodes)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join([*base, node.module] if node.module else base)
        else:
            module = node.module or ""
        # ``from pkg import name``: the submodule pkg.name when there is one.
        names = [
            f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names
        ]
    else:
        return []
    found = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            found.append(name)
    return found


def graph_of(sources: Mapping[str, tuple[str, bool]]) -> dict[str, frozenset[str]]:
    """module -> the masd modules it imports; ``sources`` maps a module name to
    (its source, whether it is a package's ``__init__``)."""
    out: dict[str, frozenset[str]] = {}
    known = frozenset(sources)
    for name, (text, is_package) in sources.items():
        package = name if is_package else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(text, filename=name)):
            found.update(_imported(node, package, known))
        out[name] = frozenset(found - {name})
    return out


def masd_graph() -> dict[str, frozenset[str]]:
    sources = {module_name(p): (p.read_text(), p.name == "__init__.py") for p in ROOT.rglob("*.py")}
    return graph_of(sources)


def unit_of(module: str) -> str:
    for exact in _MODULE_UNITS:
        if module == exact or module.startswith(exact + "."):
            return exact.removeprefix("masd.")
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "masd"


def cycles(graph: Graph) -> list[list[str]]:
    """Each strongly connected group of two or more modules, as a path that
    closes on its first module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(_closing_path(graph, set(group)))
    return groups


def _closing_path(graph: Graph, group: set[str]) -> list[str]:
    """A path inside ``group`` from its first module back to it (breadth first)."""
    first = min(group)
    came: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(came[path[-1]])
                    return [first, *reversed(path[:-1]), first]
                if child not in came:
                    came[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(group)} is not a cycle")


def backwards(graph: Graph, allowed: Mapping[str, frozenset[str]]) -> list[str]:
    """Each import against the direction: ``importer -> imported (unit -> unit)``."""
    found = []
    for module, imports in sorted(graph.items()):
        mine = unit_of(module)
        for target in sorted(imports):
            theirs = unit_of(target)
            if theirs != mine and theirs not in allowed.get(mine, frozenset()):
                found.append(f"{module} -> {target} ({mine} -> {theirs})")
    return found


def test_no_cycle_between_masd_modules() -> None:
    found = cycles(masd_graph())
    unknown = [" -> ".join(c) for c in found if frozenset(c) not in KNOWN_CYCLES]
    assert unknown == []


def test_every_known_cycle_is_still_there() -> None:
    # A cycle undone leaves KNOWN_CYCLES: the exception does not outlive it.
    found = {frozenset(c) for c in cycles(masd_graph())}
    assert KNOWN_CYCLES - found == set()


def test_every_import_points_down() -> None:
    assert backwards(masd_graph(), ALLOWED) == []


def test_the_table_names_every_unit_and_is_one_way() -> None:
    units = {unit_of(m) for m in masd_graph()}
    assert units - set(ALLOWED) == set(), "a unit without a row in ALLOWED"
    table = {unit: frozenset(allowed) for unit, allowed in ALLOWED.items()}
    assert cycles(table) == []
    assert all(unit not in allowed for unit, allowed in table.items())


def test_the_graph_sees_lazy_and_relative_imports() -> None:
    graph = masd_graph()
    # cli/watch.py imports the read side inside its commands only.
    assert "masd.read.case_views" in graph["masd.cli.watch"]
    assert "masd.ops.doctor" in graph["masd.cli"]
    sources = {
        "masd.pkg": ("from . import low\n", True),
        "masd.pkg.low": ("def f():\n    from .high import g\n", False),
        "masd.pkg.high": ("from masd.pkg.low import f\n", False),
    }
    assert graph_of(sources) == {
        "masd.pkg": frozenset({"masd.pkg.low"}),
        "masd.pkg.low": frozenset({"masd.pkg.high"}),
        "masd.pkg.high": frozenset({"masd.pkg.low"}),
    }


def test_the_checks_can_fail() -> None:
    graph = {
        "masd.core.a": frozenset({"masd.store.b"}),  # against the direction
        "masd.store.b": frozenset({"masd.store.c"}),
        "masd.store.c": frozenset({"masd.store.d"}),
        "masd.store.d": frozenset({"masd.store.b"}),  # closes a cycle
        "masd.service.e": frozenset({"masd.store.b"}),
    }
    assert cycles(graph) == [["masd.store.b", "masd.store.c", "masd.store.d", "masd.store.b"]]
    assert backwards(graph, ALLOWED) == ["masd.core.a -> masd.store.b (core -> store)"]
