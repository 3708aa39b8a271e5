"""The status machine against its table (docs/protocol.md §14)."""

from __future__ import annotations

import itertools
import json

import pytest

from masd._resources import conformance_file
from masd.core.errors import TransitionError
from masd.core.status import MACHINE, NEW, StatusMachine

TABLE = json.loads(conformance_file("transitions.json").read_text())
ALL = TABLE["statuses"]
TERMINAL = set(TABLE["terminal"])

# The contract's table, written out once more by hand: the JSON must say the same.
CONTRACT_TABLE = {
    NEW: {"requested"},
    "requested": {
        "negotiating",
        "scheduled",
        "running",
        "refused",
        "failed",
        "cancelled",
        "timed-out",
    },
    "negotiating": {"negotiating", "scheduled", "refused", "expired", "cancelled", "timed-out"},
    "scheduled": {"running", "attempted", "expired", "cancelled", "timed-out"},
    "attempted": {"scheduled", "failed", "expired", "cancelled", "timed-out"},
    "running": {"completed", "failed", "cancelled", "timed-out"},
}


def _source_for(status: str) -> tuple[str, bool]:
    who = TABLE["recorded_by"][status]
    if "timeout-owner" in who:
        return "email", True
    return ("mode" if "mode" in who else "email"), False


def test_table_is_the_contract_table() -> None:
    assert {k: set(v) for k, v in TABLE["transitions"].items()} == CONTRACT_TABLE
    assert TERMINAL == {"completed", "failed", "expired", "refused", "cancelled", "timed-out"}


@pytest.mark.parametrize(("frm", "to"), list(itertools.product([NEW, *ALL], ALL)))
def test_every_pair_follows_the_table(frm: str, to: str) -> None:
    current = None if frm == NEW else frm
    source, owner = _source_for(to)
    allowed = to in CONTRACT_TABLE.get(frm, set())
    if allowed:
        MACHINE.check(current, to, source=source, timeout_owner=owner)  # type: ignore[arg-type]
    else:
        with pytest.raises(TransitionError) as exc:
            MACHINE.check(current, to, source=source, timeout_owner=owner)  # type: ignore[arg-type]
        assert exc.value.code == "invalid-transition"
        assert f'"{to}"' in exc.value.detail


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_terminal_statuses_accept_nothing(terminal: str) -> None:
    assert MACHINE.is_terminal(terminal)
    assert MACHINE.allowed(terminal) == frozenset()
    for to in ALL:
        for source in ("email", "mode"):
            with pytest.raises(TransitionError, match="after terminal status"):
                MACHINE.check(terminal, to, source=source, timeout_owner=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("frm", ["requested", "negotiating", "scheduled", "attempted", "running"])
def test_timed_out_only_from_the_timeout_owner(frm: str) -> None:
    MACHINE.check(frm, "timed-out", source="email", timeout_owner=True)
    with pytest.raises(TransitionError, match="timeout owner, not by mode"):
        MACHINE.check(frm, "timed-out", source="mode", timeout_owner=True)
    with pytest.raises(TransitionError, match="timeout owner, not by email"):
        MACHINE.check(frm, "timed-out", source="email", timeout_owner=False)


def test_requested_is_recorded_by_email_only() -> None:
    MACHINE.check(None, "requested", source="email")
    with pytest.raises(TransitionError, match="not sent by mode"):
        MACHINE.check(None, "requested", source="mode")


def test_mode_may_not_record_statuses_it_does_not_own() -> None:
    with pytest.raises(TransitionError, match='"running" is not sent by email'):
        MACHINE.check("requested", "running", source="email")


def test_unknown_status_is_refused_by_name() -> None:
    with pytest.raises(TransitionError, match='"done" is not a status'):
        MACHINE.check("running", "done", source="mode")


def test_incoherent_table_is_rejected() -> None:
    bad = dict(TABLE, transitions=dict(TABLE["transitions"], completed=["running"]))
    with pytest.raises(ValueError, match="terminal status has successors"):
        StatusMachine.from_table(bad)
    bad = dict(TABLE, transitions=dict(TABLE["transitions"], running=["finished"]))
    with pytest.raises(ValueError, match="unknown statuses"):
        StatusMachine.from_table(bad)
