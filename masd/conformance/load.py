"""Reading flow files: JSON in, a checked :class:`~masd.conformance.steps.Flow` out.

Beyond ``conformance/flows/flow.schema.json`` it checks what a schema cannot:
the name equals the file's stem, every ``covers`` entry is a clause, a
``tick`` only on the test clock, and every ``${name}`` is defined before it is
used.  Every fault is a :class:`FlowError` naming the key path
(``steps[3].expect.within``) and why.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from masd.conformance.clauses import CLAUSE_IDS
from masd.conformance.steps import (
    BUILTINS,
    PEERS,
    POSTERS,
    STEP_KINDS,
    Action,
    Answer,
    Auth,
    ExpectMailStep,
    ExpectStep,
    Flow,
    FlowError,
    MailStep,
    NothingStep,
    PostStep,
    ReadStep,
    RelayStep,
    ReleaseStep,
    RestartStep,
    Step,
    TickStep,
    parse_duration,
)

__all__ = ["load_flow", "load_flows", "parse_flow"]

_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,79}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_VAR_REF = re.compile(r"\$\{([^}]*)\}")
_REPLY = re.compile(r"[2-5]\d\d( [245]\.\d{1,3}\.\d{1,3})?")


class _Obj:
    """A JSON object being read: typed getters that name the path, and unknown keys refused."""

    def __init__(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise FlowError(f"must be an object, not {_kind(value)}", path=path)
        self.data: dict[str, Any] = value
        self.path = path
        self.used: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def req(self, key: str) -> Any:
        if key not in self.data:
            raise FlowError("is required", path=self.at(key))
        return self.raw(key)

    def text(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        if required:
            self.req(key)
        value = self.raw(key, default)
        if value is not None and not isinstance(value, str):
            raise FlowError(f"must be a string, not {_kind(value)}", path=self.at(key))
        return value

    def nullable_str(self, key: str) -> tuple[bool, str | None]:
        """(present, value): a key that may be given as null on purpose."""
        present = key in self.data
        value = self.raw(key)
        if value is not None and not isinstance(value, str):
            raise FlowError(f"must be a string or null, not {_kind(value)}", path=self.at(key))
        return present, value

    def integer(
        self, key: str, default: int | None = None, *, low: int = 0, high: int = 10**9
    ) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise FlowError(f"must be an integer, not {_kind(value)}", path=self.at(key))
        if not low <= value <= high:
            raise FlowError(f"{value} is not from {low} to {high}", path=self.at(key))
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise FlowError(f"must be true or false, not {_kind(value)}", path=self.at(key))
        return value

    def strs(self, key: str, *, nonempty: bool = False) -> tuple[str, ...]:
        value = self.raw(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise FlowError("must be a list of strings", path=self.at(key))
        if nonempty and not value:
            raise FlowError("must not be empty", path=self.at(key))
        return tuple(value)

    def duration(self, key: str, default: str) -> float:
        text = self.text(key, default)
        assert text is not None
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise FlowError(str(exc), path=self.at(key)) from None

    def obj(self, key: str) -> _Obj:
        return _Obj(self.raw(key, {}), self.at(key))

    def captures(self, key: str = "capture") -> dict[str, str]:
        value = self.raw(key, {})
        if not isinstance(value, dict):
            raise FlowError("must be an object of name: path", path=self.at(key))
        for name, where in value.items():
            if not _VAR_NAME.fullmatch(name):
                raise FlowError(f"{name!r} is not a variable name", path=self.at(key))
            if not isinstance(where, str) or not where:
                raise FlowError(f"{name}: must be a non-empty string", path=self.at(key))
        return dict(value)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise FlowError(f"unknown key {unknown[0]!r}", path=self.path or "(top)")


def _kind(value: Any) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _peer(o: _Obj, key: str, allowed: Iterable[str]) -> str:
    name = o.text(key, required=True)
    assert name is not None
    choices = tuple(allowed)
    if name not in choices:
        raise FlowError(f"{name!r} is not one of {', '.join(choices)}", path=o.at(key))
    return name


def _answer(value: Any, path: str) -> Answer | None:
    """``200``, ``"hold"`` or ``{"status": 503, "body": {...}}``."""
    if value == "hold":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        status = value
        body: Any = None
    else:
        o = _Obj(value, path)
        status = o.integer("status", low=100, high=599)
        body = o.raw("body")
        o.done()
    if not 200 <= status <= 599:
        raise FlowError(f"{status} is not an HTTP status from 200 to 599", path=path)
    if body is None:
        body = (
            {"ok": True}
            if status < 300
            else {"ok": False, "error": "refused", "detail": "refused by the flow"}
        )
    return Answer(status, body)


def _mail(o: _Obj) -> MailStep:
    again = o.text("again")
    rcpt: tuple[str, ...] = ()
    if o.has("rcpt") and o.has("to"):
        raise FlowError("give rcpt or to, not both", path=o.path)
    if o.has("rcpt"):
        rcpt = o.strs("rcpt", nonempty=True)
    elif o.has("to"):
        to = o.text("to")
        assert to is not None
        rcpt = (to,)
    elif again is None:
        raise FlowError("needs rcpt (a list) or to (one recipient)", path=o.path)
    auth = _auth(o)
    trace: tuple[tuple[str, str], ...] | None = None
    if o.has("trace"):
        trace = _pairs(o.raw("trace"), o.at("trace"))
    headers = _mail_headers(o.obj("headers"))
    present, message_id = o.nullable_str("message_id")
    replies = _replies(o, rcpt)
    step = MailStep(
        rcpt=rcpt,
        sender=o.text("from", "ann@example.org") or "",
        mail_from=o.text("mail_from"),
        to_header=o.text("to_header"),
        subject=o.nullable_str("subject")[1] if o.has("subject") else "Help, please",
        body=o.text("body", "Hello.\n") or "",
        body_repeat=o.integer("body_repeat", 1, low=1, high=10_000_000),
        auth=auth,
        trace=trace,
        headers=headers,
        message_id=message_id,
        no_message_id=present and message_id is None,
        in_reply_to=o.text("in_reply_to"),
        save_as=o.text("as"),
        again=again,
        replies=replies,
    )
    if step.save_as is not None and not _VAR_NAME.fullmatch(step.save_as):
        raise FlowError(f"{step.save_as!r} is not a variable name", path=o.at("as"))
    return step


def _auth(o: _Obj) -> Auth | None:
    """``auth``: "pass", "fail", "none" or {authserv_id, dmarc, header_from}."""
    given = o.raw("auth", "pass")
    if given in ("pass", "fail"):
        return Auth("mx.help.example", str(given))
    if given == "none":
        return None
    if isinstance(given, dict):
        a = _Obj(given, o.at("auth"))
        auth = Auth(
            a.text("authserv_id", "mx.help.example") or "",
            a.text("dmarc", "pass") or "",
            a.text("header_from"),
        )
        a.done()
        return auth
    raise FlowError(
        'must be "pass", "fail", "none" or {authserv_id, dmarc, header_from}',
        path=o.at("auth"),
    )


def _mail_headers(extra: _Obj) -> tuple[tuple[str, str], ...]:
    """``headers``: name to a value or a list of values, as (name, value) pairs."""
    headers: list[tuple[str, str]] = []
    for name in list(extra.data):
        value = extra.raw(name)
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in values):
            raise FlowError("must be a string or a list of strings", path=extra.at(name))
        headers += [(name, v) for v in values]
    return tuple(headers)


def _replies(o: _Obj, rcpt: tuple[str, ...]) -> tuple[str, ...] | None:
    """``replies``: one reply code per recipient (None: 250 for each)."""
    if not o.has("replies"):
        return None
    replies = o.strs("replies")
    for i, reply in enumerate(replies):
        if not _REPLY.fullmatch(reply):
            raise FlowError(
                f'{reply!r} is not a reply code like "250" or "550 5.1.1"',
                path=f"{o.at('replies')}[{i}]",
            )
    if rcpt and len(replies) != len(rcpt):
        raise FlowError(f"{len(replies)} replies for {len(rcpt)} recipients", path=o.at("replies"))
    return replies


def _pairs(value: Any, path: str) -> tuple[tuple[str, str], ...]:
    ok = isinstance(value, list) and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in value
    )
    if not ok:
        raise FlowError('must be a list of ["Name", "value"] pairs', path=path)
    return tuple((p[0], p[1]) for p in value)


def _post(o: _Obj) -> PostStep:
    peer = _peer(o, "peer", POSTERS)
    if o.has("message") == o.has("raw"):
        raise FlowError("give message (a JSON object) or raw (text), exactly one", path=o.path)
    headers: list[tuple[str, str | None]] = []
    h = o.obj("headers")
    for name in list(h.data):
        value = h.raw(name)
        if value is not None and not isinstance(value, str):
            raise FlowError("must be a string, or null to leave it out", path=h.at(name))
        headers.append((name, value))
    message = o.raw("message")
    if o.has("message") and not isinstance(message, dict):
        raise FlowError("must be an object", path=o.at("message"))
    path = o.text("path", "/mas/v0.1/messages") or ""
    if not path.startswith("/"):
        raise FlowError("must start with /", path=o.at("path"))
    return PostStep(
        peer=peer,
        status=o.integer("status", low=100, high=599) if o.has("status") else _missing(o, "status"),
        message=message,
        raw=o.text("raw"),
        repeat=o.integer("repeat", 1, low=1, high=10_000_000),
        envelope=o.flag("envelope", True),
        headers=tuple(headers),
        path=path,
        body=o.raw("body"),
        capture=o.captures(),
    )


def _missing(o: _Obj, key: str) -> Any:
    raise FlowError("is required", path=o.at(key))


def _expect(o: _Obj) -> ExpectStep:
    fields = o.raw("fields", {})
    if not isinstance(fields, dict):
        raise FlowError("must be an object (a subset of the message)", path=o.at("fields"))
    mtype = o.text("type", required=True)
    assert mtype is not None
    path = o.text("path")
    if path is not None and not path.startswith("/"):
        raise FlowError("must start with /", path=o.at("path"))
    return ExpectStep(
        peer=_peer(o, "peer", PEERS),
        type=mtype,
        fields=fields,
        capture=o.captures(),
        answer=_answer(o.raw("answer", 200), o.at("answer")),
        within=o.duration("within", "5s"),
        advance=o.duration("advance", "0s") if o.has("advance") else None,
        path=path,
    )


def _release(o: _Obj) -> ReleaseStep:
    answer = _answer(o.raw("answer", 200), o.at("answer"))
    if answer is None:
        raise FlowError("a release must answer", path=o.at("answer"))
    return ReleaseStep(peer=_peer(o, "peer", PEERS), answer=answer)


def _expect_mail(o: _Obj) -> ExpectMailStep:
    headers = o.raw("headers", {})
    if not isinstance(headers, dict):
        raise FlowError("must be an object of header: value", path=o.at("headers"))
    return ExpectMailStep(
        to=o.text("to"),
        sender=o.text("from"),
        headers=headers,
        absent_headers=o.strs("absent_headers"),
        body_contains=o.strs("body_contains"),
        body_lines=o.strs("body_lines"),
        body_lacks=o.strs("body_lacks"),
        capture=o.captures(),
        within=o.duration("within", "5s"),
        advance=o.duration("advance", "0s") if o.has("advance") else None,
    )


def _read(o: _Obj) -> ReadStep:
    if o.has("case") == o.has("thread"):
        raise FlowError("give case (the case) or thread (its thread), exactly one", path=o.path)
    key = o.text("case") or o.text("thread")
    assert key is not None
    thread = o.has("thread")
    if not thread and (o.has("kinds") or o.has("entries")):
        raise FlowError("kinds and entries are for a thread", path=o.path)
    if thread and o.has("match"):
        raise FlowError("match is for a case; a thread has kinds and entries", path=o.path)
    entries = o.raw("entries")
    if entries is not None and not isinstance(entries, list):
        raise FlowError("must be a list", path=o.at("entries"))
    return ReadStep(
        case=key,
        thread=thread,
        status=o.integer("status", 200, low=100, high=599),
        match=o.raw("match"),
        kinds=o.strs("kinds") if o.has("kinds") else None,
        entries=tuple(entries) if entries is not None else None,
        within=o.duration("within", "5s"),
    )


def _relay(o: _Obj) -> RelayStep:
    refuse = o.text("refuse")
    down = o.raw("down")
    if (refuse is None) == (down is None):
        raise FlowError("give refuse (a reply) or down (true or false), exactly one", path=o.path)
    if down is not None and not isinstance(down, bool):
        raise FlowError("must be true or false", path=o.at("down"))
    if refuse is not None and not re.fullmatch(r"[45]\d\d .*", refuse):
        raise FlowError(f"{refuse!r} is not a 4xx or 5xx reply", path=o.at("refuse"))
    at = o.text("at", "DATA")
    if at not in ("DATA", "RCPT"):
        raise FlowError(f"{at!r} is not DATA or RCPT", path=o.at("at"))
    return RelayStep(
        refuse=refuse,
        count=o.integer("count", 1, low=1, high=100),
        at="RCPT" if at == "RCPT" else "DATA",
        down=down,
    )


def _step(value: Any, path: str, clock: str) -> Step:
    o = _Obj(value, path)
    note = o.text("note", "") or ""
    kinds = [k for k in o.data if k != "note"]
    if len(kinds) != 1:
        raise FlowError(
            f"a step has exactly one of {', '.join(STEP_KINDS)} (got {sorted(kinds) or 'none'})",
            path=path,
        )
    kind = kinds[0]
    inner = o.raw(kind)
    where = o.at(kind)
    action: Action
    if kind in ("expect_nothing", "tick"):
        if not isinstance(inner, str):
            raise FlowError('must be a duration like "1s"', path=where)
        try:
            seconds = parse_duration(inner)
        except ValueError as exc:
            raise FlowError(str(exc), path=where) from None
        if kind == "tick":
            if clock != "test":
                raise FlowError('tick needs "clock": "test"', path=where)
            action = TickStep(seconds)
        else:
            action = NothingStep(seconds)
    else:
        builders: dict[str, Callable[[_Obj], Action]] = {
            "mail": _mail,
            "post": _post,
            "expect": _expect,
            "release": _release,
            "expect_mail": _expect_mail,
            "read": _read,
            "relay": _relay,
            "restart": lambda x: RestartStep(kill=x.flag("kill", False)),
        }
        if kind not in builders:
            raise FlowError(f"unknown step {kind!r}", path=path)
        sub = _Obj(inner, where)
        action = builders[kind](sub)
        sub.done()
        if getattr(action, "advance", None) is not None and clock != "test":
            raise FlowError('advance needs "clock": "test"', path=sub.at("advance"))
    o.done()
    return Step(kind, action, note)


def _config(o: _Obj) -> dict[str, Any]:
    """``config``: ``server`` and ``types`` patches of the runner's standard configuration."""
    for key in ("server", "types"):
        if o.has(key):
            o.obj(key)  # must be an object
            o.raw(key)
    o.done()
    return dict(o.data)


