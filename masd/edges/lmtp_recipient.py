"""The recipient decision at RCPT (docs/protocol.md §3, §22), for every door that asks it.

One function decides: :func:`recipient_check` says what the configuration alone
tells of an address and, where only the store can finish the answer (does the
case exist, does the bounce tag verify), the one question to put to it;
:meth:`RecipientCheck.answered` turns the store's answer into the reply.  The
LMTP listener, the policy and milter listeners (:func:`check_recipient`) and
``masd explain`` (:func:`check_recipient_sync`) differ only in how they read
the store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from masd import service
from masd.config import Config
from masd.core.address import Address, parse_address
from masd.core.bounce import BounceRecipient, split_bounce
from masd.core.errors import AddressError
from masd.edges.lmtp_replies import Replies, ReplyCode, address_refusal
from masd.service import Runtime
from masd.service.bounce_mail import tag_verifies
from masd.store import StoreHandle, Tx

__all__ = [
    "RecipientCheck",
    "SyncReader",
    "check_address",
    "check_recipient",
    "check_recipient_sync",
    "recipient_check",
]

log = logging.getLogger("masd.lmtp")
T = TypeVar("T")


def _undecodable(address: str) -> bool:
    """aiosmtpd hands on bytes that are not UTF-8 as lone surrogates."""
    return not address.isascii() and any("\udc80" <= ch <= "\udcff" for ch in address)


def check_address(config: Config, rcpt: str) -> tuple[ReplyCode, str, Address | None]:
    """What the configuration alone says of ``rcpt``: the reply (``RECIPIENT_OK`` when
    the address parses and its type is configured), its text, and the address once it
    parsed.  Whether a case address names a case is the store's to say."""
    if _undecodable(rcpt):
        return Replies.BAD_ADDRESS, f"address: {rcpt!r} is not UTF-8", None
    delimiter = config.server.recipient_delimiter
    # A bounce address is the case address with its tag (docs/protocol.md §22).
    split = split_bounce(rcpt, delimiter)
    try:
        addr = parse_address(
            split.address if split else rcpt, delimiter=delimiter, domains=config.domains
        )
    except AddressError as exc:
        return address_refusal(exc), exc.detail, None
    if config.type_for(addr.domain, addr.type) is None:
        return Replies.UNKNOWN_TYPE, f"type: no type {addr.type!r} at {addr.domain}", addr
    return Replies.RECIPIENT_OK, f"{addr.canonical} ok", addr


@dataclass(frozen=True)
class RecipientCheck:
    """The decision on one recipient: final when :attr:`question` is None, else the store
    must answer it (True: the case exists, or the bounce tag verifies for it)."""

    reply: ReplyCode
    text: str
    addr: Address | None = None
    bounce: BounceRecipient | None = None
    question: Callable[[Tx], bool] | None = None

    def answered(self, yes: bool) -> tuple[ReplyCode, str]:
        """The reply once the store said ``yes`` or no to :attr:`question`."""
        if yes or self.addr is None:
            return self.reply, self.text
        if self.bounce is not None:
            return (
                Replies.UNKNOWN_CASE,
                f"bounce address of {self.addr.canonical}: tag does not verify",
            )
        return Replies.UNKNOWN_CASE, f"id: no case {self.addr.canonical}"


def recipient_check(config: Config, rcpt: str) -> RecipientCheck:
    """docs/protocol.md §3 at RCPT: would a mail to ``rcpt`` be recorded?"""
    reply, text, addr = check_address(config, rcpt)
    if reply is not Replies.RECIPIENT_OK or addr is None:
        return RecipientCheck(reply, text, addr)
    split = split_bounce(rcpt, config.server.recipient_delimiter)
    if split is not None and addr.kind != "resource":
        return RecipientCheck(Replies.UNKNOWN_CASE, "bounce address: names no case", addr, split)
    if addr.kind != "resource":
        return RecipientCheck(reply, text, addr)
    key = addr.key
    if split is None:
        return RecipientCheck(reply, text, addr, None, lambda db: service.case_exists(db, key))
    tag = split.tag
    return RecipientCheck(reply, text, addr, split, lambda db: tag_verifies(db, key, tag))


async def check_recipient(rt: Runtime, store: StoreHandle, rcpt: str) -> tuple[ReplyCode, str]:
    """The reply masd gives at LMTP RCPT, and the one the policy and milter listeners turn
    into Postfix's answer, so all refuse the same recipients.  Never raises."""
    check = recipient_check(rt.config, rcpt)
    if check.question is None:
        return check.reply, check.text
    try:
        yes = await store.read(check.question)
    except Exception:
        log.exception("rcpt=%s store fault at RCPT", rcpt)
        return Replies.FAULT, "store unavailable, try again later"
    return check.answered(yes)


class SyncReader(Protocol):
    """A store read for plain threads (:meth:`masd.store.StoreHandle.read_sync`)."""

    def __call__(self, fn: Callable[[Tx], T], /) -> T: ...


def check_recipient_sync(
    config: Config, read: SyncReader, rcpt: str
) -> tuple[RecipientCheck, ReplyCode, str]:
    """:func:`check_recipient` for a plain thread (``masd explain``): the check, and the
    reply it comes to.  ``read`` is called only where the store must answer."""
    check = recipient_check(config, rcpt)
    if check.question is None:
        return check, check.reply, check.text
    try:
        yes = read(check.question)
    except Exception:
        log.exception("rcpt=%s store fault at RCPT", rcpt)
        return check, Replies.FAULT, "store unavailable, try again later"
    return check, *check.answered(yes)
