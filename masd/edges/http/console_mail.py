"""The bytes of a mail in the operator console: ``/console/messages/{ref}/raw`` and
``/console/messages/{ref}/attachments/{n}`` (docs/operations.md, the console).

Each is the read side's own route (:mod:`masd.edges.http.message`: the message found,
the attachment located and checked, a single Range, HEAD, the ETag) run for a signed-in
session as the admin; :mod:`masd.edges.http.console` wraps them in its session check.
They answer as downloads: ``Content-Disposition: attachment`` (the raw message as
``<ref>.eml``), ``nosniff``, and :data:`DOWNLOAD_CSP` in place of the pages' policy, a
sandbox in which nothing loads or runs, so a hostile HTML file a mail carries can never act
as a page of the console's origin.  The headers are set as the answer is prepared
(:data:`DOWNLOAD`, read by :func:`masd.edges.http.console.guard`); a refusal is a page
of the console's, without them.
"""

from __future__ import annotations

from typing import Final

from aiohttp import hdrs, web

from masd.console.sessions import Session
from masd.edges.http import message
from masd.edges.http.auth import READER
from masd.edges.http.shared import Handler, HttpRefusal, Served
from masd.read.access import ADMIN

#: The policy of a mail's bytes: a sandbox; nothing loads, nothing runs, no framing.
DOWNLOAD_CSP: Final = "sandbox; default-src 'none'; frame-ancestors 'none'"
#: Headers a download adds to the answer the read side's route prepares.
DOWNLOAD: Final = web.RequestKey("console_download", dict)


async def _download(
    request: web.Request, served: Served, serve: Handler, headers: dict[str, str]
) -> web.StreamResponse:
    request[READER] = ADMIN
    request[DOWNLOAD] = {hdrs.CONTENT_SECURITY_POLICY: DOWNLOAD_CSP, **headers}
    try:
        return await serve(request, served)
    except HttpRefusal:
        del request[DOWNLOAD]
        raise


async def raw(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    """The message as received, saved as ``<ref>.eml``."""
    name = message.disposition(request.match_info["ref"] + ".eml")
    return await _download(request, served, message.raw, {hdrs.CONTENT_DISPOSITION: name})


async def attachment(request: web.Request, served: Served, session: Session) -> web.StreamResponse:
    """Attachment ``n``, saved under its own filename."""
    return await _download(request, served, message.attachment, {})
