"""``masd doctor``: what an operator checks first, each finding naming what and why.

- the listeners answer (LMTP greets, HTTP ``/healthz`` says ok, policy and
  milter accept a connection);
- the store exists and can be written;
- of the last N messages, how many carried an Authentication-Results masd
  trusted, and which authserv-ids the others carried instead: the usual
  reason mail is recorded but never acknowledged nor handed off is an MTA
  writing its results under another name than ``server.trusted_authserv_ids``;
- every DKIM key can be read and signs;
- the SMTP relay greets, every peer (mode endpoints, masters, webhooks)
  accepts a connection.

Its running counterpart is :class:`masd.service.trust_watch.TrustWatch`,
which warns while recent mail carries no trusted result.
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from masd.config import Config, Listen, TcpListen, UnixListen
from masd.core.comments import strip_comments
from masd.core.mime import parse_headers
from masd.core.trust import split_resinfo
from masd.service.trust_watch import WINDOW
from masd.store.probe import DoctorStoreError, RecentMessage, check_writable, recent_messages

#: Bound of every connection the doctor makes.
TIMEOUT: Final = 3.0


@dataclass(frozen=True)
class Finding:
    ok: bool
    what: str
    why: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.what}: {self.why}"


# --------------------------------------------------------------------------- trust


def authserv_ids(head: bytes) -> list[str]:
    """The authserv-id of every Authentication-Results header in ``head``, top down."""
    ids = []
    for name, value in parse_headers(head):
        if name.lower() != "authentication-results":
            continue
        words = strip_comments(split_resinfo(" ".join(value.split()))[0]).split()
        if words:
            ids.append(words[0].lower().rstrip("."))
    return ids


@dataclass(frozen=True)
class TrustSummary:
    total: int
    trusted: int
    #: For the messages without a trusted result: how many carried an A-R of each id.
    others: tuple[tuple[str, int], ...]


def summarize(messages: Sequence[RecentMessage]) -> TrustSummary:
    others: Counter[str] = Counter()
    trusted = 0
    for message in messages:
        if message.authserv_id is not None:
            trusted += 1
            continue
        others.update(set(authserv_ids(message.head)))
    return TrustSummary(len(messages), trusted, tuple(others.most_common()))


def trust_finding(summary: TrustSummary, trusted_ids: Sequence[str]) -> Finding:
    """ "0 of 120 messages had an A-R from mx.help.example; 118 had one from mx.other.example"."""
    what = "authentication"
    ours = " or ".join(trusted_ids) or "(server.trusted_authserv_ids is empty)"
    if summary.total == 0:
        return Finding(True, what, "no messages recorded yet")
    text = f"{summary.trusted} of {summary.total} messages had an A-R from {ours}"
    parts = []
    for sid, n in summary.others:
        if sid in trusted_ids:
            # The id is trusted, yet the result was not: it sat below a Received
            # header by a host outside server.trusted_hosts.
            parts.append(f"{n} had one from {sid} below a host not in server.trusted_hosts")
        else:
            parts.append(f"{n} had one from {sid}")
    text = "; ".join([text, *parts])
    if summary.trusted:
        return Finding(True, what, text)
    hint = "no mail can pass DMARC, so none is acknowledged or handed off"
    if any(sid not in trusted_ids for sid, _ in summary.others):
        hint += "; is the authserv-id your verifier writes in server.trusted_authserv_ids?"
    else:
        hint += "; does a DMARC verifier run in front of masd?"
    return Finding(False, what, f"{text}: {hint}")


# --------------------------------------------------------------------------- reachability


def _connect(listen: Listen) -> socket.socket:
    if isinstance(listen, UnixListen):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT)
        try:
            sock.connect(str(listen.path))
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection((listen.host, listen.port), timeout=TIMEOUT)


def _greeting(listen: Listen) -> str:
    """Connect and read the first line (an SMTP or LMTP greeting)."""
    with _connect(listen) as sock:
        return sock.makefile("rb").readline(512).decode("ascii", "replace").strip()


def check_greets(what: str, listen: Listen) -> Finding:
    try:
        line = _greeting(listen)
    except OSError as exc:
        return Finding(False, what, f"{listen}: {exc.strerror or exc}")
    if not line.startswith("220"):
        return Finding(False, what, f"{listen} greeted with {line[:80]!r}, not 220")
    return Finding(True, what, f"{listen} greets: {line[:80]}")


def check_accepts(what: str, listen: Listen) -> Finding:
    try:
        _connect(listen).close()
    except OSError as exc:
        return Finding(False, what, f"{listen}: {exc.strerror or exc}")
    return Finding(True, what, f"{listen} accepts connections")


def check_http(listen: Listen) -> Finding:
    import httpx

    what = "listener http"
    if isinstance(listen, UnixListen):
        transport = httpx.HTTPTransport(uds=str(listen.path))
        url = "http://masd/healthz"
    else:
        transport = httpx.HTTPTransport()
        host = f"[{listen.host}]" if ":" in listen.host else listen.host
        url = f"http://{host}:{listen.port}/healthz"
    try:
        with httpx.Client(transport=transport, timeout=TIMEOUT) as client:
            response = client.get(url)
    except httpx.HTTPError as exc:
        return Finding(False, what, f"{listen}: {exc}")
    if response.status_code != 200:
        return Finding(False, what, f"{url} answered {response.status_code}: {response.text[:200]}")
    return Finding(True, what, f"{url} answered {response.text.strip()[:80]}")


def check_listeners(config: Config) -> list[Finding]:
    server = config.server
    found = [check_greets("listener lmtp", server.lmtp), check_http(server.http)]
    for name, listen in (("policy", server.policy), ("milter", server.milter)):
        if listen is not None:
            found.append(check_accepts(f"listener {name}", listen))
    return found


def peer_urls(config: Config) -> list[tuple[str, str]]:
    """(what, url) for every peer masd calls, in config order."""
    urls = []
    for domain in config.domains.values():
        for typ in domain.types.values():
            where = f"{domain.name} type {typ.name}"
            urls += [(f"peer {where} mode {m}", e.url) for m, e in typ.endpoints.items()]
            if typ.master is not None:
                urls.append((f"peer {where} master", typ.master.url))
            urls += [(f"peer {where} webhook", w.url) for w in typ.webhooks]
    return urls


def check_peer(what: str, url: str) -> Finding:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=TIMEOUT).close()
    except OSError as exc:
        return Finding(False, what, f"{url}: {exc.strerror or exc}")
    return Finding(True, what, f"{url} accepts connections")


def check_peers(config: Config) -> list[Finding]:
    relay: TcpListen = config.server.smtp_relay
    found = [check_greets("smtp relay", relay)]
    found += [check_peer(what, url) for what, url in peer_urls(config)]
    return found


# --------------------------------------------------------------------------- store and keys


def check_store(config: Config, messages: int) -> list[Finding]:
    database = config.server.database
    try:
        check_writable(database)
    except DoctorStoreError as exc:
        return [Finding(False, "store", exc.detail)]
    found = [Finding(True, "store", f"{database} is writable")]
    try:
        recent = recent_messages(database, messages)
    except DoctorStoreError as exc:
        return [*found, Finding(False, "authentication", exc.detail)]
    return [*found, trust_finding(summarize(recent), config.server.trusted_authserv_ids)]


def check_dkim(config: Config) -> list[Finding]:
    import dkim

    found = []
    for domain in config.domains.values():
        for key in domain.dkim_keys:
            what = f"dkim {domain.name} selector {key.selector}"
            try:
                data = key.key_file.read_bytes()
            except OSError as exc:
                found.append(Finding(False, what, f"{key.key_file}: {exc.strerror or exc}"))
                continue
            rsa = data.lstrip().startswith(b"-----BEGIN")
            try:
                dkim.sign(
                    b"From: doctor@" + domain.name.encode() + b"\r\n\r\ncheck\r\n",
                    key.selector.encode(),
                    domain.name.encode(),
                    data,
                    signature_algorithm=b"rsa-sha256" if rsa else b"ed25519-sha256",
                )
            except Exception as exc:  # noqa: BLE001 (dkimpy raises many kinds for a bad key)
                found.append(Finding(False, what, f"{key.key_file} does not sign: {exc}"))
                continue
            found.append(Finding(True, what, f"{key.key_file} is readable and signs"))
    return found


def diagnose(config: Config, *, messages: int = WINDOW) -> list[Finding]:
    """Every finding, in the order an operator reads them."""
    return [
        *check_listeners(config),
        *check_store(config, messages),
        *check_dkim(config),
        *check_peers(config),
    ]


def report(findings: Iterable[Finding]) -> tuple[str, bool]:
    """The text to print and whether everything was ok."""
    found = list(findings)
    lines = [f.line() for f in found]
    problems = sum(1 for f in found if not f.ok)
    lines.append(f"{problems} problem{'s' if problems != 1 else ''}" if problems else "no problems")
    return "\n".join(lines), problems == 0
