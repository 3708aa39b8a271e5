"""``masd doctor``: what an operator checks first, each finding naming what and why.

- the listeners answer (LMTP greets, HTTP ``/healthz`` says ok, policy and
  milter accept a connection);
- the store exists and can be written;
- of the last N messages, why each was or was not taken as from an
  authenticated, non-automated sender, counted by cause
  (:func:`masd.core.trust.trust_cause`, the account intake gives): no A-R
  from ``server.trusted_authserv_ids`` (and which ids came instead), our
  A-R without a dmarc result (the verifier skipped the mail), our A-R only
  below a host outside ``server.trusted_hosts``, a dmarc result other than
  pass, or automated mail;
- every DKIM key can be read and signs;
- the SMTP relay greets; every peer (mode endpoints, masters, webhooks)
  answers the probe of docs/protocol.md §9.9 (a message of no contract type,
  with masd's secret) with a refusal other than ``401``/``403``: the secret is
  accepted and the peer did nothing.

Its running counterpart is :class:`masd.service.trust_watch.TrustWatch`,
which warns while recent mail carries no trusted result.
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from masd.config import Config, Endpoint, Listen, MasterPeer, TcpListen, UnixListen, Webhook
from masd.core import signing, trust
from masd.core.event import build_event
from masd.core.times import rfc3339
from masd.core.trust import TrustCause, TrustSettings
from masd.service.trust_watch import WINDOW
from masd.store.probe import (
    DoctorStoreError,
    RecentMessage,
    check_writable,
    recent_messages,
    table_sizes,
)

#: Bound of every connection the doctor makes.
TIMEOUT: Final = 3.0
#: The ``type`` of the peer probe: no contract message has it (docs/protocol.md §9.9).
PROBE_TYPE: Final = "masd.probe"


@dataclass(frozen=True)
class Finding:
    ok: bool
    what: str
    why: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.what}: {self.why}"


# --------------------------------------------------------------------------- trust

#: The order causes are told in (masd.core.trust); dmarc-<result> ones follow.
_ORDER: Final = (
    trust.TRUSTED,
    trust.AUTOMATED,
    trust.NO_TRUSTED_AR,
    trust.NO_DMARC_RESULT,
    trust.BELOW_UNTRUSTED_HOST,
)
#: Causes that mean our verifier's dmarc result reached masd.
_RESULT_SEEN: Final = frozenset({trust.TRUSTED, trust.AUTOMATED})


def cause_of(message: RecentMessage, settings: TrustSettings) -> TrustCause:
    """The account intake gives of ``message`` (:func:`masd.core.event.build_event`),
    under today's settings."""
    mail = build_event(
        message.head,
        mail_from=message.mail_from,
        rcpt_to=message.rcpt_to,
        received_at=rfc3339(0) or "",
        message_ref="msg-doctor",
        trust=settings,
    )
    return mail.cause


@dataclass(frozen=True)
class TrustSummary:
    total: int
    #: (cause, how many messages) in the order told.
    causes: tuple[tuple[str, int], ...]
    #: The authserv-ids of the messages with no A-R from ours, how many carried each.
    other_ids: tuple[tuple[str, int], ...] = ()
    #: The hosts whose Received header hid our A-R, how many for each.
    hosts: tuple[tuple[str, int], ...] = ()
    #: What made the automated ones automated, how many for each.
    headers: tuple[tuple[str, int], ...] = ()

    def count(self, cause: str) -> int:
        return sum(n for c, n in self.causes if c == cause)


def summarize(causes: Sequence[TrustCause]) -> TrustSummary:
    """Each cause counted, with the ids, hosts and headers behind them."""
    counts = Counter(c.cause for c in causes)
    ids = Counter(i for c in causes if c.cause == trust.NO_TRUSTED_AR for i in c.authserv_ids)
    hosts = Counter(c.host for c in causes if c.host is not None)
    headers = Counter(_header_name(c.header) for c in causes if c.header is not None)
    order = [c for c in _ORDER if c in counts] + sorted(c for c in counts if c not in _ORDER)
    return TrustSummary(
        len(causes),
        tuple((c, counts[c]) for c in order),
        tuple(ids.most_common()),
        tuple(hosts.most_common()),
        tuple(headers.most_common()),
    )


def _header_name(reason: str) -> str:
    return reason.split(":", 1)[0]


