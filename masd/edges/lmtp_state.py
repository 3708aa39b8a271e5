"""Where an LMTP session stands, and what moves it: one state value and a table.

:class:`masd.edges.lmtp_session.LmtpProtocol` keeps one :class:`State` and
moves it only through :func:`next_state`.  The state decides what a reply
written to the client is:

- ``GREETING``: the first line, written as it is;
- ``COMMANDS``: the answer to a command, given an enhanced status code
  (RFC 2034 §3) where it has none;
- ``LHLO``: the LHLO answer, written as it is (RFC 2033 §4.1);
- ``DATA`` and ``RECORDING``: the answer to the mail data, one line per
  accepted recipient (RFC 2033 §4.2).

Rules:

- the greeting is written once, first, and moves the session to ``COMMANDS``;
- LHLO is answered from ``COMMANDS`` and returns there;
- the DATA command's go-ahead (354) moves ``COMMANDS`` to ``DATA``: every
  octet the client sends there is progress for the idle clock;
- reading the whole data moves ``DATA`` to ``RECORDING``: masd records it and
  the idle clock is stopped;
- the answer to the data (recorded, refused or a fault) moves ``DATA`` or
  ``RECORDING`` back to ``COMMANDS``, and so does the DATA command ending
  without one (the client closed the connection inside the data);
- nothing else moves the session: any other (state, event) is a
  :class:`SessionStateError`, a fault in masd, never something a client can do.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final


class State(enum.Enum):
    # Members are singletons compared by identity: hashed as objects, not by
    # Enum.__hash__ (a Python call per look-up in TRANSITIONS and IN_DATA).
    __hash__ = object.__hash__

    GREETING = "greeting"
    COMMANDS = "commands"
    LHLO = "lhlo"
    DATA = "data"
    RECORDING = "recording"


class Event(enum.Enum):
    __hash__ = object.__hash__

    GREETED = "greeted"  # the greeting was written
    LHLO = "lhlo"  # an LHLO command is being answered
    LHLO_DONE = "lhlo-done"  # ... and has been
    GO_AHEAD = "go-ahead"  # 354: the client sends the data
    DATA_READ = "data-read"  # the data is read to its end and kept
    ANSWERED = "answered"  # the answer to the data was written
    DATA_ENDED = "data-ended"  # the DATA command ended with no answer written


#: Every move a session may make; anything else is a :class:`SessionStateError`.
TRANSITIONS: Final[Mapping[tuple[State, Event], State]] = {
    (State.GREETING, Event.GREETED): State.COMMANDS,
    (State.COMMANDS, Event.LHLO): State.LHLO,
    (State.LHLO, Event.LHLO_DONE): State.COMMANDS,
    (State.COMMANDS, Event.GO_AHEAD): State.DATA,
    (State.DATA, Event.DATA_READ): State.RECORDING,
    (State.DATA, Event.ANSWERED): State.COMMANDS,
    (State.RECORDING, Event.ANSWERED): State.COMMANDS,
    (State.DATA, Event.DATA_ENDED): State.COMMANDS,
    (State.RECORDING, Event.DATA_ENDED): State.COMMANDS,
}

#: The states in which a reply is the answer to the mail data.
IN_DATA: Final = frozenset({State.DATA, State.RECORDING})


class SessionStateError(RuntimeError):
    """An event the session's state has no move for."""

    def __init__(self, state: State, event: Event) -> None:
        super().__init__(
            f"LMTP server session: no move for event {event.value!r} in state {state.value!r}"
        )
        self.state = state
        self.event = event


def next_state(state: State, event: Event) -> State:
    """The state ``event`` moves ``state`` to (:data:`TRANSITIONS`)."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise SessionStateError(state, event) from None
