"""The one-screen summary ``masd check-config`` prints for a valid file."""

from __future__ import annotations

import json

from masd.config.model import Config, Signing, TypeConfig
from masd.config.values import format_duration


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _signed(signing: Signing) -> str:
    """How a peer's requests are signed (docs/protocol.md §9.8), or "" when they are not."""
    if not signing.keys:
        return ""
    count = len(signing.keys)
    must = "; its requests must be signed" if signing.required else ""
    return f"; signed with {count} secret{'s' if count != 1 else ''}{must}"


def format_summary(config: Config) -> str:
    """A one-screen summary of what ``config`` makes masd do (for ``check-config``)."""
    server = config.server
    lines = [
        f"{config.source}: OK",
        f"lmtp      {server.lmtp}",
        f"http      {server.http}  (public URL {server.public_url})",
        f"policy    {server.policy if server.policy is not None else 'off'}",
        f"milter    {server.milter if server.milter is not None else 'off'}",
        f"mcp       {server.mcp if server.mcp is not None else 'off'}",
        f"database  {server.database}",
        f"relay     {server.smtp_relay}  hostname {server.hostname}",
        "trusted   authserv-ids "
        + (", ".join(server.trusted_authserv_ids) or "none")
        + "; hosts "
        + (", ".join(server.trusted_hosts) or "none"),
        f"admin API {'on' if server.admin_token else 'off (no admin_token_file)'}"
        f"; retry for {format_duration(server.retry_for)}"
        f"; peer timeout {format_duration(server.peer_timeout)}"
        f"; max message {server.max_message_bytes} bytes"
        f"; delimiter {json.dumps(server.recipient_delimiter)}",
        f"console   {'on at ' + server.public_url + '/console/' if server.console else 'off'}",
    ]
    for domain in config.domains.values():
        selectors = ", ".join(key.selector for key in domain.dkim_keys)
        dkim = f"DKIM selector {selectors}" if selectors else "no DKIM"
        lines.append(f"domain {domain.name} ({dkim})")
        for tc in domain.types.values():
            lines.extend(_type_lines(tc))
    return "\n".join(lines)


def _type_lines(tc: TypeConfig) -> list[str]:
    cap = f"send cap {tc.send_cap.per_case}/case {tc.send_cap.per_recipient_per_day}/day"
    dmarc = f"dmarc for handoff {_yes(tc.require_dmarc_for_handoff)}"
    if tc.role != "master":
        master_url = tc.master.url if tc.master else "?"
        signed = _signed(tc.master.signing) if tc.master else ""
        lines = [
            f"  {tc.name}: slave, master {master_url}{signed}, {dmarc}, {cap}",
            f"    policy: autonomous_send {_yes(tc.policy.autonomous_send)}, "
            f"transfers {tc.policy.transfers}",
        ]
        for hook in tc.webhooks:
            lines.append(
                f"    webhook {hook.url}  fields {', '.join(hook.fields) or 'none'}"
                + _signed(hook.signing)
            )
        return lines
    lines = [
        f"  {tc.name}: master, ids {tc.id_prefix}<n>, acknowledge "
        f"{_yes(tc.acknowledge)}, {dmarc}, {cap}"
    ]
    if not tc.modes:
        lines.append("    no modes enabled")
    for mode in tc.modes:
        endpoint = tc.endpoints.get(mode)
        if endpoint is None:
            lines.append(f"    !{mode}: no endpoint (mode-unavailable)")
            continue
        lines.append(
            f"    !{mode} -> {endpoint.url}  deadline "
            f"{format_duration(endpoint.deadline)}, fields {', '.join(endpoint.fields) or 'none'}"
            + _signed(endpoint.signing)
        )
    return lines
