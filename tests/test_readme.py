"""README.md says what the code does."""

from __future__ import annotations

import json
import re
from pathlib import Path

from masd._resources import conformance_file

ROOT = Path(__file__).resolve().parent.parent


def test_readme_status_table_is_drawn_from_transitions_json() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- transitions:begin -->\n(.*?)<!-- transitions:end -->", readme, re.S)
    assert block is not None
    rows = {}
    for line in block.group(1).splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = [s.strip() for s in cells[1].split(",")]
    table = json.loads(conformance_file("transitions.json").read_text())["transitions"]
    assert rows == table


def test_readme_names_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme
    assert "make test" in readme
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M)
    assert re.search(r"^test:", makefile, re.M)
