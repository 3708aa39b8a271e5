"""The systemd units in systemd/: what they say, and what systemd-analyze says of them.

``systemd-analyze verify`` must accept the units without a single warning,
and ``systemd-analyze security --offline=yes`` must rate masd.service's
exposure at 2.0 or lower: the figure README.md quotes.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from support.example import copy_example
from support.system import require_program

from masd.config import UnixListen, load_config
from masd.config.checker import Checker
from masd.config.server import parse_server
from masd.edges.descriptors import need
from masd.edges.sockets import LISTENER_NAMES

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "systemd"
SERVICE = UNITS / "masd.service"
SOCKETS = (UNITS / "masd-lmtp.socket", UNITS / "masd-http.socket")
EXECUTABLE = "/usr/bin/masd"
MAX_EXPOSURE = 2.0


def directives(unit: Path) -> list[tuple[str, str, str]]:
    """``(section, key, value)`` for every assignment, in order (keys may repeat)."""
    found: list[tuple[str, str, str]] = []
    section = ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.append((section, key.strip(), value.strip()))
    return found


def values(unit: Path, section: str, key: str) -> list[str]:
    return [v for s, k, v in directives(unit) if (s, k) == (section, key)]


def one(unit: Path, section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"{unit.name}: [{section}] {key} set {len(found)} times"
    return found[0]


# --------------------------------------------------------------------------- the units' text


def test_service_runs_masd_serve_as_a_notify_service() -> None:
    assert one(SERVICE, "Service", "Type") == "notify"
    assert one(SERVICE, "Service", "ExecStart") == (
        f"{EXECUTABLE} serve --config /etc/masd/masd.toml --pid-file /run/masd/masd.pid"
    )
    # masd reload finds masd by the pid file, in the RuntimeDirectory masd may write.
    assert one(SERVICE, "Service", "ExecReload") == (
        f"{EXECUTABLE} reload --pid-file /run/masd/masd.pid"
    )
    assert one(SERVICE, "Service", "RuntimeDirectory") == "masd"
    assert one(SERVICE, "Unit", "ConditionPathExists") == "/etc/masd/masd.toml"
    assert one(SERVICE, "Service", "User") == "masd"


def test_the_open_files_limit_holds_the_default_caps(tmp_path: Path) -> None:
    """LimitNOFILE= leaves room for every listener at its default cap, and at the
    example configuration's caps (masd refuses to start below what they need)."""
    limit = int(one(SERVICE, "Service", "LimitNOFILE"))
    listeners = ("lmtp", "http", "policy", "milter")
    defaults = parse_server(Checker(ROOT), {})
    example = load_config(copy_example(tmp_path)).server
    assert need(defaults, listeners).total == 1556  # the figure the unit's comment gives
    for server in (defaults, example):
        assert need(server, listeners).total <= limit, need(server, listeners)


def test_directories_match_the_example_config(tmp_path: Path) -> None:
    """StateDirectory holds the example's database; RuntimeDirectory its unix sockets."""
    config = load_config(copy_example(tmp_path))
    state = Path("/var/lib") / one(SERVICE, "Service", "StateDirectory")
    runtime = Path("/run") / one(SERVICE, "Service", "RuntimeDirectory")
    assert one(SERVICE, "Service", "ConfigurationDirectory") == "masd"
    assert config.server.database.parent == state
    assert isinstance(config.server.lmtp, UnixListen)
    assert config.server.lmtp.path.parent == runtime