def _listed(counts: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{name} ({n})" for name, n in counts)


def _cause_part(summary: TrustSummary, cause: str, n: int, ours: str) -> str:
    if cause == trust.TRUSTED:
        return f"{n} from an authenticated sender, not automated"
    if cause == trust.AUTOMATED:
        return f"{n} authenticated but automated: {_listed(summary.headers)}"
    if cause == trust.NO_TRUSTED_AR:
        carried = f" (they carried A-R from {_listed(summary.other_ids)})"
        return f"{n} had no A-R from {ours}{carried if summary.other_ids else ''}"
    if cause == trust.NO_DMARC_RESULT:
        return f"{n} had an A-R from {ours} without a dmarc= result: {trust.SKIPPED_HINT}"
    if cause == trust.BELOW_UNTRUSTED_HOST:
        return (
            f"{n} had an A-R from {ours} only below a Received by a host not in "
            f"server.trusted_hosts: {_listed(summary.hosts)}"
        )
    return f"{n} had {cause.replace('-', '=', 1)}"


def trust_finding(summary: TrustSummary, trusted_ids: Sequence[str]) -> Finding:
    """ "2 of 5 messages had a dmarc result from mx.help.example; 2 from an authenticated..."."""
    what = "authentication"
    ours = " or ".join(trusted_ids) or "(server.trusted_authserv_ids is empty)"
    if summary.total == 0:
        return Finding(True, what, "no messages recorded yet")
    seen = sum(n for c, n in summary.causes if c in _RESULT_SEEN or c.startswith("dmarc-"))
    text = f"{seen} of {summary.total} messages had a dmarc result from {ours}"
    text = "; ".join([text, *(_cause_part(summary, c, n, ours) for c, n in summary.causes)])
    if seen:
        return Finding(True, what, text)
    hint = "no mail can pass DMARC, so none is acknowledged or handed off"
    if summary.count(trust.NO_TRUSTED_AR) and summary.other_ids:
        hint += "; is the authserv-id your verifier writes in server.trusted_authserv_ids?"
    elif summary.count(trust.NO_TRUSTED_AR):
        hint += "; does a DMARC verifier run in front of masd?"
    elif summary.count(trust.BELOW_UNTRUSTED_HOST):
        hint += "; is every MTA of yours in server.trusted_hosts?"
    else:
        hint += "; send the test mail from another host than the MX"
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


@dataclass(frozen=True)
class PeerTarget:
    """A peer masd calls: what the finding names it, its URL, masd's secret and signing keys."""

    what: str
    url: str
    token: str = field(repr=False)
    keys: tuple[bytes, ...] = field(default=(), repr=False)
    #: The URL is a prefix (a transfers webhook's): the master names the URL under it.
    prefix: bool = False


def peer_targets(config: Config) -> list[PeerTarget]:
    """Every peer masd calls (mode endpoints, masters, webhooks), in config order."""
    found = []
    for domain in config.domains.values():
        for typ in domain.types.values():
            where = f"{domain.name} type {typ.name}"
            peers: list[tuple[str, Endpoint | MasterPeer | Webhook]] = [
                (f"peer {where} mode {m}", e) for m, e in typ.endpoints.items()
            ]
            if typ.master is not None:
                peers.append((f"peer {where} master", typ.master))
            peers += [(f"peer {where} webhook", w) for w in typ.webhooks]
            found += [
                PeerTarget(what, p.url, p.token, p.signing.keys, isinstance(p, Webhook))
                for what, p in peers
            ]
    return found


def probe_body() -> bytes:
    """The probe (docs/protocol.md §9.9): the envelope with a type no contract message has,
    so a peer can only refuse it, and no case, so there is nothing it could act on."""
    message = {
        "mas_modes_version": "0.1",
        "type": PROBE_TYPE,
        "id": f"probe-{secrets.token_hex(8)}",
    }
    return json.dumps(message).encode()


def check_peer(target: PeerTarget, *, now: float | None = None) -> Finding:
    """POST the probe with masd's secret (and signature): a wrong secret is ``401``/``403``."""
    import httpx

    what, url = target.what, target.url
    body = probe_body()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {target.token}"}
    if target.keys:
        msg_id = json.loads(body)["id"]
        stamp = int(time.time() if now is None else now)
        headers.update(signing.headers(target.keys, msg_id, stamp, body))
    try:
        with httpx.Client(timeout=TIMEOUT, follow_redirects=False, trust_env=False) as client:
            response = client.post(url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return Finding(False, what, f"{url}: {exc}")
    return _probe_finding(target, response.status_code, response.text)


def _probe_finding(target: PeerTarget, status: int, text: str) -> Finding:
    what, url = target.what, target.url
    error = _refusal_code(text)
    answered = f"{url} answered the probe {status}" + (f" {error}" if error else "")
    if status in (401, 403):
        return Finding(
            False,
            what,
            f"{answered}: the peer refuses masd's secret; is its token_file the peer's secret"
            " (and its signing_secret_file, if the peer checks signatures)?",
        )
    if 400 <= status < 500 and error:
        return Finding(True, what, f"{answered} (the secret is accepted)")
    if 400 <= status < 500 and target.prefix:
        return Finding(
            True,
            what,
            f"{answered}: it answers, and did not refuse the secret (a webhook URL is a prefix, "
            "under which the master names the one masd posts to)",
        )
    if 400 <= status < 500:
        return Finding(
            False, what, f"{answered} without a refusal body: is this the peer's contract URL?"
        )
    if 200 <= status < 300:
        return Finding(
            True,
            what,
            f"{answered}: the secret is accepted, but a message of no contract type was "
            "too (a conforming peer refuses it with a 4xx)",
        )
    return Finding(False, what, f"{answered}: {text.strip()[:200]}")


def _refusal_code(text: str) -> str | None:
    """The ``error`` of a contract refusal body ``{"ok": false, "error": ...}``, or None."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if isinstance(doc, dict) and doc.get("ok") is False and isinstance(doc.get("error"), str):
        return str(doc["error"])[:80]
    return None


def check_peers(config: Config) -> list[Finding]:
    relay: TcpListen = config.server.smtp_relay
    found = [check_greets("smtp relay", relay)]
    found += [check_peer(target) for target in peer_targets(config)]
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
    settings = TrustSettings.of(config.server.trusted_authserv_ids, config.server.trusted_hosts)
    causes = [cause_of(m, settings) for m in recent]
    return [*found, trust_finding(summarize(causes), config.server.trusted_authserv_ids)]


def check_tables(config: Config) -> list[Finding]:
    """How much each table of the store holds: rows, and bytes where cheap to tell."""
    database = config.server.database
    if not isinstance(database, Path) or not database.exists():
        return []
    try:
        sizes = table_sizes(database)
    except DoctorStoreError as exc:
        return [Finding(False, "store tables", exc.detail)]
    parts = [
        f"{t.name} {t.rows:,} rows" + ("" if t.bytes is None else f" ({_size(t.bytes)})")
        for t in sizes
    ]
    return [Finding(True, "store tables", ", ".join(parts) or "none")]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n //= 1024
    return f"{n:,} GiB"


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
        *check_tables(config),
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
