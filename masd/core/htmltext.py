"""Visible text of an HTML mail body, as a browser reads it (profile §18).

For mail whose only body is ``text/html``.  The markup is parsed by lexbor
(through ``selectolax``), a C implementation of the WHATWG HTML parsing
algorithm: quoted attribute values, comments, raw-text elements, unclosed and
misnested tags and character references are read as every browser reads them,
so no markup can pass for text (docs/performance.md, "HTML mail", compares it
with the other parsers measured).  The tree is then walked once, without
recursion, keeping what a reader sees: script, style, head, template and
hidden elements give no text (``noscript`` does: a mail reader runs no
script); block elements and ``<br>`` break lines, list items and table rows
each get a line and table cells a tab between them (as ``innerText`` does);
a link's target follows its text in angle brackets where the two differ.

HTML5 tree builders (lexbor's as every other measured) take time quadratic in
the depth of nesting: each start tag looks down the stack of open elements.
So, as browsers bound the depth of the tree they build (Chromium at 512),
:func:`flatten` drops the start tags that would nest deeper than
:data:`MAX_DEPTH` before the parser sees them (their text stays), and the
attributes of a tag with more than :data:`MAX_ATTRIBUTES` (each new attribute is
compared with all before it: quadratic too).
"""

from __future__ import annotations

import re
from typing import Final

from selectolax.lexbor import LexborHTMLParser, LexborNode

__all__ = ["MAX_DEPTH", "MAX_HTML_CHARS", "flatten", "html_to_text", "link_target"]

#: HTML characters fed to the parser; the event's text is cut at
#: ``MAX_TEXT_BYTES`` afterwards anyway.
MAX_HTML_CHARS: Final = 1024 * 1024

# Block elements start a new line; paragraph-like ones leave a blank line.
_PARAGRAPH_TAGS: Final = frozenset(
    {
        *("blockquote", "dl", "figure", "form", "h1", "h2", "h3", "h4", "h5", "h6"),
        *("hr", "ol", "p", "pre", "table", "ul"),
    }
)
_LINE_TAGS: Final = frozenset(
    {
        *("address", "article", "aside", "caption", "dd", "details", "div", "dt", "fieldset"),
        *("figcaption", "footer", "header", "li", "main", "nav", "section", "summary", "tr"),
    }
)
_CELL_TAGS: Final = frozenset({"td", "th"})
#: Elements whose content no reader sees.
_SKIP_TAGS: Final = frozenset({"head", "title", "script", "style", "template", "iframe", "object"})
_SPACES: Final = re.compile(r"[ \t\f\v\r\n\u00a0]+")
_HIDDEN_STYLE: Final = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)
#: Link targets worth showing: where a reader would go, not a fragment or a script.
_SHOWN_SCHEMES: Final = ("http://", "https://", "ftp://", "mailto:", "tel:")
_TEXT: Final = "-text"

#: Deepest nesting of elements the parser is given (Chromium's tree builder: 512).
MAX_DEPTH: Final = 512
# What flatten() reads: a comment, a raw-text element's whole content, or the
# start of a tag (group 1 "/" for an end tag, group 2 its name).
_FLAT_TOKEN: Final = re.compile(
    r"<!--.*?(?:-->|\Z)|<(script|style|textarea|title|xmp|iframe|noembed|noframes)\b"
    r"|<(/?)([a-zA-Z][^\s/>]*)",
    re.DOTALL | re.IGNORECASE,
)
# The rest of a tag after its name, quoted values read whole; no match: the tag
# runs to the end of the input, and so does everything after it.
_TAG_REST: Final = re.compile(r"(?:[^>\"']++|\"[^\"]*+\"|'[^']*+')*+>")  # possessive: linear
#: Attributes one tag may carry: the tree builder checks each new one against all
#: before it (lexbor: 50,000 distinct attributes take 17 s), so a tag with more
#: loses them all.  Real mail has a handful; a tag this short cannot have more.
MAX_ATTRIBUTES: Final = 100
_SHORT_TAG: Final = 2 * MAX_ATTRIBUTES
_QUOTED: Final = re.compile(r"\"[^\"]*\"|'[^']*'")
_ATTRIBUTE: Final = re.compile(r"[^\s/>=]+")
#: Elements that never hold others, or that the next of their kind closes.
_FLAT_TAGS: Final = frozenset(
    {
        *("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta"),
        *("param", "source", "track", "wbr", "p", "li", "dt", "dd", "option", "optgroup"),
        *("tr", "td", "th", "tbody", "thead", "tfoot", "colgroup", "caption", "rb", "rp", "rt"),
    }
)


def _attributes(rest: str) -> int:
    """At least the number of attributes in a tag's ``rest`` after its name."""
    return len(_ATTRIBUTE.findall(_QUOTED.sub("", rest)))