def test_hardening_keeps_what_masd_needs() -> None:
    service = {k: v for s, k, v in directives(SERVICE) if s == "Service"}
    assert service["ProtectSystem"] == "strict"
    assert service["NoNewPrivileges"] == "yes"
    assert service["CapabilityBoundingSet"] == ""
    # Outbound HTTP (mode endpoints, masters, webhooks) and SMTP need IP sockets.
    assert set(service["RestrictAddressFamilies"].split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert "PrivateNetwork" not in service
    assert "IPAddressDeny" not in service


@pytest.mark.parametrize("unit", SOCKETS, ids=lambda p: p.name)
def test_socket_units_name_a_listener_and_start_masd(unit: Path) -> None:
    assert one(unit, "Socket", "FileDescriptorName") in LISTENER_NAMES
    assert one(unit, "Socket", "Service") == SERVICE.name
    assert len(values(unit, "Socket", "ListenStream")) == 1


POSTFIX = ROOT / "packaging" / "postfix"
#: Debian's Postfix queue directory: where a relative unix:path of an lmtp client points.
QUEUE_DIRECTORY = "/var/spool/postfix"


def test_lmtp_socket_is_where_the_postfix_transport_connects() -> None:
    """masd_lmtp = unix:private/masd-lmtp is relative to the queue directory (chrooted or
    not): the socket unit must listen on exactly that path, owned by postfix."""
    found = re.search(r"^masd_lmtp = unix:(\S+)$", (POSTFIX / "main.cf.snippet").read_text(), re.M)
    assert found
    assert not found.group(1).startswith("/")
    path = one(UNITS / "masd-lmtp.socket", "Socket", "ListenStream")
    assert path == f"{QUEUE_DIRECTORY}/{found.group(1)}"
    assert one(UNITS / "masd-lmtp.socket", "Socket", "SocketUser") == "postfix"


def test_every_document_says_the_masd_transport_is_not_chrooted() -> None:
    """One truth about Postfix's chroot: master.cf.snippet runs the transport with chroot n,
    and nothing shipped says the client that reaches masd runs chrooted."""
    line = next(
        line.split()
        for line in (POSTFIX / "master.cf.snippet").read_text().splitlines()
        if line.startswith("masd ")
    )
    assert line[:2] == ["masd", "unix"]
    assert line[4] == "n", "the chroot column"
    assert line[7] == "lmtp"
    documents = [
        ROOT / "README.md",
        ROOT / "docs" / "operations.md",
        POSTFIX / "README.md",
        *UNITS.iterdir(),
    ]
    for document in documents:
        text = " ".join(document.read_text().replace("#", " ").split())
        assert not re.search(r"lmtp`? client runs chrooted", text), document
        assert "LMTP socket in Postfix's chroot" not in text, document
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "run outside Postfix's chroot (`n` in the chroot column of master.cf)" in readme


# --------------------------------------------------------------------------- systemd-analyze


def verifiable_copies(directory: Path) -> list[Path]:
    """The units, with ExecStart's program pointing at this checkout's masd if
    /usr/bin/masd is not installed (verify checks that the program exists)."""
    program = EXECUTABLE
    if not Path(EXECUTABLE).exists():
        program = str(ROOT / ".venv" / "bin" / "masd")
    copies = []
    for unit in (SERVICE, *SOCKETS):
        copy = directory / unit.name
        copy.write_text(
            unit.read_text()
            .replace(f"ExecStart={EXECUTABLE} ", f"ExecStart={program} ")
            .replace(f"ExecReload={EXECUTABLE} ", f"ExecReload={program} ")
        )
        copies.append(copy)
    return copies


@pytest.mark.system
def test_systemd_analyze_verify_accepts_the_units_without_a_warning(tmp_path: Path) -> None:
    tool = require_program("systemd-analyze")
    done = subprocess.run(
        [tool, "verify", *map(str, verifiable_copies(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr
    assert done.stdout.strip() == "", done.stdout


@pytest.mark.system
def test_systemd_analyze_verify_notices_a_bad_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt key is reported."""
    tool = require_program("systemd-analyze")
    bad = tmp_path / "masd.service"
    bad.write_text(SERVICE.read_text().replace("ProtectHome=", "ProtectHomes="))
    done = subprocess.run(
        [tool, "verify", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "Unknown key 'ProtectHomes'" in done.stderr


def exposure() -> float:
    tool = require_program("systemd-analyze")
    done = subprocess.run(
        [tool, "security", "--offline=yes", "--no-pager", str(SERVICE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for masd\.service: ([0-9.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    return float(found.group(1))


@pytest.mark.system
def test_exposure_is_at_most_two_and_is_the_figure_readme_quotes() -> None:
    figure = exposure()
    assert figure <= MAX_EXPOSURE
    readme = (ROOT / "README.md").read_text()
    quoted = re.search(r"exposure level of \*\*([0-9.]+)\*\*", readme)
    assert quoted, "README.md quotes no exposure level"
    assert float(quoted.group(1)) == figure
