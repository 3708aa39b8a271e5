"""docs/operations.md: every command in it is one CI runs.

The guide's ` ```sh ` blocks are run verbatim, in order, by
``.ci/checks.d/operations.sh``, which takes the script this module prints
(``python tests/test_operations_doc.py``).  Lines of ` ```sh live ` blocks
need masd and Postfix running under systemd: the script runs their ``masd``,
``runuser`` and ``curl`` lines against a masd it starts itself, and leaves out
``systemctl``, ``journalctl`` and ``postqueue`` (no systemd as PID 1, no
running Postfix on the CI machine); the Postfix e2e tests run ``postqueue``.

The tests here check the guide against the repository: the Postfix and
verifier lines it explains are the files in packaging/postfix/ and
packaging/dmarc/, the units it names exist, and the script covers every line.
` ```sh db ` blocks are run on the database server of section 11: CI's is a PostgreSQL
cluster of its own on a second loopback address, named ``db.internal``; their first lines
set variables (``MASDHOSTS=...``), which CI sets to its own values, given as ``NAME=value``
arguments (``python tests/test_operations_doc.py MASDHOSTS=127.0.0.1/32``).  In live blocks,
``systemctl stop masd.service`` and ``systemctl start masd.service`` stop and start CI's
masd (``stop_masd``, ``start_masd``).
` ```text ` blocks are examples, never run.  ` ```sh onehost ` blocks (the one-host test
of the whole chain) need Postfix, OpenDKIM and OpenDMARC: tests/test_dmarc_e2e.py runs
them, setting only their variables (:func:`onehost_script`).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "operations.md"
#: Commands of live blocks CI cannot run (see the module docstring).
NOT_RUN = ("systemctl ", "journalctl ", "postqueue ")
#: Commands of live blocks CI runs against its own masd.
RUN_LIVE = ("masd ", "runuser ", "curl ")
#: What CI does for systemd's stopping and starting of masd (see the module docstring).
MASD_UNIT = {
    "systemctl stop masd.service": "stop_masd",
    "systemctl start masd.service": "start_masd",
}


@dataclass(frozen=True)
class Block:
    info: str  # "sh", "sh live", "" ...
    lines: tuple[str, ...]
    marker: str  # the <!-- ... --> comment just before the block, if any


def blocks(text: str) -> list[Block]:
    found: list[Block] = []
    lines = text.splitlines()
    index = 0
    marker = ""
    while index < len(lines):
        line = lines[index]
        if line.startswith("<!--"):
            marker = line.strip("<!-> ")
        elif line.startswith("```"):
            info = line[3:].strip()
            end = lines.index("```", index + 1)
            found.append(Block(info, tuple(lines[index + 1 : end]), marker))
            marker = ""
            index = end
        elif line.strip():
            marker = ""
        index += 1
    return found


def commands(block: Block) -> list[str]:
    return [line for line in block.lines if line.strip() and not line.startswith("#")]


def script(text: str, settings: Mapping[str, str] | None = None) -> str:
    """The bash script that runs the guide; ``start_masd`` and ``stop_masd`` come from the
    caller, and ``settings`` give the variables of ``sh db`` blocks (every one they set)."""
    out = ["set -euo pipefail"]
    started = False
    for block in blocks(text):
        if block.info == "sh":
            out.extend(commands(block))
        elif block.info == "sh db":
            out.extend(_set(commands(block), settings or {}))
        elif block.info == "sh live":
            if not started:
                out.append("start_masd")
                started = True
            for line in commands(block):
                if line in MASD_UNIT:
                    out.append(MASD_UNIT[line])
                elif line.startswith(RUN_LIVE):
                    out.append(line)
                else:
                    out.append(f": not run in CI: {line!r}")
    return "\n".join(out) + "\n"


#: A line of a ``sh onehost`` or ``sh db`` block that sets a variable (its first lines).
SETTING = re.compile(r"^([A-Z]+)=(\S+)$")


def _set(lines: list[str], values: Mapping[str, str]) -> list[str]:
    """``lines`` with each setting line giving ``values``' value (KeyError: not given)."""
    out = []
    for line in lines:
        m = SETTING.match(line)
        out.append(f"{m.group(1)}={shlex.quote(values[m.group(1)])}" if m else line)
    return out


