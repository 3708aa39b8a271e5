"""Domains one to a file: ``server.domains_dir`` (docs/protocol.md §18, docs/operations.md §2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from masd.config import ConfigErrors, load_config

MAIN = """\
[server]
lmtp = "127.0.0.1:2424"
http = "127.0.0.1:8025"
{extra}
{domains}
"""
MAIN_DOMAIN = """\
[domains."help.example".types.ticket]
role = "master"
"""
BODY = """\
[types.ticket]
role = "master"
id_prefix = "{prefix}"
"""


def main(tmp_path: Path, *, extra: str = "", domains: str = MAIN_DOMAIN) -> Path:
    path = tmp_path / "masd.toml"
    path.write_text(MAIN.format(extra=extra, domains=domains))
    return path


def domain_file(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def errors(path: Path) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    return [str(error) for error in caught.value.errors]


def test_domain_files_next_to_the_main_file_are_loaded(tmp_path: Path) -> None:
    folder = tmp_path / "domains.d"
    domain_file(folder, "shop.example.toml", BODY.format(prefix="s-"))
    domain_file(folder, "b\u00fccher.example.toml", BODY.format(prefix="b-"))
    domain_file(folder, "README", "not a domain file")
    domain_file(folder, ".shop.example.toml.swp", "editor leftovers")
    config = load_config(main(tmp_path))
    assert sorted(config.domains) == ["help.example", "shop.example", "xn--bcher-kva.example"]
    assert config.domains["shop.example"].types["ticket"].id_prefix == "s-"
    assert config.type_for("b\u00fccher.example", "ticket") is not None


def test_a_domain_file_is_enough_without_a_domains_table(tmp_path: Path) -> None:
    domain_file(tmp_path / "domains.d", "shop.example.toml", BODY.format(prefix="s-"))
    assert list(load_config(main(tmp_path, domains="")).domains) == ["shop.example"]


def test_a_missing_default_directory_is_fine_a_missing_configured_one_is_not(
    tmp_path: Path,
) -> None:
    assert list(load_config(main(tmp_path)).domains) == ["help.example"]
    configured = main(tmp_path, extra='domains_dir = "sites"')
    assert errors(configured) == [f'server.domains_dir: "{tmp_path / "sites"}": no such directory']


def test_a_configured_directory_is_read_with_paths_relative_to_each_file(tmp_path: Path) -> None:
    folder = tmp_path / "sites"
    domain_file(folder, "token.txt", "callback-secret-0001\n").chmod(0o600)
    domain_file(
        folder,
        "shop.example.toml",
        '[types.ticket]\nrole = "master"\nmodes = ["callback"]\n'
        '[types.ticket.endpoints.callback]\nurl = "http://127.0.0.1:9001/mas"\n'
        'token_file = "token.txt"\ndeadline = "2h"\n',
    )
    config = load_config(main(tmp_path, extra='domains_dir = "sites"'))
    endpoint = config.domains["shop.example"].types["ticket"].endpoints["callback"]
    assert endpoint.token == "callback-secret-0001"


def test_an_error_in_a_domain_file_names_the_file_and_the_key_path(tmp_path: Path) -> None:
    folder = tmp_path / "domains.d"
    bad = domain_file(folder, "shop.example.toml", '[types.ticket]\nrole = "boss"\nmodez = []\n')
    found = errors(main(tmp_path))
    prefix = f'{bad}: domains."shop.example".types.ticket'
    assert len(found) == 2, found
    assert found[0].startswith(f"{prefix}.modez: unknown key, did you mean modes?"), found
    assert found[1] == f'{prefix}.role: "boss" is not "master" or "slave"', found


def test_a_toml_syntax_error_in_a_domain_file_names_its_line(tmp_path: Path) -> None:
    bad = domain_file(tmp_path / "domains.d", "shop.example.toml", "[types.ticket\n")
    (found,) = errors(main(tmp_path))
    assert found.startswith(f"{bad}:1:"), found
    assert "invalid TOML" in found


def test_a_domain_in_two_files_or_in_a_file_and_the_main_file_is_refused(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "domains.d"
    twice = domain_file(folder, "help.example.toml", BODY.format(prefix="h-"))
    (found,) = errors(main(tmp_path))
    assert found == (
        f'{twice}: domains."help.example": "help.example" is defined twice: '
        'here and in "help.example"'
    )
    twice.unlink()
    first = domain_file(folder, "shop.example.toml", BODY.format(prefix="a-"))
    second = domain_file(folder, "SHOP.example.toml", BODY.format(prefix="b-"))
    (found,) = errors(main(tmp_path))
    # Files are read in name order: "SHOP..." sorts before "shop...".
    assert found == (
        f'{first}: domains."shop.example": "shop.example" is defined twice: here and in {second}'
    )


def test_a_file_whose_name_is_not_its_domain_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "domains.d"
    not_a_name = domain_file(folder, "shop_example.toml", BODY.format(prefix="s-"))
    (found,) = errors(main(tmp_path))
    assert found.startswith(f'{not_a_name}: domains.shop_example: "shop_example" has a bad'), found
    assert found.endswith("; the file shop_example.toml is named for its domain"), found
    not_a_name.unlink()
    other = domain_file(
        folder, "shop.example.toml", '[domains."other.example".types.ticket]\nrole = "master"\n'
    )
    (found,) = errors(main(tmp_path))
    assert found.startswith(
        f'{other}: domains: the file is named for "shop.example" but names "other.example"'
    ), found
