"""The trust rules of docs/protocol.md §4, one at a time."""

from __future__ import annotations

import pytest

from masd.core.trust import (
    TrustCause,
    TrustSettings,
    domain_key,
    read_auth,
    read_automation,
    received_by,
    split_resinfo,
    strip_comments,
    trust_cause,
)

TRUST = TrustSettings.of(["MX.Help.Example"])
OURS = (
    "Received",
    "from a.example (a.example [192.0.2.1]) by mx.help.example (Postfix) "
    "with ESMTPS id 1; Mon, 6 Jan 2025 10:00:00 +0000",
)
FOREIGN = (
    "Received",
    "from b.example by relay.elsewhere.example with SMTP id 2; Mon, 6 Jan 2025 09:59:00 +0000",
)


def ar(value: str) -> tuple[str, str]:
    return ("Authentication-Results", value)


def verdict(headers: list[tuple[str, str]], froms: tuple[str, ...] = ("a@example.org",)):
    return read_auth(headers, froms, TRUST)


# --- settings -------------------------------------------------------------------


def test_settings_lowercase_and_default_hosts() -> None:
    assert TRUST.trusted_authserv_ids == frozenset({"mx.help.example"})
    assert TRUST.trusted_hosts == frozenset({"mx.help.example"})
    other = TrustSettings.of(["mx.help.example"], ["Filter.Help.Example.", "mx.help.example"])
    assert other.trusted_hosts == frozenset({"filter.help.example", "mx.help.example"})
    direct = TrustSettings(frozenset({"MX.Help.Example."}), frozenset())
    assert direct == TRUST


# --- the trusted block ----------------------------------------------------------


def test_pass_in_the_trusted_block_authenticates() -> None:
    v = verdict([ar("mx.help.example; dmarc=pass header.from=example.org"), OURS])
    assert (v.dmarc, v.authenticated, v.authserv_id) == ("pass", True, "mx.help.example")
    assert v.reason == "dmarc=pass from mx.help.example"


def test_block_ends_at_the_first_foreign_received() -> None:
    v = verdict([OURS, FOREIGN, ar("mx.help.example; dmarc=pass header.from=example.org")])
    assert (v.dmarc, v.authenticated, v.authserv_id) == ("absent", False, None)


def test_the_foreign_received_itself_ends_the_block() -> None:
    v = verdict([FOREIGN, ar("mx.help.example; dmarc=pass header.from=example.org")])
    assert v.dmarc == "absent"


def test_several_trusted_hops_stay_in_the_block() -> None:
    filt = ("Received", "from localhost by filter.help.example (amavis) id 3; Mon, 6 Jan 2025")
    trust = TrustSettings.of(["mx.help.example"], ["mx.help.example", "filter.help.example"])
    headers = [OURS, filt, OURS, ar("mx.help.example; dmarc=pass header.from=example.org"), FOREIGN]
    assert read_auth(headers, ("a@example.org",), trust).authenticated
    # without filter.help.example in trusted_hosts its Received is foreign
    assert not read_auth(headers, ("a@example.org",), TRUST).authenticated


def test_received_without_a_by_clause_is_foreign() -> None:
    headers = [
        ("Received", "from x.example; Mon, 6 Jan 2025"),
        ar("mx.help.example; dmarc=pass header.from=example.org"),
    ]
    assert verdict(headers).dmarc == "absent"


@pytest.mark.parametrize(
    ("value", "host"),
    [
        (
            "from a (a [1.2.3.4]) by MX.Help.Example. (Postfix) with ESMTPS id 1; date",
            "mx.help.example",
        ),
        ("from a\r\n\tBY mx.help.example\r\n\twith LMTP; date", "mx.help.example"),
        ("from a (helo by evil.example) by mx.help.example with SMTP; Mon", "mx.help.example"),
        ("from a (nested (by evil.example) comment) by mx.help.example; d", "mx.help.example"),
        ("from by (by mx.help.example) by relay.example with SMTP; d", "relay.example"),
        ("by mx.help.example with LMTP id x; d", "mx.help.example"),
        ("from a with SMTP; by mx.help.example", None),
        ("from a (unclosed comment by mx.help.example", None),
        ("", None),
    ],
)
def test_received_by(value: str, host: str | None) -> None:
    assert received_by(value) == host


# --- which A-R counts ------------------------------------------------------------


