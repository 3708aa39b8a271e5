"""The peer conformance kit (docs/protocol.md §19.1): masd's email side, played against a
live mode endpoint or outside master, checking what it does.

- :mod:`~masd.conformance.peer.load`: the checks as data
  (``conformance/peer/<role>/<name>.json``), each naming the clause of
  docs/protocol.md it comes from;
- :mod:`~masd.conformance.peer.messages`: the messages the kit sends;
- :mod:`~masd.conformance.peer.listener`: the kit's own loopback listener,
  where the peer posts its statuses or its master messages;
- :mod:`~masd.conformance.peer.rules`: what an ``expect`` step can check;
- :mod:`~masd.conformance.peer.run`: the run and its output;
- :mod:`~masd.conformance.peer.command`: ``masd conformance peer``.
"""

from __future__ import annotations

from masd.conformance.peer.load import CheckError, PeerCheck, load_check, load_checks
from masd.conformance.peer.run import Kit, KitOptions

__all__ = ["CheckError", "Kit", "KitOptions", "PeerCheck", "load_check", "load_checks"]
