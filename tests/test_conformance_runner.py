"""The conformance runner (docs/protocol.md §19): the master suite, the flow loader, the matcher.

``test_master_suite_passes`` is the suite CI runs: ``masd conformance run
--role master`` as a subprocess, every flow against a real masd process.
The other tests pin the loader (a malformed flow is a named error naming
its key path), the matcher, the coverage table, and that the runner does
fail a flow when masd does something the flow did not state.
"""

from __future__ import annotations

import copy
import io
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support.postgres import postgres_server  # noqa: F401

from masd.conformance import coverage
from masd.conformance.flow import CLAUSES, FlowError, load_flow, load_flows, parse_flow
from masd.conformance.match import MatchError, get_path, match, substitute
from masd.conformance.runner import HANDLERS, apply_patch, command, standard_config, to_toml
from masd.conformance.steps import STEP_KINDS

ROOT = Path(__file__).resolve().parents[1]
FLOWS = ROOT / "conformance" / "flows"
SCHEMA = json.loads((FLOWS / "flow.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
MASTER_FILES = sorted((FLOWS / "master").glob("*.json"))
SLAVE_FILES = sorted((FLOWS / "slave").glob("*.json"))


# --------------------------------------------------------------------------- the suite


@pytest.fixture(params=["sqlite", "postgresql"])
def store_options(request: pytest.FixtureRequest) -> list[str]:
    """``masd conformance run`` options: each flow on its own SQLite file, or on a fresh
    database of the private PostgreSQL server (its unix socket: no password)."""
    if request.param == "sqlite":
        return []
    server = request.getfixturevalue("postgres_server")
    return ["--database", server.socket_uri()]


@pytest.mark.slow
def test_master_suite_passes(store_options: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "masd", "conformance", "run", "--role", "master", *store_options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    failed = [line for line in lines if line.startswith("FAIL")]
    assert not failed, "\n".join(failed)
    assert lines[-1] == f"{len(MASTER_FILES)} passed, 0 failed", proc.stdout + proc.stderr
    assert proc.returncode == 0
    assert sorted(line.removeprefix("PASS ") for line in lines[:-1]) == sorted(
        p.stem for p in MASTER_FILES
    )


def test_at_least_thirty_master_flows() -> None:
    assert len(MASTER_FILES) >= 30


@pytest.mark.slow
def test_slave_suite_passes(store_options: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "masd", "conformance", "run", "--role", "slave", *store_options],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr
    failed = [line for line in lines if line.startswith("FAIL")]
    assert not failed, "\n".join(failed)
    assert lines[-1] == f"{len(SLAVE_FILES)} passed, 0 failed", proc.stdout + proc.stderr
    assert proc.returncode == 0
    assert sorted(line.removeprefix("PASS ") for line in lines[:-1]) == sorted(
        p.stem for p in SLAVE_FILES
    )


def test_at_least_thirty_slave_flows() -> None:
    assert len(SLAVE_FILES) >= 30


# --------------------------------------------------------------------------- flows as data


@pytest.mark.parametrize("path", MASTER_FILES, ids=lambda p: p.stem)
def test_every_flow_loads_and_matches_the_schema(path: Path) -> None:
    data = json.loads(path.read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in VALIDATOR.iter_errors(data)]
    assert errors == []
    flow = load_flow(path)
    assert flow.name == path.stem
    assert flow.role == "master"


@pytest.mark.parametrize("path", SLAVE_FILES, ids=lambda p: p.stem)
def test_every_slave_flow_loads_and_matches_the_schema(path: Path) -> None:
    data = json.loads(path.read_text())
    errors = [f"{list(e.path)}: {e.message}" for e in VALIDATOR.iter_errors(data)]
    assert errors == []
    flow = load_flow(path)
    assert flow.name == path.stem
    assert flow.role == "slave"


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


MINIMAL: dict[str, Any] = {
    "name": "minimal",
    "role": "master",
    "covers": ["docs/protocol.md §3"],
    "description": "One mail.",
    "steps": [{"mail": {"to": "ticket@help.example"}}],
}


def _with(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


BAD_FLOWS = [
    (_with(name=None), "name", "is required"),
    (_with(name="Not A Name"), "name", "lowercase"),
    (_with(role="boss"), "role", "master or slave"),
    (_with(covers=["CONTRACT §9"]), "covers[0]", "not a clause"),
    (_with(covers=[]), "covers", "must not be empty"),
    (_with(clock="sundial"), "clock", "test or real"),
    (_with(steps=[]), "steps", "non-empty"),
    (_with(steps=[{"wait": "1s"}]), "steps[0]", "unknown step"),
    (_with(steps=[{"tick": "1s", "mail": {"to": "x@y"}}]), "steps[0]", "exactly one"),
    (_with(steps=[{"tick": "soon"}]), "steps[0].tick", "duration"),
    (_with(clock="real", steps=[{"tick": "1s"}]), "steps[0].tick", 'needs "clock": "test"'),
    (_with(steps=[{"mail": {}}]), "steps[0].mail", "needs rcpt"),
    (_with(steps=[{"mail": {"to": "a@b", "colour": "red"}}]), "steps[0].mail", "'colour'"),
    (
        _with(steps=[{"mail": {"rcpt": ["a@b", "c@d"], "replies": ["250"]}}]),
        "steps[0].mail.replies",
        "1 replies for 2 recipients",
    ),
    (
        _with(steps=[{"mail": {"to": "a@b", "replies": ["OK"]}}]),
        "steps[0].mail.replies[0]",
        "not a reply code",
    ),
    (_with(steps=[{"mail": {"again": "m9"}}]), "steps[0].mail.again", "no earlier mail"),
    (
        _with(steps=[{"expect": {"peer": "callback", "type": "x", "within": "forever"}}]),
        "steps[0].expect.within",
        "duration",
    ),
    (
        _with(steps=[{"expect": {"peer": "stranger", "type": "x"}}]),
        "steps[0].expect.peer",
        "not one of",
    ),
    (
        _with(steps=[{"post": {"peer": "callback", "message": {}}}]),
        "steps[0].post.status",
        "is required",
    ),
    (
        _with(steps=[{"post": {"peer": "callback", "status": 200}}]),
        "steps[0].post",
        "exactly one",
    ),
    (
        _with(steps=[{"post": {"peer": "callback", "status": 200, "message": {"x": "${hid}"}}}]),
        "steps[0]",
        "${hid} is used before",
    ),
    (
        _with(steps=[{"read": {"case": "k", "kinds": []}}]),
        "steps[0].read",
        "for a thread",
    ),
    (
        _with(steps=[{"relay": {"refuse": "250 fine"}}]),
        "steps[0].relay.refuse",
        "not a 4xx or 5xx",
    ),
    (
        _with(steps=[{"expect_mail": {"to": "a@b", "advance": "1s"}}], clock="real"),
        "steps[0].expect_mail.advance",
        "needs",
    ),
    (_with(config={"domains": {}}), "config", "'domains'"),
    (
        _with(steps=[{"expect": {"peer": "webhook", "type": "x", "path": "hook/"}}]),
        "steps[0].expect.path",
        "must start with /",
    ),
    (
        _with(
            steps=[{"post": {"peer": "master", "status": 200, "message": {"u": "${peer.x.port}"}}}]
        ),
        "steps[0]",
        "${peer.x.port} is used before",
    ),
]


@pytest.mark.parametrize(("data", "path", "words"), BAD_FLOWS, ids=[b[1] for b in BAD_FLOWS])
def test_a_malformed_flow_is_a_named_error(data: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(FlowError) as caught:
        parse_flow(data)
    assert caught.value.code == "bad-flow"
    assert caught.value.path == path
    assert words in caught.value.detail


def test_the_schema_refuses_what_the_schema_can_see() -> None:
    for data, path, _ in BAD_FLOWS:
        if "${" in json.dumps(data) or "again" in path or "replies" == path.rsplit(".", 1)[-1]:
            continue  # order of steps and counts: only the loader sees those
        if path.endswith("tick") and data.get("clock") == "real":
            continue
        if path.endswith("advance"):
            continue
        assert list(VALIDATOR.iter_errors(data)), f"the schema accepts a flow bad at {path}"
    assert list(VALIDATOR.iter_errors(MINIMAL)) == []


def test_load_flow_names_the_file_and_its_name_must_match(tmp_path: Path) -> None:
    folder = tmp_path / "master"
    folder.mkdir()
    (folder / "other-name.json").write_text(json.dumps(MINIMAL))
    with pytest.raises(FlowError) as caught:
        load_flow(folder / "other-name.json")
    assert str(caught.value).startswith(f"{folder / 'other-name.json'}: name: ")
    (folder / "broken.json").write_text("{not json")
    with pytest.raises(FlowError, match="not JSON"):
        load_flow(folder / "broken.json")
    slave = tmp_path / "slave"
    slave.mkdir()
    (slave / "minimal.json").write_text(json.dumps(MINIMAL))
    with pytest.raises(FlowError, match="a master flow in the slave/ folder"):
        load_flow(slave / "minimal.json")


# --------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("expected", "actual", "diff"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, None),
        ({"a": {"b": "x"}}, {"a": {"b": "x", "c": 1}}, None),
        ({"a": 1}, {"a": 2}, "a: expected 1, got 2"),
        ({"a": 1}, {"b": 1}, "a: missing"),
        ({"a": True}, {"a": 1}, "a: expected true, got 1"),
        ({"a": 1}, {"a": 1.0}, None),
        ([1, 2], [1, 2, 3], "expected 2 elements, got 3"),
        ({"a": [{"k": 1}]}, {"a": [{"k": 1, "z": 0}]}, None),
        ({"a": {"$absent": True}}, {"b": 1}, None),
        ({"a": {"$absent": True}}, {"a": None}, "a: expected no such key"),
        ({"a": {"$any": True}}, {"a": None}, None),
        ({"a": {"$any": True}}, {}, "a: missing"),
        ({"a": {"$regex": "^[0-9a-f]{4}$"}}, {"a": "beef"}, None),
        ({"a": {"$regex": "^[0-9a-f]{4}$"}}, {"a": "BEEF!"}, "a: expected text matching"),
        ({"a": {"$contains": "ell"}}, {"a": "hello"}, None),
        ({"a": {"$contains": {"k": 1}}}, {"a": [{"k": 2}, {"k": 1, "j": 0}]}, None),
        ({"a": {"$contains": 3}}, {"a": [1, 2]}, "a: expected a list with an element 3"),
        ({"a": {"$len": 2}}, {"a": [0, 0]}, None),
        ({"$exact": {"a": 1}}, {"a": 1, "b": 2}, "(value).b: not expected (exact)"),
        ({"$exact": {"a": {"$any": True}}}, {"a": 5}, None),
        ({"$exact": {"a": {"b": 1}}}, {"a": {"b": 1, "c": 2}}, "(value).a.c: not expected"),
        ({"a": {"$nope": 1}}, {"a": 1}, "a: unknown operator $nope"),
    ],
)
def test_match(expected: Any, actual: Any, diff: str | None) -> None:
    got = match(expected, actual)
    if diff is None:
        assert got is None
    else:
        assert got is not None
        assert diff in got


def test_substitute_whole_values_and_text() -> None:
    values = {"case": {"address": "a", "key": "k"}, "n": 3, "id": "h1"}
    out = substitute(
        {"case": "${case}", "seq": "${n}", "text": "id=${id} n=${n}", "list": ["${id}"]},
        values.__getitem__,
    )
    assert out == {"case": values["case"], "seq": 3, "text": "id=h1 n=3", "list": ["h1"]}


def test_get_path() -> None:
    doc = {"case": {"handoffs": [{"handoff_id": "h"}]}}
    assert get_path(doc, "case.handoffs.0.handoff_id") == "h"
    assert get_path(doc, "$") == doc
    with pytest.raises(MatchError, match="no 'x'"):
        get_path(doc, "case.x")


# --------------------------------------------------------------------------- configuration


def test_every_kind_of_step_has_a_handler() -> None:
    assert sorted(HANDLERS) == sorted(STEP_KINDS)
    used = {step.kind for path in MASTER_FILES + SLAVE_FILES for step in load_flow(path).steps}
    assert used == set(STEP_KINDS)


def test_standard_config_round_trips_through_toml() -> None:
    urls = {p: f"http://127.0.0.1:9/{p}" for p in ("callback", "sms", "master", "other")}
    urls["webhook"] = "http://127.0.0.1:9/hook/"
    config = standard_config(lmtp_port=1, http_port=2, smtp_port=3, peer_urls=urls)
    patched = apply_patch(
        config,
        {
            "server": {"retry_for": "2h"},
            "types": {"ticket": {"send_cap": {"per_case": 2}, "endpoints": {"sms": None}}},
        },
    )
    assert tomllib.loads(to_toml(patched)) == patched
    ticket = patched["domains"]["help.example"]["types"]["ticket"]
    assert ticket["send_cap"] == {"per_case": 2}
    assert set(ticket["endpoints"]) == {"callback"}
    assert patched["server"]["retry_for"] == "2h"
    assert config["server"]["retry_for"] == "1h"  # the template is not changed


# --------------------------------------------------------------------------- coverage


def test_coverage_table_in_readme_is_the_flows_covers() -> None:
    readme = (ROOT / "conformance" / "README.md").read_text()
    m = re.search(
        re.escape(coverage.BEGIN) + r"\n(.*?)" + re.escape(coverage.END), readme, re.DOTALL
    )
    assert m is not None, "conformance/README.md has no coverage table markers"
    assert m.group(1) == coverage.table(load_flows(FLOWS)), (
        "regenerate with: masd conformance coverage"
    )


def test_no_slave_clause_without_a_slave_flow() -> None:
    assert coverage.gaps(load_flows(FLOWS, "slave"), "slave") == []


def test_peer_ports_are_built_in_variables() -> None:
    flow = parse_flow(
        _with(
            steps=[
                {
                    "post": {
                        "peer": "master",
                        "status": 400,
                        "message": {"url": "http://127.0.0.1:${peer.webhook.port}/hook/"},
                    }
                }
            ]
        )
    )
    assert flow.steps[0].kind == "post"


def test_no_master_clause_without_a_master_flow() -> None:
    assert coverage.gaps(load_flows(FLOWS, "master"), "master") == []
    listed = {c.id for c in CLAUSES}
    # The contract's parties, status machine, message types and Principle 10, and every
    # section of the protocol document from addresses to the slave role.
    assert {f"docs/protocol.md §{n}" for n in ("7", "14", "8", "4.4")} <= listed
    assert {f"docs/protocol.md §{n}" for n in range(2, 14) if n not in (7, 8, 11)} <= listed


# --------------------------------------------------------------------------- the runner fails


def _flows_dir(tmp_path: Path, *flows: dict[str, Any]) -> Path:
    folder = tmp_path / "flows" / "master"
    folder.mkdir(parents=True)
    for flow in flows:
        (folder / f"{flow['name']}.json").write_text(json.dumps(flow))
    return tmp_path / "flows"


def _run(flows_dir: Path, *extra: str) -> tuple[int, list[str], str]:
    out, err = io.StringIO(), io.StringIO()
    code = command(
        role="master",
        names=list(extra),
        target=None,
        flows_dir=flows_dir,
        keep=None,
        verbose=False,
        out=out,
        err=err,
    )
    return code, out.getvalue().splitlines(), err.getvalue()


@pytest.mark.slow
def test_runner_reports_the_step_that_differed_and_unclaimed_mail(tmp_path: Path) -> None:
    wrong_sender = {
        **MINIMAL,
        "name": "wrong-sender",
        "steps": [
            {"mail": {"to": "ticket@help.example"}},
            {"expect_mail": {"to": "ann@example.org", "from": "ticket=ticket-9@help.example"}},
        ],
    }
    unclaimed = {**MINIMAL, "name": "unclaimed-mail"}
    fine = {
        **MINIMAL,
        "name": "fine",
        "steps": [
            {"mail": {"to": "ticket@help.example"}},
            {"expect_mail": {"to": "ann@example.org", "from": "ticket=ticket-1@help.example"}},
        ],
    }
    code, lines, _ = _run(_flows_dir(tmp_path, wrong_sender, unclaimed, fine))
    assert code == 1
    assert lines[0] == "PASS fine"
    assert lines[1].startswith("FAIL unclaimed-mail: after the last step: unexpected mail to ")
    assert lines[2].startswith("FAIL wrong-sender: step 2 (expect_mail): no mail to ann@")
    differed = "From: expected ticket=ticket-9@help.example, got ticket=ticket-1@help.example"
    assert differed in lines[2]
    assert lines[3] == "1 passed, 2 failed"


def test_runner_usage_errors_exit_2(tmp_path: Path) -> None:
    flows = _flows_dir(tmp_path, MINIMAL)
    code, lines, err = _run(flows, "no-such-flow")
    assert (code, lines) == (2, [])
    assert "no flow 'no-such-flow'" in err
    (flows / "master" / "bad.json").write_text(json.dumps({**MINIMAL, "name": "bad", "steps": []}))
    code, lines, err = _run(flows)
    assert (code, lines) == (2, [])
    assert "bad.json: steps: must be a non-empty list" in err
    code, lines, err = _run(tmp_path / "nowhere")
    assert (code, lines) == (2, [])
    assert "no flows" in err


@pytest.mark.slow
def test_runner_checks_the_path_and_knows_peer_ports(tmp_path: Path) -> None:
    folder = tmp_path / "flows" / "slave"
    folder.mkdir(parents=True)
    base = {"role": "slave", "covers": ["docs/protocol.md §13.1"], "description": "One intake."}
    right = {
        **base,
        "name": "right-path",
        "steps": [
            {"mail": {"to": "case@help.example"}},
            {
                "expect": {
                    "peer": "master",
                    "type": "case.intake",
                    "path": "/mas",
                    "capture": {"ref": "intake_ref"},
                }
            },
            {
                "post": {
                    "peer": "master",
                    "message": {
                        "type": "case.assign",
                        "intake_ref": "${ref}",
                        "resource_id": "crm-1",
                        "policy": {
                            "transfers": {
                                "webhook": "http://127.0.0.1:${peer.webhook.port}/hook/crm/1"
                            }
                        },
                    },
                    "status": 200,
                }
            },
        ],
    }
    wrong = {
        **base,
        "name": "wrong-path",
        "steps": [
            {"mail": {"to": "case@help.example"}},
            {
                "expect": {
                    "peer": "master",
                    "type": "case.intake",
                    "path": "/elsewhere",
                    "within": "1s",
                }
            },
        ],
    }
    for flow in (right, wrong):
        (folder / f"{flow['name']}.json").write_text(json.dumps(flow))
    out, err = io.StringIO(), io.StringIO()
    code = command(
        role="slave",
        names=[],
        target=None,
        flows_dir=tmp_path / "flows",
        keep=None,
        verbose=False,
        out=out,
        err=err,
    )
    lines = out.getvalue().splitlines()
    assert code == 1, err.getvalue()
    assert lines[0] == "PASS right-path"
    assert lines[1].startswith("FAIL wrong-path: step 2 (expect): no case.intake to master")
    assert "path: expected /elsewhere, got /mas" in lines[1]
    assert lines[2] == "1 passed, 1 failed"