def test_untrusted_authserv_id_is_ignored() -> None:
    v = verdict([ar("mx.google.example; dmarc=pass header.from=example.org"), OURS])
    assert v.dmarc == "absent"


def test_authserv_id_is_case_insensitive_and_comments_are_skipped() -> None:
    v = verdict([ar("(ours) MX.HELP.EXAMPLE 1; dmarc=pass header.from=example.org"), OURS])
    assert v.authenticated
    assert v.authserv_id == "mx.help.example"


def test_topmost_dmarc_result_wins_and_blocks_never_combine() -> None:
    v = verdict(
        [
            ar("mx.help.example; dmarc=fail header.from=example.org"),
            ar("mx.help.example; dmarc=pass header.from=example.org"),
            OURS,
        ]
    )
    assert (v.dmarc, v.authenticated) == ("fail", False)


def test_a_trusted_ar_without_dmarc_is_passed_over() -> None:
    v = verdict(
        [
            ar("mx.help.example; dkim=pass header.d=example.org; spf=pass smtp.mailfrom=a.example"),
            ar("mx.help.example; dmarc=pass header.from=example.org"),
            OURS,
        ]
    )
    assert v.authenticated


def test_untrusted_ar_on_top_does_not_hide_the_trusted_one() -> None:
    v = verdict(
        [
            ar("mx.google.example; dmarc=fail header.from=example.org"),
            ar("mx.help.example; dmarc=pass header.from=example.org"),
            OURS,
        ]
    )
    assert v.authenticated


def test_none_result_header() -> None:
    assert verdict([ar("mx.help.example; none"), OURS]).dmarc == "absent"


@pytest.mark.parametrize("raw", ["fail", "none", "temperror", "permerror"])
def test_other_results_are_reported_as_they_are(raw: str) -> None:
    v = verdict([ar(f"mx.help.example; dmarc={raw} header.from=example.org"), OURS])
    assert (v.dmarc, v.authenticated, v.header_from) == (raw, False, "example.org")


@pytest.mark.parametrize(("raw", "mapped"), [("bestguesspass", "none"), ("softfail", "permerror")])
def test_unknown_results_are_mapped(raw: str, mapped: str) -> None:
    v = verdict([ar(f"mx.help.example; dmarc={raw} header.from=example.org"), OURS])
    assert (v.dmarc, v.authenticated) == (mapped, False)


def test_unparseable_trusted_dmarc_is_permerror_and_not_rescued() -> None:
    v = verdict(
        [
            ar("mx.help.example; dmarc=@pass header.from=example.org"),
            ar("mx.help.example; dmarc=pass header.from=example.org"),
            OURS,
        ]
    )
    assert (v.dmarc, v.authenticated, v.authserv_id) == ("permerror", False, "mx.help.example")


def test_damage_in_other_methods_does_not_matter() -> None:
    v = verdict([ar("mx.help.example; dkim=@@@; dmarc=pass header.from=example.org"), OURS])
    assert v.authenticated


def test_dmarc_inside_a_comment_or_quotes_is_not_a_result() -> None:
    v = verdict(
        [
            ar(
                "mx.help.example; arc=pass (i=1 dmarc=pass; fromdomain=example.org); "
                'spf=pass reason="x; dmarc=pass" smtp.mailfrom=example.org'
            ),
            OURS,
        ]
    )
    assert v.dmarc == "absent"


def test_pass_without_header_from_does_not_authenticate() -> None:
    v = verdict([ar("mx.help.example; dmarc=pass policy.dmarc=none"), OURS])
    assert (v.dmarc, v.authenticated, v.header_from) == ("fail", False, None)
    v = verdict([ar("mx.help.example; dmarc=pass (unclosed header.from=example.org"), OURS])
    assert not v.authenticated


# --- DMARC pass applies to the single From domain ------------------------------


def test_pass_for_another_domain_is_fail() -> None:
    v = verdict([ar("mx.help.example; dmarc=pass header.from=evil.example"), OURS])
    assert (v.dmarc, v.authenticated) == ("fail", False)
    assert "evil.example" in v.reason


def test_several_from_addresses_are_never_authenticated() -> None:
    v = verdict(
        [ar("mx.help.example; dmarc=pass header.from=example.org"), OURS],
        ("a@example.org", "b@example.org"),
    )
    assert (v.dmarc, v.authenticated) == ("fail", False)
    assert "2 From addresses" in v.reason


