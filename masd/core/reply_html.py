"""The sender's own words of an HTML-only mail, found in its markup (profile §21).

Mail clients mark the quote they append in the HTML they write, and the
marks are surer than any reading of the text made from it:

* Gmail: ``<div class="gmail_quote">`` (the attribution inside it);
* Apple Mail, iOS Mail, Thunderbird: ``<blockquote type="cite">``, Thunderbird's
  attribution in ``<div class="moz-cite-prefix">`` just before it; any other
  ``<blockquote>`` (mail.ru, Yandex, Outlook.com's older replies) likewise;
* Outlook desktop, Outlook on the web and Outlook mobile: ``<div id="divRplyFwdMsg">``,
  ``<div id="appendonsend">``, ``<span id="OLK_SRC_BODY_SECTION">`` (Outlook for Mac),
  ``<div id="mail-editor-reference-message-container">`` and the
  ``OutlookMessageHeader`` / ``<hr id="stopSpelling">`` of older ones;
* Yahoo: ``<div class="yahoo_quoted">``; AOL and Yahoo's older mail ``AOLMsgPart``
  and ``yahoo_quoted`` ids; ProtonMail ``protonmail_quote``; Thunderbird's forward
  ``moz-forward-container``; Zoho ``zmail_extra``.

:func:`cut_html` returns the markup before the first such mark that no own
words follow: a quote followed by more of the sender's words (inline or
bottom posting) is kept, as in the plain-text rules of :mod:`masd.core.reply`.
Outlook's header marks end the reply whatever follows ("and all after it").
The caller turns the kept markup into text and applies the text rules too.

Linear in the markup's length: marks are found by one forward scan, each
element's end by one scan of its own tags, and a later search starts past it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from masd.core.htmltext import html_to_text
from masd.core.reply import has_words, own_words, reply_text

__all__ = ["cut_html", "html_reply_text"]

#: marks after which everything is the earlier mail, whatever follows
_ALL_AFTER: Final = (
    "divrplyfwdmsg|appendonsend|olk_src_body_section|mail-editor-reference-message-container"
    "|outlookmessageheader|stopspelling|moz-forward-container|aolmsgpart|zmail_extra"
)
#: marks of one quoted element, after which the sender may go on writing
_ELEMENT: Final = "gmail_quote|yahoo_quoted|protonmail_quote|moz-cite-prefix"

# A start tag carrying one of the marks in its class, id, name or type.
# ``[^<>]*`` keeps each attempt within one tag and a quoted value's scan ends at
# its closing quote: the search stays linear.
# Any blockquote is one too: clients quote in it (type="cite" or a style alone), and
# the sender's own words after it keep it.
_MARK: Final = re.compile(
    r"<(?:(?P<bq>blockquote)\b|(?P<tag>[a-z][a-z0-9]*)\b[^<>]*?"
    r"\b(?:class|id|name|type)\s*=\s*(?:\"[^\"<>]*?|'[^'<>]*?|)"
    rf"\b(?:x_)?(?P<mark>{_ALL_AFTER}|{_ELEMENT}))",
    re.I,
)
#: at most this many marks are looked at; a mail with more keeps its text whole
_MAX_MARKS: Final = 200


def html_reply_text(html: str, text: str) -> str:
    """The reply text of an HTML body ``html`` whose whole text is ``text``.

    The markup is cut at its quote marks, the rest turned into text and the
    text rules applied; when that leaves no words, the text rules alone on
    ``text`` (and at worst ``text``)."""
    kept = cut_html(html, html_to_text, _has_own)
    if len(kept) < len(html):
        own = reply_text(html_to_text(kept), quote_cut=True, from_html=True)
        if has_words(own):
            return own
    return reply_text(text, from_html=True)


def _has_own(text: str) -> bool:
    own = own_words(text, from_html=True)
    return has_words(text if own is None else own)


def cut_html(html: str, to_text: Callable[[str], str], has_own: Callable[[str], bool]) -> str:
    """``html`` up to the first quote mark that only quoted mail follows, or whole.

    ``to_text`` turns markup into text; ``has_own(text)`` says whether a
    piece of text outside every quote holds the sender's own words."""
    spans = _spans(html)
    if not spans:
        return html
    # own[j]: the sender's words between the end of mark j and the next mark.
    own = [
        bool(gap.strip()) and has_own(to_text(gap))
        for gap in (
            html[end : _next_start(spans, j, len(html))] for j, (_, end, _) in enumerate(spans)
        )
    ]
    cut = len(html)
    for k in range(len(spans) - 1, -1, -1):  # from the last mark back
        start, _end, all_after = spans[k]
        if own[k] and not all_after:
            break
        cut = start
    return html[:cut]


def _next_start(spans: list[tuple[int, int, bool]], j: int, default: int) -> int:
    return spans[j + 1][0] if j + 1 < len(spans) else default


def _spans(html: str) -> list[tuple[int, int, bool]]:
    """The outermost marked elements: (start, end, all-after), in document order."""
    spans: list[tuple[int, int, bool]] = []
    pos = 0
    while len(spans) < _MAX_MARKS:
        m = _MARK.search(html, pos)
        if m is None:
            break
        tag = m.group("bq") or m.group("tag")
        all_after = m.group("bq") is None and m.group("mark").lower() in _ALL_AFTER.split("|")
        end = len(html) if all_after else _element_end(html, tag, m.end())
        spans.append((m.start(), end, all_after))
        if all_after:
            break
        pos = end
    return spans


def _element_end(html: str, tag: str, pos: int) -> int:
    """Where the element whose start tag ends before ``pos`` ends (its closing tag
    matched by depth), or the end of ``html``."""
    pattern = re.compile(rf"<(/?){re.escape(tag)}\b[^<>]*>?", re.I)
    depth = 1
    for m in pattern.finditer(html, pos):
        depth += -1 if m.group(1) else 1
        if depth == 0:
            return m.end()
    return len(html)