def onehost_blocks(text: str) -> list[Block]:
    """The blocks of the one-host test of the whole chain (section 14), in order."""
    return [b for b in blocks(text) if b.info == "sh onehost"]


def onehost_settings(text: str) -> dict[str, str]:
    """Every variable the one-host blocks set, with the guide's value."""
    found = {}
    for block in onehost_blocks(text):
        for line in commands(block):
            m = SETTING.match(line)
            if m:
                found[m.group(1)] = m.group(2)
    return found


def onehost_script(block: Block, values: Mapping[str, str]) -> str:
    """``block`` as a bash script: every variable set to ``values`` first, the block's own
    setting lines set to ``values`` too, every other line as the guide has it."""
    out = ["set -euo pipefail", *(f"{k}={shlex.quote(v)}" for k, v in values.items())]
    for line in commands(block):
        m = SETTING.match(line)
        out.append(f"{m.group(1)}={shlex.quote(values[m.group(1)])}" if m else line)
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- tests


def test_every_block_is_a_command_block_or_a_quoted_file() -> None:
    for block in blocks(GUIDE.read_text()):
        # text: an example, not run; sh onehost: run by tests/test_dmarc_e2e.py (section 14)
        assert block.info in ("sh", "sh live", "sh db", "sh onehost", "", "text"), block
        if block.info == "":
            assert block.marker.startswith(("postfix:", "dmarc:")), block


def test_every_live_command_is_run_or_named_as_not_run() -> None:
    live = [c for b in blocks(GUIDE.read_text()) if b.info == "sh live" for c in commands(b)]
    assert live
    for command in live:
        assert command.startswith(RUN_LIVE + NOT_RUN), command


def test_the_script_runs_every_plain_command_in_order() -> None:
    text = GUIDE.read_text()
    plain = [c for b in blocks(text) if b.info == "sh" for c in commands(b)]
    rest = iter(script(text, {"MASDHOSTS": "127.0.0.1/32"}).splitlines())
    assert all(command in rest for command in plain), "the script runs them in order"
    assert "make package" in plain
    assert "masd check-config /etc/masd/masd.toml" in plain


def test_the_one_host_test_is_the_one_the_e2e_test_runs() -> None:
    """Section 14's blocks are run by tests/test_dmarc_e2e.py, which sets every variable."""
    text = GUIDE.read_text()
    found = onehost_blocks(text)
    assert len(found) == 3, found
    settings = onehost_settings(text)
    e2e = (ROOT / "tests" / "test_dmarc_e2e.py").read_text()
    assert "onehost_script(" in e2e
    for name in settings:
        assert f'"{name}":' in e2e, f"tests/test_dmarc_e2e.py does not set {name}"
    # The recipe's point: sent to the SMTP port from an address OpenDMARC checks, signed.
    assert settings["PORT"] == "25"
    assert settings["MX"] == "127.0.0.1"
    sending = "\n".join(found[1].lines)
    assert "source_address=(source, 0)" in sending
    assert '"$MX" "$PORT" 127.0.0.2' in sending
    assert "dkim.sign(" in sending
    assert [c for c in commands(found[2]) if c.startswith("masd ")] == [
        'masd doctor --config "$CONFIG"',
        'masd case list --config "$CONFIG"',
    ]


def test_quoted_postfix_files_are_the_shipped_ones() -> None:
    quoted = {b.marker: b for b in blocks(GUIDE.read_text()) if b.marker.startswith("postfix:")}
    shipped_files = (ROOT / "packaging" / "postfix").iterdir()
    assert set(quoted) == {f"postfix:{p.name}" for p in shipped_files if p.suffix != ".md"}, (
        "the guide explains every file in packaging/postfix/, and only those"
    )
    for marker, block in quoted.items():
        shipped = (ROOT / "packaging" / "postfix" / marker.split(":", 1)[1]).read_text()
        assert "\n".join(block.lines) + "\n" == shipped, marker


