"""``[domains.D.types.T]``: one resource type, in the master or the slave role."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from masd.config.checker import Checker
from masd.config.model import Endpoint, MasterPeer, Policy, SendCap, TypeConfig, Webhook
from masd.config.names import (
    FIELD_NAME,
    ID_CHARS,
    ID_DIGITS_ROOM,
    MODE_NAME,
    TYPE_ID_MAX,
    did_you_mean,
    join,
    show,
)
from masd.config.signing import SIGNING_KEYS, parse_signing
from masd.config.values import url_problem, webhook_among

ROLES: Final = ("master", "slave")
_COMMON_TYPE_KEYS: Final = frozenset({"role", "require_dmarc_for_handoff", "send_cap", "retain"})
#: How long a case is kept after its last thread entry, by default (docs/protocol.md §18).
DEFAULT_RETAIN: Final = "400d"
# Keys that belong to one role only, with the reason they are wrong in the other.
_MASTER_ONLY: Final = {
    "modes": "modes do not apply to slave types, docs/protocol.md §13",
    "endpoints": "a slave type hands off to the webhook its case policy names",
    "acknowledge": "in the slave role email mails only on mail.send or under autonomous_send",
    "id_prefix": "in the slave role case ids come from the master's case.assign",
}
_SLAVE_ONLY: Final = {
    "master": "in the master role email owns the case",
    "policy": "case policy comes from an outside master, in the slave role",
    "webhooks": "a master type hands off to its endpoints",
}
_TYPE_KEYS: Final = _COMMON_TYPE_KEYS | frozenset(_MASTER_ONLY) | frozenset(_SLAVE_ONLY)
_ROLE_KEYS: Final = {
    "master": _COMMON_TYPE_KEYS | frozenset(_MASTER_ONLY),
    "slave": _COMMON_TYPE_KEYS | frozenset(_SLAVE_ONLY),
}
_SEND_CAP_KEYS: Final = frozenset({"per_case", "per_recipient_per_day"})
_ENDPOINT_KEYS: Final = frozenset({"url", "token_file", "deadline", "fields"}) | SIGNING_KEYS
_MASTER_KEYS: Final = frozenset({"url", "token_file"}) | SIGNING_KEYS
_POLICY_KEYS: Final = frozenset({"autonomous_send", "transfers"})
_WEBHOOK_KEYS: Final = frozenset({"url", "token_file", "fields"}) | SIGNING_KEYS


@dataclass
class _MasterSide:
    """What a master type configures beyond the common keys."""

    modes: tuple[str, ...] = ()
    id_prefix: str = ""
    acknowledge: bool = True
    endpoints: dict[str, Endpoint] = field(default_factory=dict)


def parse_type(check: Checker, domain: str, name: str, raw: object, path: str) -> TypeConfig:
    written_role = raw.get("role") if isinstance(raw, dict) else None
    table = check.table(raw, path, _TYPE_KEYS, suggest=_ROLE_KEYS.get(str(written_role)))
    role = check.require(table, path, "role", str, "")
    if isinstance(table.get("role"), str) and role not in ROLES:
        hint = did_you_mean(table["role"], ROLES, quote=True)
        check.error(join(path, "role"), f'{show(table["role"])} is not "master" or "slave"{hint}')
    wrong_here = _SLAVE_ONLY if role == "master" else _MASTER_ONLY if role == "slave" else {}
    for key, why in wrong_here.items():
        if key in table:
            check.error(join(path, key), f"not allowed in a {role} type ({why})")

    # docs/protocol.md §4: "type option require_dmarc_for_handoff, default true".
    dmarc = check.get(table, path, "require_dmarc_for_handoff", bool, True)
    send_cap = _parse_send_cap(check, table, path)
    retain = check.duration(
        join(path, "retain"), check.get(table, path, "retain", str, DEFAULT_RETAIN)
    )

    # A role missing or misspelt is one error; every other key present is
    # still checked by its own rules, so the operator sees all errors at once.
    side = _MasterSide(id_prefix=f"{name}-")
    if role != "slave":
        side = _parse_master_side(check, table, path, domain, name, warn=role == "master")
    master: MasterPeer | None = None
    webhooks: tuple[Webhook, ...] = ()
    policy = Policy()
    if role != "master":
        master = _parse_master(check, table, path, domain, name, required=role == "slave")
        webhooks = _parse_webhooks(check, table, path, domain, name)
        policy = _parse_policy(check, table, path, webhooks)

    return TypeConfig(
        name=name,
        role=role,
        modes=side.modes,
        id_prefix=side.id_prefix,
        acknowledge=side.acknowledge,
        require_dmarc_for_handoff=dmarc,
        send_cap=send_cap,
        endpoints=MappingProxyType(side.endpoints),
        master=master,
        policy=policy,
        webhooks=webhooks,
        retain=retain,
    )


def _parse_master_side(
    check: Checker, table: Mapping[str, Any], path: str, domain: str, name: str, *, warn: bool
) -> _MasterSide:
    modes = check.strings(table, path, "modes", _mode_checker(check))
    side = _MasterSide(
        modes=modes,
        id_prefix=_parse_id_prefix(check, table, path, name),
        acknowledge=check.get(table, path, "acknowledge", bool, True),
    )
    endpoints_path = join(path, "endpoints")
    for key, endpoint_raw in check.get(table, path, "endpoints", dict, {}).items():
        endpoint_path = join(endpoints_path, key)
        mode = _mode_checker(check)(endpoint_path, key)
        if mode is None:
            continue
        if mode in side.endpoints:
            check.error(endpoint_path, f"{show(key)} is the endpoint for {mode} again")
            continue
        if mode not in modes:
            # An endpoint for a mode the statute does not enable could never
            # be used: docs/protocol.md §4 refuses such a request with mode-not-enabled.
            check.error(
                endpoint_path,
                f"{show(key)} is not in modes, so this endpoint could never be used (a "
                "handoff to it is refused with mode-not-enabled, docs/protocol.md §4)"
                + did_you_mean(mode, modes, quote=True),
            )
            continue
        side.endpoints[mode] = _parse_endpoint(
            check, domain, name, mode, endpoint_raw, endpoint_path
        )
    for mode in modes:
        if warn and mode not in side.endpoints:
            check.warn(
                join(path, "modes"),
                f"{show(mode)} has no endpoint: a handoff to it is refused with "
                "mode-unavailable (docs/protocol.md §4)",
            )
    return side


def _mode_checker(check: Checker) -> Callable[[str, str], str | None]:
    def mode(path: str, text: str) -> str | None:
        if not MODE_NAME.fullmatch(text):
            check.error(
                path,
                f"{show(text)} is not a mode name (a letter, then up to 15 letters, "
                "digits or hyphens; docs/protocol.md §2)",
            )
            return None
        return text.lower()

    return mode


def _field_checker(check: Checker) -> Callable[[str, str], str | None]:
    def field_name(path: str, text: str) -> str | None:
        if not FIELD_NAME.fullmatch(text):
            check.error(
                path, f"{show(text)} is not a field name (letters, digits, - and _; up to 64)"
            )
            return None
        if text.lower() == "subject":
            # docs/protocol.md §6: details hold "subject and each field of the endpoint's fields".
            check.error(path, '"subject" is always in the details; it is not a field')
            return None
        return text.lower()

    return field_name


def _parse_id_prefix(check: Checker, table: Mapping[str, Any], path: str, name: str) -> str:
    # docs/protocol.md §2: "email assigns ids <id_prefix><n> (id_prefix default <type>-)".
    default = f"{name}-"
    prefix = check.get(table, path, "id_prefix", str, default)
    if prefix == default:
        return prefix
    where = join(path, "id_prefix")
    # id = 1*64(ALPHA / DIGIT / "-" / "_" / "."), no leading or doubled ".".
    if not ID_CHARS.fullmatch(prefix) or prefix.startswith(".") or ".." in prefix:
        check.error(
            where,
            f"{show(prefix)} is not made of id characters (letters, digits, -, _ and "
            "inner single dots; docs/protocol.md §2)",
        )
    elif len(name) + 1 + len(prefix) + ID_DIGITS_ROOM > TYPE_ID_MAX:
        # Keep "type=id" within the 47 octets that leave room for "!mode" of
        # the longest mode name inside the 64-octet local part.
        check.error(
            where,
            f"{show(prefix)} is too long: {name}={prefix} and a {ID_DIGITS_ROOM}-digit "
            f"number must fit in {TYPE_ID_MAX} octets (docs/protocol.md §2)",
        )
    return prefix


def _parse_send_cap(check: Checker, table: Mapping[str, Any], path: str) -> SendCap:
    if "send_cap" not in table:
        return SendCap()
    cap_path = join(path, "send_cap")
    cap = check.table(table["send_cap"], cap_path, _SEND_CAP_KEYS)
    values = []
    for key, default in (("per_case", 20), ("per_recipient_per_day", 10)):
        value = check.get(cap, cap_path, key, int, default)
        if value <= 0:
            check.error(join(cap_path, key), f"{value} is not a positive integer")
        values.append(value)
    return SendCap(per_case=values[0], per_recipient_per_day=values[1])


def _parse_endpoint(
    check: Checker, domain: str, type_name: str, mode: str, raw: object, path: str
) -> Endpoint:
    table = check.table(raw, path, _ENDPOINT_KEYS)
    url, token, deadline = "", "", 1.0
    if isinstance(raw, dict):
        url = check.require_url(table, path, "url")
        token_file = check.require(table, path, "token_file", str, "")
        if isinstance(table.get("token_file"), str):
            token = check.secret(join(path, "token_file"), token_file, kind="mode", url=url)
        deadline_text = check.require(table, path, "deadline", str, "")
        if isinstance(table.get("deadline"), str):
            deadline = check.duration(join(path, "deadline"), deadline_text)
    fields = check.strings(table, path, "fields", _field_checker(check))
    return Endpoint(
        domain=domain,
        type=type_name,
        mode=mode,
        url=url,
        token=token,
        deadline=deadline,
        fields=fields,
        signing=parse_signing(check, table, path),
    )


def _parse_master(
    check: Checker,
    table: Mapping[str, Any],
    path: str,
    domain: str,
    type_name: str,
    *,
    required: bool,
) -> MasterPeer | None:
    master_path = join(path, "master")
    if "master" not in table:
        if required:
            check.error(master_path, "missing: a slave type needs its master ({url, token_file})")
        return None
    raw = table["master"]
    peer = check.table(raw, master_path, _MASTER_KEYS)
    if not isinstance(raw, dict):
        return None
    url = check.require_url(peer, master_path, "url")
    token_file = check.require(peer, master_path, "token_file", str, "")
    token = ""
    if isinstance(peer.get("token_file"), str):
        token = check.secret(join(master_path, "token_file"), token_file, kind="master", url=url)
    signed = parse_signing(check, peer, master_path)
    return MasterPeer(domain=domain, type=type_name, url=url, token=token, signing=signed)


def _parse_webhooks(
    check: Checker, table: Mapping[str, Any], path: str, domain: str, type_name: str
) -> tuple[Webhook, ...]:
    hooks: list[Webhook] = []
    for index, raw in enumerate(check.get(table, path, "webhooks", list, [])):
        hook_path = f"{join(path, 'webhooks')}[{index}]"
        hook = check.table(raw, hook_path, _WEBHOOK_KEYS)
        if not isinstance(raw, dict):
            continue
        url = check.require_url(hook, hook_path, "url")
        token_file = check.require(hook, hook_path, "token_file", str, "")
        token = ""
        if isinstance(hook.get("token_file"), str):
            token = check.secret(join(hook_path, "token_file"), token_file, kind="webhook", url=url)
        fields = check.strings(hook, hook_path, "fields", _field_checker(check))
        signed = parse_signing(check, hook, hook_path)
        hooks.append(
            Webhook(
                domain=domain, type=type_name, url=url, token=token, fields=fields, signing=signed
            )
        )
    return tuple(hooks)


def _parse_policy(
    check: Checker, table: Mapping[str, Any], path: str, webhooks: tuple[Webhook, ...]
) -> Policy:
    # docs/protocol.md §13: "A case starts with the type's policy defaults, overridden by
    # case.assign.policy"; the defaults are {autonomous_send=false, transfers="block"}.
    if "policy" not in table:
        return Policy()
    policy_path = join(path, "policy")
    policy = check.table(table["policy"], policy_path, _POLICY_KEYS)
    autonomous = check.get(policy, policy_path, "autonomous_send", bool, False)
    transfers = "block"
    where = join(policy_path, "transfers")
    raw = policy.get("transfers", "block")
    if isinstance(raw, dict):
        target = check.table(raw, where, frozenset({"webhook"}))
        url = check.require(target, where, "webhook", str, "")
        if isinstance(target.get("webhook"), str):
            url_path = join(where, "webhook")
            if url_problem(url) is not None:
                check.url(url_path, url)
            elif webhook_among(webhooks, url) is None:
                check.error(
                    url_path,
                    f"{show(url)} is not under any webhooks url (same scheme, host and "
                    "port, and a path under its path; docs/protocol.md §18)",
                )
            transfers = url
    elif raw != "block":
        hint = did_you_mean(raw, ["block"], quote=True)
        check.error(where, f'{show(raw)} is not "block" or {{webhook = URL}}{hint}')
    return Policy(autonomous_send=autonomous, transfers=transfers)
