"""The HTTP listener (docs/protocol.md §9, §16): contract messages in, health, metrics, the
read side.

One module per route (:mod:`~masd.edges.http.messages`, :mod:`~masd.edges.http.healthz`,
:mod:`~masd.edges.http.metrics`, :mod:`~masd.edges.http.case`,
:mod:`~masd.edges.http.thread`, :mod:`~masd.edges.http.cases`,
:mod:`~masd.edges.http.events`, :mod:`~masd.edges.http.outbox`,
:mod:`~masd.edges.http.clock`, :mod:`~masd.edges.http.message` (the mail itself),
:mod:`~masd.edges.http.intakes`, and the operator console's :mod:`~masd.edges.http.console`),
each declaring its :class:`~masd.edges.http.shared.Route`;
:mod:`~masd.edges.http.shared` holds what they share (paths, the reply table, refusals,
query parameters, :class:`~masd.edges.http.shared.HttpRefusal`) and
:mod:`~masd.edges.http.ranges` how bytes are served whole or by range;
:mod:`~masd.edges.http.auth` checks the secret a route declares it needs;
:mod:`~masd.edges.http.edge` builds the application from them, with the one middleware that
answers every refusal, and :mod:`~masd.edges.http.server` binds and limits the listener.
Route modules import only ``shared``, ``ranges`` and ``auth``, so the package has no import cycle.

Every answer is JSON.  Nothing a client sends yields a 5xx: a malformed ``Authorization``
header is 401, a body :mod:`masd.core.wire` cannot decode is 400.  A 5xx says masd itself
failed: ``503 unavailable`` with ``Retry-After``, and the same ``id`` may be sent again.
"""

from masd.edges.http.edge import ROUTES, HttpEdge
from masd.edges.http.server import (
    HEADER_TIMEOUT,
    KEEPALIVE_TIMEOUT,
    MAX_CONNECTIONS,
    HttpLimits,
    HttpListenError,
    HttpServer,
    start_http,
)
from masd.edges.http.shared import (
    CASES_PATH,
    CLOCK_PATH,
    EVENTS_PATH,
    MAX_BODY,
    MESSAGES_PATH,
    OUTBOX_PATH,
    REPLIES,
    HttpRefusal,
    Route,
)

__all__ = [
    "CASES_PATH",
    "CLOCK_PATH",
    "EVENTS_PATH",
    "HEADER_TIMEOUT",
    "KEEPALIVE_TIMEOUT",
    "MAX_BODY",
    "MAX_CONNECTIONS",
    "MESSAGES_PATH",
    "OUTBOX_PATH",
    "REPLIES",
    "ROUTES",
    "HttpEdge",
    "HttpLimits",
    "HttpListenError",
    "HttpRefusal",
    "HttpServer",
    "Route",
    "start_http",
]
