"""A case's state as the engine sees it, read from the store."""

from __future__ import annotations

from masd.core.engine import CaseView, HandoffView, PolicyView
from masd.service.runtime import Runtime
from masd.store import Tx, cases, handoffs
from masd.store.handoffs import HandoffRow


def _handoff(rt: Runtime, row: HandoffRow) -> HandoffView:
    return HandoffView(
        handoff_id=row.handoff_id,
        case_key=row.case_key,
        mode=row.mode,
        peer=row.peer or "email",
        url=row.webhook_url or rt.url_of(row.peer),
        status=row.status,
        last_seq=row.last_seq,
        needs=row.needs,
        forwarded=row.forwarded,
    )


def load_case(rt: Runtime, tx: Tx, key: str) -> CaseView | None:
    """The case and its open handoff (the latest requested), in one statement."""
    row = cases.load(tx, key)
    if row is None:
        return None
    return CaseView(
        key=row.key,
        address=row.address,
        domain=row.domain,
        type=row.type,
        id=row.id,
        role="master" if row.role == "master" else "slave",
        participant=row.participant,
        open_handoff=_handoff(rt, row.open_handoff) if row.open_handoff is not None else None,
    )


def load_handoff(rt: Runtime, tx: Tx, handoff_id: str) -> HandoffView | None:
    row = handoffs.load(tx, handoff_id)
    return _handoff(rt, row) if row else None


def named_handoff(rt: Runtime, tx: Tx, case: CaseView, handoff_id: str) -> HandoffView | None:
    """The handoff a message names: usually the case's open one, already loaded."""
    if case.open_handoff is not None and case.open_handoff.handoff_id == handoff_id:
        return case.open_handoff
    return load_handoff(rt, tx, handoff_id)


def case_exists(tx: Tx, key: str) -> bool:
    return cases.exists(tx, key)


def policy_of(rt: Runtime, tx: Tx, case: CaseView) -> PolicyView:
    """The case's policy: the type's defaults, overridden by what the master set."""
    base = rt.default_policy(case.domain, case.type)
    stored = cases.policy(tx, case.key)
    return PolicyView(
        bool(stored.get("autonomous_send", base.autonomous_send)),
        str(stored.get("transfers", base.transfers)),
    )
