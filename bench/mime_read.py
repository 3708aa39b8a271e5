"""Messages per second: masd's event reader against the standard library's ``email``.

    python -m bench.mime_read [--rounds N]

Reads every message of the shipped sources of tests/mail_corpus.json (the
Debian packages .ci/setup.d/mailcorpus.sh installs) and of tests/mail/, and
prints, for each reader, messages/s over ``--rounds`` passes (best pass):

* masd: ``build_event`` (headers, From, ids, text, every attachment hashed);
* stdlib: ``email.message_from_bytes`` with policy ``default``, then what
  the event needs from it: ``get_body``, its content, each leaf's filename
  and decoded payload hashed, From's addresses and the Message-ID.
"""

from __future__ import annotations

import argparse
import email
import email.policy
import hashlib
import json
import time
from collections.abc import Callable
from email.message import EmailMessage, Message
from pathlib import Path

from masd.core.event import build_event
from masd.core.trust import TrustSettings

ROOT = Path(__file__).resolve().parent.parent
TRUST = TrustSettings.of(["mx.help.example"])


def corpus() -> list[bytes]:
    manifest = json.loads((ROOT / "tests" / "mail_corpus.json").read_text("utf-8"))
    paths: list[Path] = sorted((ROOT / "tests" / "mail").glob("*.eml"))
    for source in manifest["shipped"]:
        directory = Path(source["directory"])
        if directory.is_dir():
            paths += sorted(p for p in directory.glob(source["glob"]) if p.is_file())
        else:
            print(f"(not installed: {source['package']}, {directory})")
    return [p.read_bytes() for p in paths if p.stat().st_size]


def read_masd(raw: bytes) -> None:
    build_event(
        raw,
        mail_from="a@example.org",
        rcpt_to="ticket@help.example",
        received_at="2025-01-06T10:00:05Z",
        message_ref="m-1",
        trust=TRUST,
    )


def _leaves(part: Message) -> list[Message]:
    if part.get_content_maintype() == "multipart" and part.is_multipart():
        return [leaf for sub in part.get_payload() for leaf in _leaves(sub)]
    return [part]


def read_stdlib(raw: bytes) -> None:
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    try:
        body = msg.get_body(("plain", "html"))
        if body is not None:
            body.get_content()
        for header in msg.get_all("from") or []:
            [a.addr_spec for a in header.addresses]
        str(msg.get("message-id", ""))
        str(msg.get("subject", ""))
    except Exception:  # the stdlib fails on some real mail: time it anyway
        body = None
    for leaf in _leaves(msg):
        if leaf is not body:
            leaf.get_filename()
            hashlib.sha256(leaf.get_payload(decode=True) or b"").hexdigest()


def rate(reader: Callable[[bytes], None], messages: list[bytes], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for raw in messages:
            reader(raw)
        best = min(best, time.perf_counter() - start)
    return len(messages) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    messages = corpus()
    size = sum(map(len, messages))
    print(f"{len(messages)} messages, {size / 1024:.0f} KiB, best of {args.rounds} passes")
    ours = rate(read_masd, messages, args.rounds)
    theirs = rate(read_stdlib, messages, args.rounds)
    print(f"masd    {ours:9.0f} messages/s")
    print(f"stdlib  {theirs:9.0f} messages/s")
    print(f"ratio   {ours / theirs:9.1f}x")


if __name__ == "__main__":
    main()
