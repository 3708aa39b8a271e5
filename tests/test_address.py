"""MAS addresses (docs/protocol.md §2): the conformance examples, properties and helpers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masd.core.address import (
    RESOURCE_MAX,
    Address,
    case_ref,
    check_case_ref,
    check_id,
    normalize_domain,
    parse_address,
    parse_local,
    split_key,
)
from masd.core.errors import AddressError

CONFORMANCE = Path(__file__).resolve().parent.parent / "conformance" / "addresses.json"
DATA: dict[str, Any] = json.loads(CONFORMANCE.read_text(encoding="utf-8"))
DOMAINS = frozenset(normalize_domain(d) for d in DATA["domains"])
UUID = "123e4567-e89b-12d3-a456-426614174000"


def _case_id(case: dict[str, Any]) -> str:
    return str(case["why"])


# --- the conformance file -------------------------------------------------


def test_conformance_file_shape() -> None:
    cases = DATA["cases"]
    assert len(cases) >= 60
    inputs = [c["input"] for c in cases]
    assert len(inputs) == len(set(inputs)), "duplicate inputs"
    parts = {c["error"]["part"] for c in cases if "error" in c}
    assert parts == {"address", "local", "type", "id", "mode", "domain"}
    for case in cases:
        assert ("expect" in case) != ("error" in case)
        assert case["why"]


@pytest.mark.parametrize("case", DATA["cases"], ids=_case_id)
def test_conformance_case(case: dict[str, Any]) -> None:
    run = {"delimiter": DATA["delimiter"], "domains": DATA["domains"]}
    if "error" in case:
        with pytest.raises(AddressError) as info:
            parse_address(case["input"], **run)
        assert info.value.code == case["error"]["code"], info.value.detail
        assert info.value.part == case["error"]["part"], info.value.detail
        assert info.value.detail.split(":")[0] in {
            "address",
            "local part",
            "type",
            "id",
            "mode",
            "domain",
        }
        return
    expect = case["expect"]
    addr = parse_address(case["input"], **run)
    got = {
        "kind": addr.kind,
        "type": addr.type,
        "id": addr.id,
        "mode": addr.mode,
        "domain": addr.domain,
        "canonical": addr.canonical,
        "key": addr.key,
    }
    assert got == expect
    # The same answer with the configured domains normalized (the fast path).
    assert parse_address(case["input"], delimiter=DATA["delimiter"], domains=DOMAINS) == addr


@pytest.mark.parametrize("entry", DATA["resource_ids"], ids=_case_id)
def test_conformance_resource_id(entry: dict[str, Any]) -> None:
    if entry["valid"]:
        assert check_id(entry["id"], type=entry["type"]) == entry["id"]
    else:
        with pytest.raises(AddressError) as info:
            check_id(entry["id"], type=entry["type"])
        assert info.value.part == "id"
        assert info.value.code == "bad-address"


# --- details name what was refused ----------------------------------------


@pytest.mark.parametrize(
    ("address", "detail"),
    [
        (
            "case=ab/c@help.example",
            'id: character "/" at position 7 is not allowed (letters, digits, "-", "_", ".")',
        ),
        ("ticket=a..b@help.example", 'id: doubled "." at position 8'),
        ("a" * 33 + "@help.example", "type: longer than 32 characters (33)"),
        ("x" * 70 + "@help.example", "local part: 70 octets, over 64"),
        ("ticket x@help.example", "type: character U+0020 at position 6 is not allowed"),
        ("tické@help.example", 'local part: character "é" at position 4 is not ASCII'),
        ("ticket!callback=1@help.example", 'local part: "=" at position 15 after "!"'),
        ("ticket=1=2@help.example", 'local part: a second "=" at position 8'),
        ("ticket!a!b@help.example", 'local part: a second "!" at position 8'),
        ("ticket=@help.example", 'id: empty after "=" at position 6'),
        ("ticket!@help.example", 'mode: empty after "!" at position 6'),
        ("ticket!9@help.example", 'mode: character "9" at position 7 is not allowed at the start'),
        ("ticket@help_desk.example", 'domain: character "_" at position 4 is not allowed'),
        ("ticket@other.example", 'domain: "other.example" is not a domain configured here'),
        ("ticket@straße.example", 'IDNA maps it to "strasse.example"'),
    ],
)
def test_detail_names_the_fault(address: str, detail: str) -> None:
    with pytest.raises(AddressError) as info:
        parse_address(address, domains=["help.example", "straße.example"])
    assert detail in info.value.detail
    assert str(info.value) == f"{info.value.code}: {info.value.detail}"


# --- options ---------------------------------------------------------------


def test_no_delimiter_makes_plus_a_forbidden_character() -> None:
    with pytest.raises(AddressError) as info:
        parse_address("ticket+tag@help.example", delimiter="")
    assert info.value.part == "type"
    assert '"+" at position 6' in info.value.detail


def test_other_delimiter() -> None:
    addr = parse_address("ticket=gs-1#x+y@help.example", delimiter="#")
    assert addr.id == "gs-1"
    with pytest.raises(AddressError):
        parse_address("ticket=gs-1+y@help.example", delimiter="#")


def test_each_character_of_the_delimiter_starts_a_suffix() -> None:
    assert parse_address("ticket#a+b@help.example", delimiter="+#").canonical == (
        "ticket@help.example"
    )
    assert parse_address("ticket+a#b@help.example", delimiter="+#").canonical == (
        "ticket@help.example"
    )


def test_without_domains_any_valid_domain_is_accepted() -> None:
    assert parse_address("ticket@Anything.Example").domain == "anything.example"


@pytest.mark.parametrize(
    ("configured", "address", "domain"),
    [
        (["HELP.EXAMPLE"], "t@help.example", "help.example"),
        (("Bücher.Example",), "t@xn--bcher-kva.example", "xn--bcher-kva.example"),
        ({"xn--bcher-kva.example"}, "t@BÜCHER.example", "xn--bcher-kva.example"),
    ],
)
def test_domains_given_in_any_spelling(configured: list[str], address: str, domain: str) -> None:
    assert parse_address(address, domains=configured).domain == domain


def test_invalid_configured_domain_never_matches() -> None:
    with pytest.raises(AddressError) as info:
        parse_address("t@help.example", domains=["bad_domain", ""])
    assert info.value.code == "unknown-domain"


def test_idna_2008_a_label_is_kept() -> None:
    # xn--strae-oqa is "straße" under IDNA 2008; it is compared as written.
    assert parse_address("t@XN--STRAE-OQA.example").domain == "xn--strae-oqa.example"


def test_parse_local() -> None:
    assert parse_local("Ticket=GS-1!CallBack+x") == ("ticket", "GS-1", "callback")
    assert parse_local("ticket") == ("ticket", None, None)
    with pytest.raises(AddressError) as info:
        parse_local("")
    assert info.value.part == "local"


def test_parse_local_without_delimiter_refuses_plus() -> None:
    with pytest.raises(AddressError) as info:
        parse_local("ticket=a+b", delimiter="")
    assert info.value.part == "id"


# --- Address ----------------------------------------------------------------


def test_format_keeps_the_mode_canonical_does_not() -> None:
    addr = parse_address("<Ticket=GS-1!CallBack+x@Help.Example>")
    assert addr.format() == "ticket=GS-1!callback@help.example"
    assert addr.canonical == "ticket=GS-1@help.example"
    assert addr.key == "ticket=gs-1@help.example"


def test_intake_key_is_canonical() -> None:
    addr = parse_address("Ticket!Callback@help.example")
    assert addr.kind == "intake"
    assert addr.canonical == addr.key == "ticket@help.example"
    assert addr.format() == "ticket!callback@help.example"


def test_with_id() -> None:
    intake = parse_address("ticket!callback@help.example")
    case = intake.with_id("gs-7")
    assert case == Address("resource", "ticket", "gs-7", None, "help.example")
    assert case.canonical == "ticket=gs-7@help.example"
    assert case.with_id("gs-8").id == "gs-8"
    for bad in ("", "a..b", "a/b", ".a"):
        with pytest.raises(AddressError) as info:
            intake.with_id(bad)
        assert info.value.part == "id"
    assert intake.with_id("x" * 57).canonical.startswith("ticket=x")
    with pytest.raises(AddressError, match="65 octets, over 64"):
        intake.with_id("x" * 58)


def test_address_is_frozen_and_consistent() -> None:
    addr = parse_address("ticket@help.example")
    with pytest.raises(AttributeError):
        addr.type = "other"  # type: ignore[misc]
    with pytest.raises(ValueError, match="kind"):
        Address("intake", "ticket", "gs-1", None, "help.example")
    with pytest.raises(ValueError, match="kind"):
        Address("resource", "ticket", None, None, "help.example")


# --- check_id, case_ref, check_case_ref, split_key ---------------------------


def test_check_id_bound() -> None:
    assert RESOURCE_MAX == 47
    assert check_id(UUID, type="abcdefghij") == UUID
    assert len("abcdefghij=" + UUID) == 47
    with pytest.raises(AddressError, match="48 octets, over 47"):
        check_id(UUID, type="abcdefghijk")
    with pytest.raises(AddressError, match="longer than 64"):
        check_id("x" * 65, type="t")


def test_check_id_refuses_a_bad_type() -> None:
    with pytest.raises(AddressError) as info:
        check_id("gs-1", type="9lives")
    assert info.value.part == "type"
    with pytest.raises(AddressError) as info:
        check_id("gs-1", type="")
    assert info.value.part == "type"


def test_case_ref() -> None:
    assert case_ref("ticket=GS-1@help.example") == {
        "address": "ticket=GS-1@help.example",
        "key": "ticket=gs-1@help.example",
    }
    assert case_ref("TICKET=gs-1@HELP.EXAMPLE") == {
        "address": "ticket=gs-1@help.example",
        "key": "ticket=gs-1@help.example",
    }
    assert case_ref("ticket=gs-1@bücher.example")["key"] == "ticket=gs-1@xn--bcher-kva.example"


@pytest.mark.parametrize(
    ("text", "part"),
    [
        ("ticket@help.example", "id"),
        ("ticket=gs-1!callback@help.example", "mode"),
        ("ticket=gs-1+x@help.example", "id"),
        ("ticket=gs 1@help.example", "id"),
        ("nothing", "address"),
    ],
)
def test_case_ref_refuses(text: str, part: str) -> None:
    with pytest.raises(AddressError) as info:
        case_ref(text)
    assert info.value.part == part


def test_check_case_ref() -> None:
    ref = case_ref("ticket=GS-1@help.example")
    assert check_case_ref(ref) == parse_address("ticket=GS-1@help.example")
    refusals: list[dict[str, object]] = [
        {"address": "ticket=GS-1@help.example", "key": "ticket=GS-1@help.example"},
        {"address": "ticket=GS-1@help.example", "key": "ticket=gs-2@help.example"},
        {"address": "Ticket=GS-1@help.example", "key": "ticket=gs-1@help.example"},
        {"address": "ticket=GS-1@help.example"},
        {"address": 1, "key": "ticket=gs-1@help.example"},
        {"address": "ticket@help.example", "key": "ticket@help.example"},
    ]
    for bad in refusals:
        with pytest.raises(AddressError):
            check_case_ref(bad)


def test_split_key() -> None:
    assert split_key("ticket=gs-1@help.example") == ("ticket", "gs-1", "help.example")
    assert split_key("Ticket=GS-1@Help.Example") == ("ticket", "gs-1", "help.example")
    assert split_key("ticket@help.example") == ("ticket", None, "help.example")
    with pytest.raises(AddressError) as info:
        split_key("ticket=gs-1!callback@help.example")
    assert info.value.part == "mode"


# --- properties ----------------------------------------------------------------

_LETTER = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_NAME_TAIL = _LETTER + "0123456789-"
_ID_CHUNK = _NAME_TAIL + "_"

types = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(_LETTER),
    st.text(alphabet=_NAME_TAIL, max_size=31),
)
modes = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(_LETTER),
    st.text(alphabet=_NAME_TAIL, max_size=15),
)
ids = st.lists(st.text(alphabet=_ID_CHUNK, min_size=1, max_size=12), min_size=1, max_size=6).map(
    ".".join
)
labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True).filter(
    lambda label: not label.startswith("xn--") and label[2:4] != "--"
)
domains = st.lists(labels, min_size=1, max_size=4).map(".".join)


@st.composite
def valid_addresses(draw: st.DrawFn) -> Address:
    type_ = draw(types)
    mode = draw(st.none() | modes)
    id_ = draw(st.none() | ids)
    if id_ is not None:
        # Keep type=id!mode within 64 octets; a cut id never starts with "."
        # and cannot gain a doubled one.
        budget = 64 - len(type_) - 1 - (0 if mode is None else 1 + len(mode))
        id_ = id_[:budget].rstrip(".")
    return Address(
        "intake" if id_ is None else "resource",
        type_.lower(),
        id_,
        None if mode is None else mode.lower(),
        draw(domains),
    )


def _flip(text: str, flips: list[bool]) -> str:
    return "".join(ch.swapcase() if flips[i % len(flips)] else ch for i, ch in enumerate(text))


@pytest.mark.slow
@settings(max_examples=300)
@given(valid_addresses())
def test_format_parse_round_trip(addr: Address) -> None:
    assert len(addr.format().partition("@")[0]) <= 64
    assert parse_address(addr.format()) == addr
    assert parse_address(f"<{addr.format()}>") == addr
    assert parse_address(addr.canonical).key == addr.key
    if addr.id is not None:
        assert case_ref(addr.canonical) == {"address": addr.canonical, "key": addr.key}


@settings(max_examples=300)
@given(valid_addresses(), st.lists(st.booleans(), min_size=1, max_size=7))
def test_key_is_invariant_under_case(addr: Address, flips: list[bool]) -> None:
    local, _, domain = addr.format().partition("@")
    changed = parse_address(f"{_flip(local, flips)}@{_flip(domain, flips[::-1])}")
    assert changed.key == addr.key
    assert changed.type == addr.type
    assert changed.mode == addr.mode
    assert changed.domain == addr.domain


@pytest.mark.slow
@settings(max_examples=300)
@given(valid_addresses(), st.text(max_size=20))
def test_suffix_is_dropped(addr: Address, suffix: str) -> None:
    local, _, domain = addr.format().partition("@")
    received = f"{local}+{suffix}"
    if (
        "@" in suffix
        or len(received.encode()) > 64
        or any(ord(c) < 32 or c == "\x7f" for c in suffix)
    ):
        return
    assert parse_address(f"{received}@{domain}") == addr


_NASTY = "aZ09-_.=!+@<>\"' é/\x00。ü"


def _outcome(text: str, domains: frozenset[str] | None) -> Address | AddressError:
    try:
        return parse_address(text, domains=domains)
    except AddressError as exc:
        return exc


@settings(max_examples=300)
@given(st.text(alphabet=_NASTY, max_size=80) | st.text(max_size=80))
def test_arbitrary_text_only_raises_address_error(text: str) -> None:
    for domains in (None, DOMAINS):
        got = _outcome(text, domains)
        if isinstance(got, AddressError):
            assert got.part in {"address", "local", "type", "id", "mode", "domain"}
            assert got.code in {"bad-address", "unknown-domain"}
            assert got.detail
        else:
            assert parse_address(got.format()) == got


@settings(max_examples=300)
@given(st.text(alphabet=_NASTY, max_size=40) | st.text(max_size=40), types)
def test_check_id_only_raises_address_error(text: str, type_: str) -> None:
    refused: AddressError | None = None
    try:
        check_id(text, type=type_)
    except AddressError as exc:
        refused = exc
    if refused is not None:
        assert refused.part == "id"
    else:
        assert len(type_) + 1 + len(text) <= RESOURCE_MAX
        assert parse_address(f"{type_}={text}@help.example").id == text


def test_octets_that_are_not_utf8_are_a_named_refusal() -> None:
    with pytest.raises(AddressError) as exc:
        parse_address("tick\udcffet@help.example")
    assert exc.value.part == "local"
    assert "not UTF-8" in exc.value.detail
