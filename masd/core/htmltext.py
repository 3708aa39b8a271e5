"""Visible text of an HTML mail body, in one linear pass.

For mail whose only body is ``text/html``: tags are dropped, script, style
and head content skipped, block elements turned into line breaks and
entities decoded.  ``html.parser`` is not used: on Python 3.11 it rescans the
rest of the input for each unfinished construct (quadratic on hostile mail).
"""

from __future__ import annotations

import html
import re

__all__ = ["MAX_HTML_CHARS", "defuse", "html_to_text"]

#: HTML characters fed to the converter; the event's text is cut at
#: ``MAX_TEXT_BYTES`` afterwards anyway.
MAX_HTML_CHARS = 1024 * 1024

# Block elements start a new line; paragraph-like ones leave a blank line.
_PARAGRAPH_TAGS = frozenset(
    {
        *("blockquote", "dl", "figure", "form", "h1", "h2", "h3", "h4", "h5", "h6"),
        *("hr", "ol", "p", "pre", "table", "ul"),
    }
)
_LINE_TAGS = frozenset(
    {
        *("address", "article", "aside", "dd", "div", "dt", "fieldset", "figcaption"),
        *("footer", "header", "li", "main", "nav", "section", "tbody", "td", "tfoot"),
        *("th", "thead", "tr"),
    }
)
_SKIP_TAGS = frozenset({"head", "title", "template", "noscript"})
_SPACES = re.compile(r"[ \t\f\v\r\n\u00a0]+")


_STRAY_LT = re.compile(r"<(?:(?=[^<>]*(?:<|\Z))|(?=\?)|(?=!(?!--|doctype)))", re.IGNORECASE)


def _stray_lt(text: str) -> str:
    return _STRAY_LT.sub("&lt;", text)


def defuse(source: str) -> str:
    """Escape every ``<`` that no ``>`` closes before the next ``<``.

    Such a ``<`` cannot start a tag, so it is text.  Markup declarations
    other than comments and DOCTYPE (``<![CDATA[``, ``<!x``) and processing
    instructions (``<?``) mean nothing in mail and become text too.
    Comments are kept whole (they may hold tags); an unclosed comment is
    text.  Afterwards every ``<`` has its ``>`` before the next ``<`` and
    every comment its ``-->``, which keeps the tokenizer below linear.
    """
    out: list[str] = []
    pos = 0
    while True:
        start = source.find("<!--", pos)
        if start < 0:
            break
        end = source.find("-->", start + 4)
        if end < 0:
            break
        out.append(_stray_lt(source[pos:start]))
        out.append(source[start : end + 3])
        pos = end + 3
    out.append(_stray_lt(source[pos:]).replace("<!--", "&lt;!--"))
    return "".join(out)


# One token of HTML: a tag (group 1 "/" for an end tag, group 2 its name),
# or a comment, declaration or processing instruction (no groups).
_HTML_TOKEN = re.compile(r"<(/?)([a-zA-Z][^\s/>]*)[^>]*>|<!--.*?-->|<![^>]*>|<\?[^>]*>", re.DOTALL)
_RAW_TEXT_TAGS = frozenset({"script", "style"})


class _TextSink:
    """Collects visible text; line breaks are owed, not written.

    A block boundary asks for one line break (a paragraph for two) before
    the next visible text, so nested blocks and whitespace between tags do
    not pile up empty lines.
    """

    def __init__(self) -> None:
        self.out: list[str] = []
        self.owed = 0

    def block(self, tag: str) -> None:
        if tag == "br":
            self.owed = min(self.owed + 1, 2)
        elif tag in _PARAGRAPH_TAGS:
            self.owed = 2
        elif tag in _LINE_TAGS:
            self.owed = max(self.owed, 1)

    def data(self, raw: str, pre: bool) -> None:
        text = html.unescape(raw)
        if not pre:
            text = _SPACES.sub(" ", text)
        if self.owed:
            if not text.strip():
                return
            if self.out:
                self.out.append("\n" * self.owed)
            text = text.lstrip(" ")
            self.owed = 0
        self.out.append(text)


def html_to_text(source: str) -> str:
    """Visible text of an HTML body, in one linear pass.

    ``html.parser`` is not used: on Python 3.11 it rescans the rest of the
    input for each unfinished construct (quadratic: ``<a x='>'`` repeated a
    few thousand times takes seconds).  Tags are dropped, script, style and
    head content skipped, entities decoded with ``html.unescape``; at most
    :data:`MAX_HTML_CHARS` characters are read.
    """
    doc = defuse(source[:MAX_HTML_CHARS])
    lower = doc.lower()
    sink = _TextSink()
    skip = 0
    pre = 0
    pos = 0
    n = len(doc)
    while pos < n:
        m = _HTML_TOKEN.search(doc, pos)
        end = n if m is None else m.start()
        if end > pos and not skip:
            sink.data(doc[pos:end], pre > 0)
        if m is None:
            break
        pos = m.end()
        name = m.group(2)
        if name is None:
            continue
        tag = name.lower()
        closing = m.group(1) == "/"
        if tag in _RAW_TEXT_TAGS and not closing:
            close = lower.find("</" + tag, pos)
            pos = n if close < 0 else close
            continue
        if tag in _SKIP_TAGS:
            skip = max(0, skip - 1) if closing else skip + 1
        elif tag == "pre":
            pre = max(0, pre - 1) if closing else pre + 1
        sink.block(tag)
    lines = (line.strip(" ") for line in "".join(sink.out).split("\n"))
    return "\n".join(lines).strip("\n")