def flatten(source: str, limit: int = MAX_DEPTH) -> str:
    """``source`` less the start tags that would open elements deeper than ``limit``,
    and less the attributes of a tag that has more than :data:`MAX_ATTRIBUTES`.

    One pass, reading tags as the HTML tokenizer does (quoted attribute values,
    comments and raw-text elements whole) and counting the elements they leave
    open: an end tag closes its element and those opened inside it, as the tree
    builder does; elements that hold nothing or close by their next sibling count
    nothing.  The count is an estimate of the parser's depth (it only needs to
    bound it), so well-formed mail is never changed.
    """
    kept: list[str] = []
    stack: list[str] = []
    depth: dict[str, int] = {}
    pos = copied = 0
    while (m := _FLAT_TOKEN.search(source, pos)) is not None:
        pos = m.end()
        if m.group(1) is not None:  # raw text: its content is no markup
            end = re.compile(f"</{m.group(1)}", re.IGNORECASE).search(source, pos)
            pos = len(source) if end is None else end.end()
            continue
        if m.group(3) is None:  # a comment
            continue
        rest = _TAG_REST.match(source, pos)
        if rest is None:  # an unclosed tag swallows the rest: there is no more text
            kept.append(source[copied : m.start()])
            return "".join(kept)
        pos = rest.end()
        name = m.group(3).lower()
        if pos - m.end() > _SHORT_TAG and _attributes(rest.group()) > MAX_ATTRIBUTES:
            kept.append(source[copied : m.start()] + f"<{m.group(2)}{m.group(3)}>")
            copied = pos
        if name in _FLAT_TAGS:
            continue
        if m.group(2):
            if depth.get(name):
                while (top := stack.pop()) != name:
                    depth[top] -= 1
                depth[name] -= 1
        elif len(stack) < limit:
            stack.append(name)
            depth[name] = depth.get(name, 0) + 1
        else:
            kept.append(source[copied : m.start()])
            copied = pos
    kept.append(source[copied:])
    return "".join(kept)


def _hidden(node: LexborNode) -> bool:
    attributes = node.attributes
    if not attributes:
        return False
    if "hidden" in attributes:
        return True
    style = attributes.get("style")
    return style is not None and _HIDDEN_STYLE.search(style) is not None


def _bare(text: str) -> str:
    """A link target or text reduced for comparison: no scheme, case or end slash."""
    text = text.strip().lower()
    for scheme in _SHOWN_SCHEMES:
        if text.startswith(scheme):
            text = text[len(scheme) :]
            break
    return text.removeprefix("www.").rstrip("/")


def link_target(href: str | None, text: str) -> str | None:
    """The target shown after a link's ``text``: an absolute ``href`` that says more than
    the text does; None when it is relative, a fragment, a script or the text itself."""
    if not href:
        return None
    href = href.strip()
    if not href.lower().startswith(_SHOWN_SCHEMES) or any(c in href for c in "<> \t\r\n"):
        return None
    return None if _bare(href) in _bare(text) else href


class _TextSink:
    """Collects visible text; line breaks and cell tabs are owed, not written.

    A block boundary asks for one line break (a paragraph for two) before the
    next visible text, so nested blocks and whitespace between tags do not pile
    up empty lines; a cell's end asks for a tab, which a line break overrides.
    """

    def __init__(self) -> None:
        self.out: list[str] = []
        self.owed = 0
        self.tab = False

    def block(self, tag: str) -> None:
        if tag == "br":
            self.owed = min(self.owed + 1, 2)
        elif tag in _PARAGRAPH_TAGS:
            self.owed = 2
        elif tag in _LINE_TAGS:
            self.owed = max(self.owed, 1)

    def data(self, text: str, pre: bool) -> None:
        if not pre:
            text = _SPACES.sub(" ", text)
        if self.owed or self.tab:
            if not text.strip(" \n"):
                return
            if self.out:
                self.out.append("\n" * self.owed if self.owed else "\t")
            text = text if pre else text.lstrip(" ")
            self.owed, self.tab = 0, False
        if text:
            self.out.append(text)

    def since(self, mark: int) -> str:
        return "".join(self.out[mark:])


def _children(node: LexborNode) -> list[LexborNode]:
    kids = []
    child = node.first_child
    while child is not None:
        kids.append(child)
        child = child.next
    return kids


def html_to_text(source: str) -> str:
    """Visible text of an HTML body (at most :data:`MAX_HTML_CHARS` characters read),
    in time linear in its length (tests/test_htmltext.py measures it)."""
    root = LexborHTMLParser(flatten(source[:MAX_HTML_CHARS])).root
    sink = _TextSink()
    pre = 0
    # (node, None) enters a node; (node, mark) leaves an element entered when the
    # text held ``mark`` pieces (for a link, its text is what came since).
    stack: list[tuple[LexborNode, int | None]] = [] if root is None else [(root, None)]
    while stack:
        node, mark = stack.pop()
        tag = node.tag or ""
        if mark is not None:
            if tag != "br":  # a line break once, where it stands
                sink.block(tag)
            if tag == "pre":
                pre -= 1
            elif tag in _CELL_TAGS:
                sink.tab = True
            elif tag == "a":
                shown = link_target(node.attributes.get("href"), sink.since(mark))
                if shown is not None:
                    sink.data(f" <{shown}>", pre > 0)
            continue
        if tag == _TEXT:
            sink.data(node.text_content or "", pre > 0)
            continue
        if tag.startswith("-") or tag in _SKIP_TAGS or _hidden(node):
            continue  # a comment or doctype, or nothing a reader sees
        sink.block(tag)
        if tag == "pre":
            pre += 1
        stack.append((node, len(sink.out)))
        stack.extend((kid, None) for kid in reversed(_children(node)))
    lines = (line.rstrip(" ") for line in "".join(sink.out).split("\n"))
    return "\n".join(lines).strip("\n")
