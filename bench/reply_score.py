"""How often each reply reader gets the sender's own words exactly: masd against the PyPI libraries.

    python -m bench.reply_score [--libs-python PATH] [--show NAME]

Scores, on every case of tests/data/replies/ (bench/reply_corpus.py), the share of replies
equal to the expected one once white space is normalised (runs of it one space), and counts
the cases where a reader gave an empty reply while the mail's text had words:

* masd: the event's ``reply_text`` (``build_event``, HTML-only mail cut at its quote marks);
* the libraries, each given the event's ``text`` (and, where it reads HTML, the HTML of an
  HTML-only case, its answer turned into text by masd's converter):
  email-reply-parser (``EmailReplyParser.parse_reply``), mail-parser-reply (every language it
  knows, ``latest_reply``), quotequail (``quote``/``quote_html``, the parts marked its own) and
  talon (``extract_from_plain``/``extract_from_html``, then ``bruteforce.extract_signature``).

The libraries are not masd's dependencies: they run in a child process under
``--libs-python``, a throwaway virtualenv's interpreter, e.g.::

    python3 -m venv /tmp/reply-libs
    /tmp/reply-libs/bin/pip install email-reply-parser mail-parser-reply quotequail talon
    .venv/bin/python -m bench.reply_score --libs-python /tmp/reply-libs/bin/python

Without it only masd is scored.  The child reads the cases as JSON on stdin and writes each
library's answers (or the error it raised) as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

LIBRARIES = ("email-reply-parser", "mail-parser-reply", "quotequail", "talon")


def _child() -> None:
    """In the libraries' virtualenv: answer for each case on stdin, by each library."""
    cases = json.load(sys.stdin)
    readers: dict[str, Any] = {}
    try:
        from email_reply_parser import EmailReplyParser

        readers["email-reply-parser"] = (EmailReplyParser.parse_reply, None)
    except ImportError:
        pass
    try:
        from mailparser_reply import EmailReplyParser as Mpr
        from mailparser_reply.constants import MAIL_LANGUAGES

        mpr = Mpr(languages=list(MAIL_LANGUAGES))
        readers["mail-parser-reply"] = (lambda t: mpr.read(t).latest_reply or "", None)
    except ImportError:
        pass
    try:
        import quotequail

        def own(parts: Any) -> str:
            return "\n".join(text for mine, text in parts if mine)

        readers["quotequail"] = (
            lambda t: own(quotequail.quote(t)),
            lambda h: own(quotequail.quote_html(h)),
        )
    except ImportError:
        pass
    try:
        import talon
        from talon import quotations
        from talon.signature.bruteforce import extract_signature

        talon.init()
        readers["talon"] = (
            lambda t: extract_signature(quotations.extract_from_plain(t))[0],
            quotations.extract_from_html,
        )
    except ImportError:
        pass
    out: dict[str, list[dict[str, str]]] = {}
    for name, (plain, html) in readers.items():
        answers = []
        for case in cases:
            try:
                if case["html"] is not None and html is not None:
                    answers.append({"html": html(case["html"])})
                else:
                    answers.append({"text": plain(case["text"])})
            except Exception as exc:  # a library's failure is its score, not the bench's
                answers.append({"error": f"{type(exc).__name__}: {exc}"[:200]})
        out[name] = answers
    json.dump(out, sys.stdout)


def _library_answers(python: str, cases: list[Any]) -> dict[str, list[dict[str, str]]]:
    feed = [{"text": c.event().text, "html": c.html()} for c in cases]
    run = subprocess.run(
        [python, __file__, "--child"],
        input=json.dumps(feed),
        capture_output=True,
        text=True,
        check=True,
    )
    answers: dict[str, list[dict[str, str]]] = json.loads(run.stdout)
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--libs-python", help="the interpreter of a virtualenv with the libraries")
    parser.add_argument("--show", help="print each reader's reply for this case")
    args = parser.parse_args()

    from bench.reply_corpus import load, normal
    from masd.core.htmltext import html_to_text
    from masd.core.reply import has_words

    cases = load()
    replies: dict[str, list[str | None]] = {"masd": [c.event().reply_text for c in cases]}
    if args.libs_python:
        for name, answers in _library_answers(args.libs_python, cases).items():
            replies[name] = [
                html_to_text(a["html"]) if "html" in a else a.get("text") for a in answers
            ]
    texts = [c.event().text for c in cases]
    print(f"{len(cases)} cases, {len({c.lang for c in cases})} languages")
    print(f"{'reader':20} {'exact':>12} {'empty':>6} {'errors':>6}")
    for name, got in replies.items():
        pairs = list(zip(got, cases, texts, strict=True))
        exact = sum(g is not None and normal(g) == normal(c.expected) for g, c, _ in pairs)
        empty = sum(g is not None and not has_words(g) and has_words(t) for g, _, t in pairs)
        errors = sum(g is None for g in got)
        share = f"{exact}/{len(cases)} {100 * exact / len(cases):.0f} %"
        print(f"{name:20} {share:>12} {empty:>6} {errors:>6}")
        if args.show:
            for g, c in zip(got, cases, strict=True):
                if c.name == args.show:
                    print(f"--- {name}:\n{g}")
    sources = sorted({c.source for c in cases})
    print(
        "\nexact, by source:",
        " ".join(f"{src} ({sum(c.source == src for c in cases)})" for src in sources),
    )
    for name, got in replies.items():
        row = []
        for src in sources:
            mine = [(g, c) for g, c in zip(got, cases, strict=True) if c.source == src]
            row.append(sum(g is not None and normal(g) == normal(c.expected) for g, c in mine))
        print(f"{name:20} " + " ".join(f"{n:>4}" for n in row))
    masd = zip(replies["masd"], cases, strict=True)
    missed = [c.name for g, c in masd if normal(g or "") != normal(c.expected)]
    print("masd misses:", " ".join(missed) or "none")


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        _child()
    else:
        main()
