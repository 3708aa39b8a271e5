"""A pending intake's ``case.intake`` sent again (docs/protocol.md §16.9, ``masd intake
resend``): for a master that answered 200 and then lost it (crashed before it assigned the
case), so the mail is not left stranded.

The message goes through the outbox, like any other to the master, and the log line
names it; a pending intake has no thread yet.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from masd.core.errors import MasdError
from masd.core.slave import intake_again
from masd.service.runtime import Runtime, Wakes
from masd.store import Tx, messages, outbox

log = logging.getLogger("masd")


class IntakeError(MasdError):
    """An intake that cannot be sent again: ``code`` says why."""

    #: HTTP status by code.
    STATUS: Final = {"unknown-intake": 404, "wrong-state": 409}

    @property
    def status(self) -> int:
        return self.STATUS[self.code]


@dataclass(frozen=True)
class Resent:
    intake_ref: str
    message_id: str
    outbox_id: int
    peer: str
    wakes: Wakes


def resend(rt: Runtime, tx: Tx, intake_ref: str, now: float) -> Resent:
    """Queue ``case.intake`` for pending intake ``intake_ref`` again, with a fresh id."""
    found = messages.intake(tx, intake_ref)
    if found is None:
        raise IntakeError(f"intake_ref: no intake {intake_ref}", code="unknown-intake")
    view = found.view
    if view.case_key is not None:
        raise IntakeError(
            f"intake_ref: {intake_ref} is already assigned to {view.case_key}", code="wrong-state"
        )
    master = rt.master_of(view.domain, view.type)
    message = intake_again(view, rt.new_id())
    row = outbox.NewRow(
        "contract", f"intake:{intake_ref}|{master.peer}", master.peer, None, master.url, message
    )
    outbox_id = outbox.queue(tx, row, now, now + rt.config.server.retry_for)
    log.info(
        "intake resent intake_ref=%s id=%s peer=%s outbox_id=%s",
        intake_ref,
        message["id"],
        master.peer,
        outbox_id,
    )
    return Resent(intake_ref, str(message["id"]), outbox_id, master.peer, Wakes(True, None))
