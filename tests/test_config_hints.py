"""check-config helps: a misspelt key gets the nearest known one suggested at every level,
an unknown role still lets every other key of its type be checked, and an authserv-id must
be a host name.  Each case edits packaging/masd.toml.example as an operator would."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from support.example import copy_example
from support.keys import pem

from masd.config import ConfigErrors, load_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "packaging" / "masd.toml.example"
D = 'domains."help.example"'
T = f"{D}.types.ticket"
C = f"{D}.types.case"
EP = f"{T}.endpoints.callback"
AUTHSERV_RULE = (
    "give the host name your authenticator writes first in Authentication-Results "
    "(letters, digits and hyphens in dot-separated labels, as RFC 8601 recommends)"
)


@pytest.fixture
def example(tmp_path: Path) -> Path:
    copy = copy_example(tmp_path)
    (tmp_path / "dkim.key").write_bytes(pem(ed25519.Ed25519PrivateKey.generate()))
    (tmp_path / "dkim.key").chmod(0o600)
    return copy


def edit(path: Path, *changes: tuple[str, str]) -> Path:
    text = path.read_text()
    for old, new in changes:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)
    return path


def errors(path: Path) -> list[str]:
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    return [str(error) for error in caught.value.errors]


DKIM_LINE = '# dkim = { selector = "mas", key_file = "/etc/masd/dkim/help.example.key" }'

MISSPELT = [
    ("[server]", "[sever]", ["sever: unknown key, did you mean server?"]),
    (
        "max_message_bytes = 26214400",
        "max_mesage_bytes = 26214400",
        ["server.max_mesage_bytes: unknown key, did you mean max_message_bytes?"],
    ),
    (
        DKIM_LINE,
        'dkm = { selector = "mas", key_file = "dkim.key" }',
        [f"{D}.dkm: unknown key, did you mean dkim?"],
    ),
    (
        DKIM_LINE,
        'dkim = { selecter = "mas", key_file = "dkim.key" }',
        [
            f"{D}.dkim.selecter: unknown key, did you mean selector?",
            f"{D}.dkim.selector: missing: a string is required here",
        ],
    ),
    (
        "acknowledge = true",
        "acknowlege = true",
        [f"{T}.acknowlege: unknown key, did you mean acknowledge?"],
    ),
    (
        'role = "slave"\nrequire_dmarc_for_handoff',
        'role = "slave"\nrequire_dmarc_for_handof',
        [f"{C}.require_dmarc_for_handof: unknown key, did you mean require_dmarc_for_handoff?"],
    ),
    (
        "policy = { autonomous_send",
        "polcy = { autonomous_send",
        [f"{C}.polcy: unknown key, did you mean policy?"],
    ),
    (
        "autonomous_send = false",
        "autonomus_send = false",
        [f"{C}.policy.autonomus_send: unknown key, did you mean autonomous_send?"],
    ),
    (
        "send_cap = { per_case = 20, per_recipient_per_day = 10 }\n\n# Master only. One",
        "send_cap = { per_case = 20, per_day = 10 }\n\n# Master only. One",
        [f"{T}.send_cap.per_day: unknown key, did you mean per_recipient_per_day?"],
    ),
    (
        'deadline = "2h"',
        'dealine = "2h"',
        [
            f"{EP}.dealine: unknown key, did you mean deadline?",
            f"{EP}.deadline: missing: a string is required here",
        ],
    ),
    (
        "types.ticket.endpoints.callback]",
        "types.ticket.endpoints.calback]",
        [
            f'{T}.endpoints.calback: "calback" is not in modes, so this endpoint could never be '
            "used (a handoff to it is refused with mode-not-enabled, docs/protocol.md §4), "
            "did you mean "
            '"callback"?'
        ],
    ),
    (
        'token_file = "secrets-example/crm.token"',
        'tokenfile = "secrets-example/crm.token"',
        [
            f"{C}.master.tokenfile: unknown key, did you mean token_file?",
            f"{C}.master.token_file: missing: a string is required here",
        ],
    ),
    (
        'fields = ["phone"]\n',
        'feilds = ["phone"]\n',
        [f"{C}.webhooks[0].feilds: unknown key, did you mean fields?"],
    ),
    (
        'role = "master"',
        'role = "mastr"',
        [f'{T}.role: "mastr" is not "master" or "slave", did you mean "master"?'],
    ),
    (
        'transfers = "block"',
        'transfers = "blocks"',
        [
            f'{C}.policy.transfers: "blocks" is not "block" or {{webhook = URL}}, '
            'did you mean "block"?'
        ],
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), MISSPELT, ids=[m[1] for m in MISSPELT])
def test_a_misspelt_key_or_value_gets_the_nearest_one_suggested(
    example: Path, old: str, new: str, expected: list[str]
) -> None:
    assert errors(edit(example, (old, new))) == expected


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # Far from every key: no wild guess.
        ("hostname = ", "colour = ", ["server.colour: unknown key"]),
        # A key of the other role is not suggested: it would be refused next.
        (
            "acknowledge = true",
            "polcy = true",
            [f"{T}.polcy: unknown key"],
        ),
    ],
)
def test_no_suggestion_without_a_near_key_of_this_place(
    example: Path, old: str, new: str, expected: list[str]
) -> None:
    assert errors(edit(example, (old, new))) == expected


def test_an_unknown_role_still_lets_every_other_key_of_the_type_be_checked(
    example: Path,
) -> None:
    edit(
        example,
        ('role = "master"', 'role = "boss"'),
        ('deadline = "2h"', 'deadline = "2 hours"'),
        ('id_prefix = "gs-"', 'id_prefix = "g s"'),
        ('role = "slave"', "role = 1"),
        ('url = "http://127.0.0.1:9002/mas"', 'url = "ftp://crm/"'),
        ('fields = ["phone"]\n', 'fields = ["phone", "not ok"]\n'),
    )
    assert errors(example) == [
        f'{T}.role: "boss" is not "master" or "slave"',
        f'{T}.id_prefix: "g s" is not made of id characters (letters, digits, -, _ and inner '
        "single dots; docs/protocol.md §2)",
        f'{EP}.deadline: "2 hours" is not a duration (30s, 15m, 2h, 3d)',
        f"{C}.role: 1 is not a string",
        f'{C}.master.url: "ftp://crm/" is not an absolute http or https URL',
        f'{C}.webhooks[0].fields[1]: "not ok" is not a field name (letters, digits, - and _; '
        "up to 64)",
    ]


def test_a_missing_role_is_one_error_and_the_rest_is_checked(example: Path) -> None:
    edit(example, ('role = "master"\n', ""), ('deadline = "2h"', 'deadline = "soon"'))
    assert errors(example) == [
        f"{T}.role: missing: a string is required here",
        f'{EP}.deadline: "soon" is not a duration (30s, 15m, 2h, 3d)',
    ]


@pytest.mark.parametrize(
    "bad", ["mx.test_example!", "mx;x", "mx.help.example.", "mx..help", "-mx.help", "mx.bücher.de"]
)
def test_an_authserv_id_must_be_a_host_name(example: Path, bad: str) -> None:
    edit(
        example, ('trusted_authserv_ids = ["mx.help.example"]', f'trusted_authserv_ids = ["{bad}"]')
    )
    assert errors(example) == [
        f'server.trusted_authserv_ids[0]: "{bad}" is not an authserv-id: {AUTHSERV_RULE}'
    ]


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        ("MX.Help.Example", "mx.help.example"),
        ("mx-1.help.example", "mx-1.help.example"),
        ("localhost", "localhost"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ],
)
def test_an_authserv_id_is_kept_lowercase(example: Path, written: str, kept: str) -> None:
    edit(
        example,
        ('trusted_authserv_ids = ["mx.help.example"]', f'trusted_authserv_ids = ["{written}"]'),
    )
    assert load_config(example).server.trusted_authserv_ids == (kept,)
