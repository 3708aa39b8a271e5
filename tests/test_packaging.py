"""The Debian package (packaging/deb/build) and ``pipx install .``.

The package is built once for the module (pip fetches the dependencies, so
this takes a while) and looked at from outside: its control data, its files,
and masd run from its extracted tree.  Installing it on the machine is
``.ci/checks.d/deb.sh``'s job (install, check-config as root and as masd,
upgrade, purge).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.example import copy_example
from support.system import require_program

import masd

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "packaging" / "deb" / "build"

pytestmark = [pytest.mark.system, pytest.mark.slow]


def run(*args: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )
    assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_program("dpkg-deb")
    require_program("python3.11")
    out = tmp_path_factory.mktemp("dist")
    path = Path(run(BUILD, out).strip().splitlines()[-1])
    assert path.parent == out
    return path


@pytest.fixture(scope="module")
def tree(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    run("dpkg-deb", "--extract", deb, root)
    return root


def field(deb: Path, name: str) -> str:
    return run("dpkg-deb", "--field", deb, name).strip()


def test_control_fields(deb: Path) -> None:
    assert field(deb, "Package") == "masd"
    assert field(deb, "Version") == masd.__version__
    assert deb.name == f"masd_{masd.__version__}_{field(deb, 'Architecture')}.deb"
    depends = [d.strip().split()[0] for d in field(deb, "Depends").split(",")]
    assert {"python3.11", "adduser"} <= set(depends)


def test_files_owned_by_root(deb: Path) -> None:
    listing = run("dpkg-deb", "--contents", deb).splitlines()
    assert all(line.split()[1] == "root/root" for line in listing)


def test_unit_files_are_the_ones_in_systemd(tree: Path) -> None:
    for unit in (ROOT / "systemd").iterdir():
        installed = tree / "lib" / "systemd" / "system" / unit.name
        assert installed.read_bytes() == unit.read_bytes()


def test_masd_command_and_example_config(tree: Path) -> None:
    assert os.readlink(tree / "usr" / "bin" / "masd") == "/opt/masd/bin/masd"
    assert (tree / "opt/masd/bin/masd").read_text().startswith("#!/opt/masd/bin/python\n")
    example = tree / "etc" / "masd" / "masd.toml.example"
    assert example.read_bytes() == (ROOT / "packaging" / "masd.toml.example").read_bytes()
    for token in (tree / "etc" / "masd" / "secrets-example").glob("*.token"):
        assert token.stat().st_mode & 0o077 == 0, token
    assert (tree / "var" / "lib" / "masd").is_dir()
    assert (tree / "usr" / "share" / "doc" / "masd" / "operations.md").is_file()


def test_the_mta_files_the_guide_installs_are_shipped(tree: Path) -> None:
    """docs/operations.md §4, §5 and §11 install these from /usr/share/doc/masd/."""
    guide = (ROOT / "docs" / "operations.md").read_text()
    for folder in ("postfix", "dmarc", "haproxy"):
        for path in (ROOT / "packaging" / folder).iterdir():
            shipped = tree / "usr" / "share" / "doc" / "masd" / folder / path.name
            assert shipped.read_bytes() == path.read_bytes(), shipped
    assert "packaging/dmarc/opendkim.conf /etc" not in guide
    assert "/usr/share/doc/masd/dmarc/opendkim.conf /etc/opendkim.conf" in guide


def test_the_dashboard_and_the_alert_rules_are_shipped(tree: Path) -> None:
    share = tree / "usr" / "share" / "masd"
    for shipped, source in [
        (share / "grafana" / "masd.json", ROOT / "packaging" / "grafana" / "masd.json"),
        (share / "prometheus" / "masd-alerts.yml", ROOT / "packaging/prometheus/masd-alerts.yml"),
        (
            share / "prometheus" / "masd-alerts.test.yml",
            ROOT / "packaging/prometheus/masd-alerts.test.yml",
        ),
    ]:
        assert shipped.read_bytes() == source.read_bytes(), shipped


def test_postinst_gives_the_placeholder_secrets_to_masd(deb: Path, tmp_path: Path) -> None:
    run("dpkg-deb", "--control", deb, tmp_path)
    postinst = (tmp_path / "postinst").read_text()
    assert "chown masd:masd /etc/masd/secrets-example/*.token" in postinst


def test_conffiles_are_everything_under_etc(deb: Path, tmp_path: Path) -> None:
    run("dpkg-deb", "--control", deb, tmp_path)
    conffiles = (tmp_path / "conffiles").read_text().split()
    assert "/etc/masd/masd.toml.example" in conffiles
    assert all(c.startswith("/etc/masd/") for c in conffiles)
    for script in ("postinst", "prerm", "postrm"):
        run("sh", "-n", tmp_path / script)
    postinst = (tmp_path / "postinst").read_text()
    assert "adduser --quiet --system --group" in postinst


def test_masd_runs_from_the_package_tree(tree: Path, tmp_path: Path) -> None:
    """The shipped virtualenv works wherever it is unpacked: check-config refuses the
    example's placeholder secrets and passes it with secrets of one's own, and every
    module of the server imports."""
    python = tree / "opt" / "masd" / "bin" / "python"
    example = tree / "etc" / "masd" / "masd.toml.example"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONNOUSERSITE": "1"}
    command = [str(python), "-m", "masd", "check-config", str(example)]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 1, done
    assert done.stderr.count("holds a placeholder secret shipped with masd") == 4, done.stderr
    own = copy_example(tmp_path)
    summary = run(python, "-m", "masd", "check-config", own, cwd=tree, env=env)
    assert summary.startswith(f"{own}: OK\n")
    prefix = run(python, "-c", "import sys, masd.app; print(sys.prefix)", cwd=tree, env=env)
    assert prefix.strip() == str(tree / "opt" / "masd")


def test_pipx_install(tmp_path: Path) -> None:
    pipx = require_program("pipx")
    env = {**os.environ, "PIPX_HOME": str(tmp_path / "pipx"), "PIPX_BIN_DIR": str(tmp_path / "bin")}
    run(pipx, "install", ROOT, env=env)
    masd_command = tmp_path / "bin" / "masd"
    assert run(masd_command, "--version", env=env).strip() == f"masd, version {masd.__version__}"
    example = copy_example(tmp_path / "own")
    assert run(masd_command, "check-config", example, env=env).startswith(f"{example}: OK\n")
    assert sys.prefix not in run(
        tmp_path / "pipx" / "venvs" / "masd" / "bin" / "python",
        "-c",
        "import sys; print(sys.prefix)",
    )