def _references(value: Any) -> Iterator[str]:
    """Every ``${name}`` inside a JSON value."""
    if isinstance(value, str):
        yield from _VAR_REF.findall(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _references(k)
            yield from _references(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _references(v)


def _check_variables(steps: Iterable[tuple[Any, Step]]) -> None:
    defined: set[str] = set(BUILTINS)
    for i, (raw, step) in enumerate(steps):
        for name in _references(raw):
            if name not in defined:
                raise FlowError(
                    f"${{{name}}} is used before any step defines it",
                    path=f"steps[{i}]",
                )
        action = step.action
        if isinstance(action, PostStep | ExpectStep | ExpectMailStep):
            defined |= set(action.capture)
        if isinstance(action, MailStep) and action.save_as:
            defined.add(f"{action.save_as}.message_id")


def parse_flow(data: Any, *, path: Path | None = None) -> Flow:
    """A flow from its decoded JSON; ``path`` (if given) must be ``<name>.json``."""
    o = _Obj(data, "")
    name = o.text("name", required=True) or ""
    if not _NAME.fullmatch(name):
        raise FlowError(f"{name!r} is not lowercase letters, digits and -", path="name")
    if path is not None and path.stem != name:
        raise FlowError(f"{name!r} is not the file's name {path.stem!r}", path="name")
    role = o.text("role", required=True)
    if role not in ("master", "slave"):
        raise FlowError(f"{role!r} is not master or slave", path="role")
    if path is not None and path.parent.name in ("master", "slave") and path.parent.name != role:
        raise FlowError(f"a {role} flow in the {path.parent.name}/ folder", path="role")
    covers = o.strs("covers", nonempty=True)
    for i, clause in enumerate(covers):
        if clause not in CLAUSE_IDS:
            raise FlowError(
                f"{clause!r} is not a clause "
                '(like "docs/protocol.md §11.2" or "docs/protocol.md §12")',
                path=f"covers[{i}]",
            )
    description = o.text("description", required=True) or ""
    clock = o.text("clock", "test")
    if clock not in ("test", "real"):
        raise FlowError(f"{clock!r} is not test or real", path="clock")
    config = _config(o.obj("config"))
    raw_steps = o.raw("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise FlowError("must be a non-empty list of steps", path="steps")
    steps = [_step(s, f"steps[{i}]", clock) for i, s in enumerate(raw_steps)]
    _check_variables(zip(raw_steps, steps, strict=True))
    _check_saved(steps)
    o.done()
    return Flow(
        name=name,
        role="master" if role == "master" else "slave",
        covers=covers,
        description=description,
        clock="test" if clock == "test" else "real",
        config=config,
        steps=tuple(steps),
        path=path,
    )


def _check_saved(steps: list[Step]) -> None:
    saved: set[str] = set()
    for i, step in enumerate(steps):
        action = step.action
        if isinstance(action, MailStep):
            if action.again is not None and action.again not in saved:
                raise FlowError(
                    f"no earlier mail step has as: {action.again!r}", path=f"steps[{i}].mail.again"
                )
            if action.save_as:
                saved.add(action.save_as)


def load_flow(path: Path) -> Flow:
    """Read and check one flow file; :class:`FlowError` names the file and the key."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FlowError(f"cannot read: {exc.strerror}", file=str(path)) from None
    except ValueError as exc:
        raise FlowError(f"not JSON: {exc}", file=str(path)) from None
    try:
        return parse_flow(data, path=path)
    except FlowError as exc:
        exc.file = str(path)
        raise


def load_flows(directory: Path, role: str | None = None) -> list[Flow]:
    """Every flow under ``directory/<role>/`` (both roles when None), sorted by role and name."""
    roles = [role] if role else ["master", "slave"]
    flows: list[Flow] = []
    for r in roles:
        folder = directory / r
        if folder.is_dir():
            flows += [load_flow(p) for p in sorted(folder.glob("*.json"))]
    return flows
