"""HTML mail turned into text as a browser reads it (profile §18, masd/core/htmltext.py).

The cases are the ones a hand-written tokenizer gets wrong (a ``>`` inside a quoted attribute,
comments holding tags, raw-text elements), what a reader must keep apart (links and their
targets, list items, table cells), and what no reader sees.  Hypothesis checks that no markup
written in an attribute ever reaches the text.  Linearity on hostile HTML is measured as the
ratio of two sizes' times in one run, and printed; the bound is loose (for four times the
input a linear reader takes about 4 times as long, a quadratic one 16, and a machine busy with
other work adds noise to both) and no time is asserted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from masd.core.htmltext import MAX_HTML_CHARS, html_to_text, link_target

CASES = [
    # markup inside a quoted attribute value ends nothing
    ('<a title=\'a">b\' href="/y">second link</a>', "second link"),
    ('<p title="x > y">text</p>', "text"),
    ("<img alt='<b>' src=x>after", "after"),
    # a link's target follows its text where the two differ
    (
        '<a href="https://example.org/orders/77">the order page</a>',
        "the order page <https://example.org/orders/77>",
    ),
    (
        '<p>See <a href="https://x.example/">https://x.example/</a> now</p>',
        "See https://x.example/ now",
    ),
    ('<a href="mailto:help@example.org">help@example.org</a>', "help@example.org"),
    ('<a href="mailto:help@example.org">write to us</a>', "write to us <mailto:help@example.org>"),
    ('<a href="#top">top</a> <a href="javascript:x()">run</a>', "top run"),
    # list items, table rows and cells stay apart
    ("<ul><li>one</li><li>two</li></ul>", "one\ntwo"),
    ("<ol><li>three<li>four</ol>after", "three\nfour\n\nafter"),
    ("<table><tr><td>a</td><td>b</td></tr><tr><th>c<td>d</table>after", "a\tb\nc\td\n\nafter"),
    # comments, scripts, styles, head and hidden elements give no text
    ("<p>1 < 2</p><!-- <p>hidden</p> --><SCRIPT>x<y</script>z", "1 < 2\n\nz"),
    ("<html><head><title>T</title><style>p{color:red}</style></head><body>Hi</body></html>", "Hi"),
    ("<div hidden>h</div><span style='display: none'>preheader</span>shown", "shown"),
    ("<template><p>t</p></template><noscript>no script</noscript> run", "no script run"),
    ("text <!-- a comment never closed <p>more", "text"),
    # character references as WHATWG decodes them, in text and in attributes
    ("Hi &amp; bye&nbsp;x &#x41;&#66; &notit;", "Hi & bye x AB ¬it;"),
    ('<a href="https://e.example/?a=1&amp;b=2">go</a>', "go <https://e.example/?a=1&b=2>"),
    # line breaks: block elements, br, paragraphs
    ("<p>Hi<br>there<br><br><br>you</p><p>next</p>", "Hi\nthere\n\nyou\n\nnext"),
    ("<div><div><div>deep</div></div></div><div>next</div>", "deep\nnext"),
    ("<pre>  a\n    b</pre>after", "  a\n    b\n\nafter"),
    # misnested and unclosed tags, as the tree builder repairs them
    ("<b>bold <i>both</b> italic</i>", "bold both italic"),
    ("<p>one<p>two", "one\n\ntwo"),
    ("a < b <a x='>'<a <!x> <?php ?> <![CDATA[x]]>", "a < b"),
]


@pytest.mark.parametrize(("html", "text"), CASES)
def test_html_is_read_as_a_browser_reads_it(html: str, text: str) -> None:
    assert html_to_text(html) == text


def test_link_targets_are_shown_only_where_they_say_more() -> None:
    assert link_target("https://example.org/a", "the page") == "https://example.org/a"
    assert link_target("HTTPS://www.Example.org/", "example.org") is None
    assert link_target("/relative", "x") is None
    assert link_target("https://x.example/a b", "x") is None  # nothing that breaks the <>
    assert link_target(None, "x") is None


_TAG_TEXT = st.text(alphabet="<>/=\"' abpscriptyle-!", min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(
    value=_TAG_TEXT,
    quote=st.sampled_from(['"', "'"]),
    name=st.sampled_from(["title", "href", "alt", "style", "data-x"]),
    tag=st.sampled_from(["a", "p", "img", "span", "td", "div"]),
)
def test_no_markup_written_in_an_attribute_reaches_the_text(
    value: str, quote: str, name: str, tag: str
) -> None:
    """Whatever an attribute holds (its quote excepted), the text is the element's own."""
    value = value.replace(quote, "")
    html = f"<{tag} {name}={quote}{value}{quote}>seen</{tag}>"
    text = html_to_text(html)
    assert "<" not in text.replace("<https://", "").replace("<http://", ""), (html, text)
    assert text.startswith("seen") or tag == "img", (html, text)


_HOSTILE: dict[str, Callable[[int], str]] = {
    "deep nesting": lambda n: "<div>" * n + "x",
    "unclosed tags": lambda n: "<p x='" + "<a " * n,
    "unclosed formatting": lambda n: "<b><i><u><a href=x>" * (n // 4) + "x",
    "attribute flood": lambda n: "<a " + "x " * n + ">t</a>",
    "distinct attributes": lambda n: "<a " + " ".join(f"x{i}" for i in range(n // 7)) + ">t</a>",
    "many attributed tags": lambda n: (
        ("<a " + " ".join(f"y{i}" for i in range(150)) + ">") * (n // 1000)
    ),
    "misnested tables": lambda n: "<table><tr><td>" * (n // 3),
    "unclosed comments": lambda n: "<!-- <p>" * (n // 2),
    "stray lt": lambda n: "<" * n,
    "links": lambda n: '<a href="https://e.example/">x</a>' * (n // 8),
}


def _seconds(html: str) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        html_to_text(html)
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize("kind", sorted(_HOSTILE))
def test_hostile_html_takes_time_linear_in_its_length(kind: str) -> None:
    make = _HOSTILE[kind]
    small, large = make(200_000)[: MAX_HTML_CHARS // 4], make(800_000)[:MAX_HTML_CHARS]
    ratio = _seconds(large) / max(_seconds(small), 1e-6)
    print(f"{kind}: {len(small)} -> {len(large)} chars, time x{ratio:.2f}")
    assert ratio < 10, f"{kind}: four times the input took {ratio:.1f} times as long"


def test_at_most_max_html_chars_are_read() -> None:
    html = "<p>" + "a" * MAX_HTML_CHARS + "tail</p>"
    assert html_to_text(html) == "a" * (MAX_HTML_CHARS - 3)