def test_no_from_address_is_not_authenticated() -> None:
    v = verdict([ar("mx.help.example; dmarc=pass header.from=example.org"), OURS], ())
    assert (v.dmarc, v.authenticated) == ("fail", False)


def test_header_from_compares_case_insensitively_and_as_a_labels() -> None:
    v = verdict(
        [ar("mx.help.example; dmarc=pass header.from=Example.ORG."), OURS], ("a@EXAMPLE.org",)
    )
    assert v.authenticated
    v = verdict(
        [ar("mx.help.example; dmarc=pass header.from=xn--bcher-kva.example"), OURS],
        ("a@Bücher.example",),
    )
    assert v.authenticated
    v = verdict(
        [ar("mx.help.example; dmarc=pass header.from=bücher.example"), OURS],
        ("a@xn--bcher-kva.example",),
    )
    assert v.authenticated


def test_header_from_written_as_an_address() -> None:
    v = verdict([ar("mx.help.example; dmarc=pass header.from=x@example.org"), OURS])
    assert v.authenticated


def test_domain_key() -> None:
    assert domain_key("Bücher.Example.") == "xn--bcher-kva.example"
    assert domain_key("EXAMPLE.org") == "example.org"
    bad = "ü" * 80 + ".example"  # a label IDNA cannot encode stays as it is
    assert domain_key(bad) == bad


# --- automation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "mail_from", "reason"),
    [
        ([("Auto-Submitted", "auto-replied")], "a@x.example", "Auto-Submitted: auto-replied"),
        (
            [("auto-submitted", "Auto-Generated; owner-email=a@x")],
            "a@x.example",
            "Auto-Submitted: auto-generated",
        ),
        (
            [("Auto-Submitted", "(vacation) auto-notified")],
            "a@x.example",
            "Auto-Submitted: auto-notified",
        ),
        ([("Auto-Submitted", "")], "a@x.example", "Auto-Submitted: (empty)"),
        ([("Precedence", "bulk")], "a@x.example", "Precedence: bulk"),
        ([("Precedence", "List")], "a@x.example", "Precedence: list"),
        ([("PRECEDENCE", "junk (spam)")], "a@x.example", "Precedence: junk"),
        ([], "", "null sender"),
        ([], "<>", "null sender"),
        ([], " <> ", "null sender"),
        (
            [("Precedence", "bulk"), ("Auto-Submitted", "auto-replied")],
            "",
            "Auto-Submitted: auto-replied",
        ),
        # List traffic (RFC 2919, RFC 3834 §2): whatever the list's id.
        ([("List-Id", "<x.lists.example>")], "a@x.example", "List-Id: <x.lists.example>"),
        (
            [("list-id", "Help desk (the (nested) one) <help.lists.example>")],
            "a@x.example",
            "List-Id: Help desk <help.lists.example>",
        ),
        ([("List-Id", "")], "a@x.example", "List-Id: (empty)"),
        # The sender's client asks for no automatic answer.
        ([("X-Auto-Response-Suppress", "All")], "a@x.example", "X-Auto-Response-Suppress: All"),
        (
            [("x-auto-response-suppress", "DR, OOF, autoreply")],
            "a@x.example",
            "X-Auto-Response-Suppress: AutoReply",
        ),
        (
            [("X-Auto-Response-Suppress", "all,AutoReply")],
            "a@x.example",
            "X-Auto-Response-Suppress: All, AutoReply",
        ),
        # The reason is the header that decided it, in a fixed order.
        (
            [("X-Auto-Response-Suppress", "All"), ("List-Id", "<l.example>")],
            "a@x.example",
            "List-Id: <l.example>",
        ),
        ([("List-Id", "<l.example>"), ("Precedence", "list")], "", "Precedence: list"),
    ],
)
def test_automated(headers: list[tuple[str, str]], mail_from: str, reason: str) -> None:
    a = read_automation(headers, mail_from)
    assert (a.is_automated, a.reason) == (True, reason)


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("Auto-Submitted", "no")],
        [("Auto-Submitted", "No (written by hand)")],
        [("Precedence", "first-class")],
        [("X-Auto-Submitted", "auto-replied")],
        [("X-Auto-Response-Suppress", "OOF")],
        [("X-Auto-Response-Suppress", "DR, RN, NRN")],
        [("X-Auto-Response-Suppress", "None")],
        [("List-Unsubscribe", "<mailto:leave@l.example>")],
    ],
)
def test_not_automated(headers: list[tuple[str, str]]) -> None:
    a = read_automation(headers, "a@x.example")
    assert (a.is_automated, a.reason) == (False, None)


