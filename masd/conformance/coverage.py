"""The coverage table: every clause of docs/protocol.md §2-§14, and its flows.

``conformance/README.md`` holds the table between ``<!-- coverage:begin -->``
and ``<!-- coverage:end -->``; :func:`table` renders it from the flows'
``covers`` and ``masd conformance coverage`` prints it, so the table is
never edited by hand.  A clause a role must pass with no flow of that role
is a gap (:func:`gaps`); a role whose folder holds no flow yet is shown as
"<role> flows (to come)".
"""

from __future__ import annotations

from collections.abc import Sequence

from masd.conformance.flow import CLAUSES, Flow

__all__ = ["BEGIN", "END", "gaps", "table"]

BEGIN = "<!-- coverage:begin -->"
END = "<!-- coverage:end -->"
ROLES = ("master", "slave")


def _cell(flows: Sequence[Flow], clause: str, role: str, roles: frozenset[str]) -> str:
    if role not in roles:
        return "(not this role)"
    names = sorted(f.name for f in flows if f.role == role and clause in f.covers)
    if names:
        return ", ".join(f"`{n}`" for n in names)
    if not any(f.role == role for f in flows):
        return f"{role} flows (to come)"
    return "**none**"


def table(flows: Sequence[Flow]) -> str:
    """The Markdown table, one row per clause (without the markers)."""
    lines = [
        "| clause | what | master flows | slave flows |",
        "| --- | --- | --- | --- |",
    ]
    for clause in CLAUSES:
        cells = [_cell(flows, clause.id, role, clause.roles) for role in ROLES]
        lines.append(f"| {clause.id} | {clause.title} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def gaps(flows: Sequence[Flow], role: str) -> list[str]:
    """Clauses ``role`` must pass that no flow of ``role`` covers."""
    covered = {c for f in flows if f.role == role for c in f.covers}
    return [c.id for c in CLAUSES if role in c.roles and c.id not in covered]