def test_quoted_dmarc_files_are_the_shipped_ones() -> None:
    """packaging/dmarc/ (the verifier tests/test_dmarc_e2e.py runs), quoted and explained."""
    text = GUIDE.read_text()
    quoted = {b.marker: b for b in blocks(text) if b.marker.startswith("dmarc:")}
    shipped_files = [p for p in (ROOT / "packaging" / "dmarc").iterdir() if p.suffix != ".md"]
    assert set(quoted) == {f"dmarc:{p.name}" for p in shipped_files}
    for path in shipped_files:
        shipped = path.read_text()
        assert "\n".join(quoted[f"dmarc:{path.name}"].lines) + "\n" == shipped, path.name
        for line in shipped.splitlines():
            if line and not line.startswith("#"):
                name = line.split()[0]
                assert f"`{name}" in text, f"no bullet explains {name} of {path.name}"


def test_every_postfix_setting_is_explained() -> None:
    text = GUIDE.read_text()
    snippet = (ROOT / "packaging" / "postfix" / "main.cf.snippet").read_text()
    for line in snippet.splitlines():
        if line and not line.startswith("#"):
            assert f"- `{line}`" in text, f"no bullet explains {line!r}"


def test_units_and_policy_address_agree_with_the_guide() -> None:
    text = GUIDE.read_text()
    for unit in re.findall(r"\bmasd(?:-[a-z]+)?\.(?:service|socket)\b", text):
        assert (ROOT / "systemd" / unit).is_file(), unit
    socket_unit = (ROOT / "systemd" / "masd-lmtp.socket").read_text()
    assert "ListenStream=/var/spool/postfix/private/masd-lmtp\n" in socket_unit
    assert "masd_lmtp = unix:private/masd-lmtp" in text
    policy = re.search(r"masd_policy = inet:([0-9.]+:[0-9]+)", text)
    assert policy
    assert f'policy = "{policy.group(1)}"' in text


def test_section_11_moves_the_store_to_postgresql_as_pasted() -> None:
    """Section 11's commands: the password file the example configuration names, the role
    with that password and a pg_hba.conf line for the masd hosts, masd stopped for the copy
    and started on the database; CI runs them (.ci/checks.d/operations.sh)."""
    text = GUIDE.read_text()
    example = (ROOT / "packaging" / "masd.toml.example").read_text()
    password_file = re.search(r'^# database_password_file = "([^"]+)"', example, re.M)
    found = re.search(r'^#\s+database = "(postgresql://[^"?]+)', example, re.M)
    assert password_file
    assert found
    database = found.group(1)  # CI's server has no certificate: no sslmode=verify-full
    db_blocks = [b for b in blocks(text) if b.info == "sh db"]
    assert len(db_blocks) == 1
    db = "\n".join(commands(db_blocks[0]))
    assert "CREATE ROLE masd LOGIN PASSWORD :'password';" in db
    assert f'password="$(cat {password_file.group(1)})"' in db
    assert "scram-sha-256" in db
    assert '"$MASDHOSTS"' in db
    ran = script(text, {"MASDHOSTS": "127.0.0.1/32"}).splitlines()
    assert "MASDHOSTS=127.0.0.1/32" in ran
    copy = next(i for i, line in enumerate(ran) if " db copy " in line)
    assert ran[copy - 1] == "stop_masd"
    assert ran[copy + 1] == "start_masd"
    assert f" {database} " in ran[copy]
    assert f"--password-file {password_file.group(1)}" in ran[copy]
    configured = next(line for line in ran if line.startswith("sed -i 's|^database = "))
    assert f'database = "{database}"' in configured
    assert f'database_password_file = "{password_file.group(1)}"' in configured
    with pytest.raises(KeyError):
        script(text)  # a variable of the database server's block left unset


if __name__ == "__main__":
    given = dict(arg.split("=", 1) for arg in sys.argv[1:])
    sys.stdout.write(script(GUIDE.read_text(), given))
