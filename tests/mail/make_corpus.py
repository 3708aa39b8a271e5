"""Recipes for the corpus messages too large to keep in the repository.

A corpus entry ``NAME.json`` with ``"generate": "NAME"`` has no ``NAME.eml``;
its bytes come from ``RECIPES[NAME]()``.  Run this file to write them out
(for example to feed a real Postfix): ``python tests/mail/make_corpus.py DIR``.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from collections.abc import Callable
from pathlib import Path

HEAD = (
    "Authentication-Results: mx.help.example; dkim=pass header.d=example.org;\n"
    "\tdmarc=pass (p=none dis=none) header.from=example.org\n"
    "Received: from smtp.example.org (smtp.example.org [192.0.2.70])\n"
    "\tby mx.help.example (Postfix) with ESMTPS id 4YRkg56a91z9sXT\n"
    "\tfor <ticket@help.example>; Mon, 6 Jan 2025 10:40:00 +0000 (UTC)\n"
)


def big_payload() -> bytes:
    """2 MiB of incompressible, reproducible bytes."""
    return b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(65536))


def big_attachment() -> bytes:
    """A 2 MiB base64 attachment (about 2.8 MB on the wire)."""
    encoded = base64.encodebytes(big_payload()).decode("ascii")
    return (
        HEAD + "From: Pat Kim <pat@example.org>\n"
        "To: ticket@help.example\n"
        "Subject: Logs from the print server\n"
        "Date: Mon, 6 Jan 2025 10:40:00 +0000\n"
        "Message-ID: <big.1@example.org>\n"
        "MIME-Version: 1.0\n"
        'Content-Type: multipart/mixed; boundary="big-boundary"\n'
        "\n"
        "--big-boundary\n"
        "Content-Type: text/plain; charset=utf-8\n"
        "\n"
        "Logs attached.\n"
        "--big-boundary\n"
        'Content-Type: application/x-tar; name="logs.tar"\n'
        'Content-Disposition: attachment; filename="logs.tar"\n'
        "Content-Transfer-Encoding: base64\n"
        "\n" + encoded + "--big-boundary--\n"
    ).encode("ascii")


def many_headers() -> bytes:
    """1000 header fields: trace and filter headers a busy relay chain leaves."""
    lines = [HEAD.rstrip("\n")]
    for i in range(496):
        lines.append(f"X-Filter-Trace-{i}: pass (filter {i}; score=0.{i % 10})")
        lines.append(f"X-Spam-Detail-{i}: rule_{i}=0.0, rule_{i + 1}=0.1,\n\tcontinued line {i}")
    lines += [
        "From: Pat Kim <pat@example.org>",
        "To: ticket@help.example",
        "Subject: Many headers",
        "Date: Mon, 6 Jan 2025 10:41:00 +0000",
        "Message-ID: <many.1@example.org>",
        "Content-Type: text/plain; charset=utf-8",
        "",
        "Body after a thousand headers.",
        "",
    ]
    return "\n".join(lines).encode("ascii")


RECIPES: dict[str, Callable[[], bytes]] = {
    "big_attachment": big_attachment,
    "many_headers": many_headers,
}


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent
    for name, recipe in RECIPES.items():
        (out / f"{name}.eml").write_bytes(recipe())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