def test_one_auto_submitted_other_than_no_is_enough() -> None:
    a = read_automation([("Auto-Submitted", "no"), ("Auto-Submitted", "auto-replied")], "a@x")
    assert a.is_automated


# --- small parsers ------------------------------------------------------------------


def test_strip_comments() -> None:
    assert strip_comments("a (b (c) d) e") == "a   e"
    assert strip_comments('a "(not a comment)" b') == 'a "(not a comment)" b'
    assert strip_comments(r"a (x \) y) b") == "a   b"
    assert strip_comments("a (unclosed") == "a "


def test_split_resinfo() -> None:
    assert split_resinfo('id; a=b (c; d) e="f;g"; h=i') == ["id", ' a=b (c; d) e="f;g"', " h=i"]


# --- the account of the decision -------------------------------------------------


def cause_of(headers: list[tuple[str, str]], mail_from: str = "a@example.org") -> TrustCause:
    auth = verdict(headers)
    return trust_cause(headers, auth, read_automation(headers, mail_from), TRUST)


def test_cause_trusted() -> None:
    cause = cause_of([ar("mx.help.example; dmarc=pass header.from=example.org"), OURS])
    assert cause == TrustCause("trusted", "dmarc=pass from mx.help.example, not automated")
    assert cause.trusted


def test_cause_no_ar_from_our_id_names_the_ids_seen() -> None:
    cause = cause_of([ar("mx.other.example; dmarc=pass header.from=example.org"), OURS])
    assert cause.cause == "no-trusted-ar"
    assert cause.authserv_ids == ("mx.other.example",)
    assert "no Authentication-Results from mx.help.example (server.trusted_authserv_ids)" in (
        cause.detail
    )
    assert cause.detail.endswith("the mail carries some from mx.other.example")
    bare = cause_of([OURS])
    assert (bare.cause, bare.authserv_ids) == ("no-trusted-ar", ())
    assert "does a DMARC verifier run in front of masd?" in bare.detail
    assert not bare.trusted


def test_cause_our_ar_without_dmarc_names_the_verifier_setting() -> None:
    cause = cause_of([ar("mx.help.example; dkim=none"), OURS])
    assert cause.cause == "no-dmarc-result"
    assert cause.detail.startswith(
        "Authentication-Results from mx.help.example without a dmarc= result: "
    )
    assert "IgnoreHosts (by default 127.0.0.1" in cause.detail
    assert "IgnoreAuthenticatedClients" in cause.detail


def test_cause_our_ar_below_an_untrusted_host_names_the_host() -> None:
    cause = cause_of([OURS, FOREIGN, ar("mx.help.example; dmarc=pass header.from=example.org")])
    assert cause.cause == "below-untrusted-host"
    assert cause.host == "relay.elsewhere.example"
    assert "only below the Received header by relay.elsewhere.example" in cause.detail
    # Our A-R without dmarc in the block is the nearer cause than a forged one below.
    both = [ar("mx.help.example; spf=pass"), OURS, FOREIGN, ar("mx.help.example; dmarc=pass")]
    assert cause_of(both).cause == "no-dmarc-result"


@pytest.mark.parametrize("result", ["fail", "none", "temperror", "permerror"])
def test_cause_a_result_other_than_pass(result: str) -> None:
    cause = cause_of([ar(f"mx.help.example; dmarc={result} header.from=example.org"), OURS])
    assert cause == TrustCause(f"dmarc-{result}", f"dmarc={result} from mx.help.example")


def test_cause_pass_for_another_domain_is_dmarc_fail() -> None:
    cause = cause_of([ar("mx.help.example; dmarc=pass header.from=other.example"), OURS])
    assert cause.cause == "dmarc-fail"
    assert "is not the From domain example.org" in cause.detail


def test_cause_automated_names_the_header() -> None:
    headers = [ar("mx.help.example; dmarc=pass header.from=example.org"), OURS]
    cause = cause_of([*headers, ("Precedence", "bulk")])
    assert cause == TrustCause(
        "automated",
        "dmarc=pass from mx.help.example, but the mail is automated (Precedence: bulk)",
        header="Precedence: bulk",
    )
    assert cause_of(headers, mail_from="<>").header == "null sender"
    # Unauthenticated and automated: the DMARC verdict is named.
    assert cause_of([OURS, ("Precedence", "bulk")]).cause == "no-trusted-ar"
