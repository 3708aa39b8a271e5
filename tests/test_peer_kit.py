"""The peer conformance kit (docs/protocol.md §19.1) against the demo's peers and mutants.

The demo's callback service and CRM (masd/demo/peers.py) pass every check;
each mutant breaks one rule and the kit fails it, naming the check.  All
over real loopback sockets: the peer listens, the kit posts to it and
listens for its posts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from masd.conformance.peer import Kit, KitOptions, load_checks
from masd.conformance.peer.load import CheckError, parse_check
from masd.demo import peers as demo_peers
from masd.demo.peers import CallbackService, Crm, CrmCase, Handoff
from masd.demo.stage import Stage
from masd.testing.client import MasdClient
from masd.testing.net import free_port
from masd.testing.peers import Answer, Recorded

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ROOT / "conformance" / "peer"
PHONE = {"phone": "+1 555 0100"}


@pytest.fixture(autouse=True)
def quick_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's callback service posts its statuses 20 ms apart, not 200."""
    monkeypatch.setattr(demo_peers, "STEP_SECONDS", 0.02)


Peer = CallbackService | Crm


async def kit_run(
    peer: Peer,
    role: str,
    *,
    names: tuple[str, ...] = (),
    listen_port: int = 0,
    signing_keys: tuple[bytes, ...] = (),
) -> tuple[int, str]:
    """Start ``peer``, run the kit's checks of ``role`` against it: (exit code, output)."""
    url = await peer.start()
    options = KitOptions(
        role=role,
        target=url,
        token=peer.token,
        wait=5.0,
        quiet=0.3,
        listen=("127.0.0.1", listen_port),
        resource_type="case",
        details=PHONE,
        signing_keys=signing_keys,
    )
    kit = Kit(options)
    client: MasdClient | None = None
    try:
        listening = await kit.start()
        client = MasdClient(listening.split("/mas/")[0])
        peer.masd = client
        checks = load_checks(CHECKS, role)
        if names:
            checks = [c for c in checks if c.name in names]
        out = io.StringIO()
        code = await kit.run(checks, out)
        return code, out.getvalue()
    finally:
        await kit.close()
        await peer.stop()
        if client is not None:
            await client.aclose()


def run(make: Callable[[Stage, str], Peer], role: str, **kw: Any) -> tuple[int, str]:
    async def main() -> tuple[int, str]:
        return await kit_run(make(Stage(io.StringIO()), secrets.token_hex(16)), role, **kw)

    return asyncio.run(main())


def lines_of(output: str) -> dict[str, str]:
    """Each check's line by its name (``PASS name (...)`` / ``FAIL name (...)``)."""
    found = {}
    for line in output.splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("PASS", "FAIL"):
            found[rest.split(" ", 1)[0]] = line
    return found


def only_failure(output: str) -> str:
    failed = [line for line in lines_of(output).values() if line.startswith("FAIL")]
    assert len(failed) == 1, output
    return failed[0]


# ---------------------------------------------------------------- the demo's peers pass


def test_the_demo_callback_service_passes_every_mode_check() -> None:
    code, output = run(CallbackService, "mode")
    assert code == 0, output
    lines = lines_of(output)
    assert sorted(lines) == sorted(c.name for c in load_checks(CHECKS, "mode"))
    assert all(line.startswith("PASS") for line in lines.values()), output
    assert "PASS statuses-follow-the-table (docs/protocol.md §14): " in output
    assert "seq 1 scheduled, seq 2 running, seq 3 completed" in lines["seq-increases"]
    assert output.endswith(f"{len(lines)} passed, 0 failed\n")


def test_the_demo_crm_passes_every_master_check() -> None:
    def crm(stage: Stage, token: str) -> Crm:
        return Crm(stage, token)

    code, output = run(crm, "master")
    assert code == 0, output
    lines = lines_of(output)
    assert sorted(lines) == sorted(c.name for c in load_checks(CHECKS, "master"))
    assert 'case.assign resource_id "CRM-1001"' in lines["intake-assigned"]
    assert "mail.send in_reply_to" in lines["mail-send-answers-a-recorded-message"]
    assert output.endswith(f"{len(lines)} passed, 0 failed\n")


# ---------------------------------------------------------------- mode mutants fail


class SeqGoesBack(CallbackService):
    """Posts ``running`` with a seq lower than the ``scheduled`` before it."""

    async def _post(self, handoff: Handoff, status: str, **fields: Any) -> None:
        if status == "running":
            handoff.seq -= 2
        await super()._post(handoff, status, **fields)


class SendsTimedOut(CallbackService):
    """Ends a handoff with ``timed-out``, which only the timeout owner records."""

    async def _post(self, handoff: Handoff, status: str, **fields: Any) -> None:
        await super()._post(handoff, "timed-out" if status == "completed" else status, **fields)


class RunsARepeatAgain(CallbackService):
    """Starts a new run for a repeated handoff.request instead of treating it as done."""

    def _on(self, message: dict[str, Any]) -> Answer:
        if message.get("type") == "handoff.request":
            self.handoffs.pop(str(message.get("handoff_id")), None)
        return super()._on(message)


class AnySecret(CallbackService):
    """Takes any Bearer secret, or none."""

    async def _answer(self, rec: Recorded) -> Answer:
        headers = {**rec.headers, "authorization": f"Bearer {self.token}"}
        return await super()._answer(dataclasses.replace(rec, headers=headers))


def test_a_mode_whose_seq_goes_back_fails_seq_increases() -> None:
    code, output = run(SeqGoesBack, "mode", names=("seq-increases", "request-answered"))
    assert code == 1
    line = only_failure(output)
    assert line.startswith("FAIL seq-increases (docs/protocol.md §7.3): step 3 (expect): ")
    assert "seq 0 came after seq 1" in line
    assert output.endswith("1 passed, 1 failed\n")


def test_a_mode_that_sends_timed_out_fails_the_status_table() -> None:
    code, output = run(SendsTimedOut, "mode", names=("statuses-follow-the-table", "seq-increases"))
    assert code == 1
    line = only_failure(output)
    assert line.startswith("FAIL statuses-follow-the-table (docs/protocol.md §14): ")
    assert '"timed-out" is recorded only by the timeout owner, not by mode' in line
    assert "seq 3 timed-out" in line


def test_a_mode_that_runs_a_repeat_twice_fails_repeated_id_is_done() -> None:
    """Named by the request's id and the two statuses' ids, not as "seq 1 came after seq 1"."""
    code, output = run(RunsARepeatAgain, "mode", names=("repeated-id-is-done", "seq-increases"))
    assert code == 1
    line = only_failure(output)
    assert line.startswith("FAIL repeated-id-is-done (docs/protocol.md §7.2): step 4 (expect): ")
    assert "repeat-is-done: the handoff.request sent again with id " in line
    assert "was run again: seq 1 scheduled came a second time (status ids " in line
    assert "came after seq 1" not in line


class PostsASeqTwice(CallbackService):
    """Posts ``running`` with the seq of the ``scheduled`` before it."""

    async def _post(self, handoff: Handoff, status: str, **fields: Any) -> None:
        if status == "running":
            handoff.seq -= 1
        await super()._post(handoff, status, **fields)


def test_a_seq_posted_twice_is_named_so() -> None:
    code, output = run(PostsASeqTwice, "mode", names=("seq-increases",))
    assert code == 1
    line = only_failure(output)
    assert "seq 1 came twice, in status ids " in line
    assert "came after" not in line


class DropsTheCaseKey(CallbackService):
    """Posts its statuses with a ``case`` that has its address but no key."""

    async def _post(self, handoff: Handoff, status: str, **fields: Any) -> None:
        address = handoff.request["case"]["address"]
        handoff.request = {**handoff.request, "case": {"address": address}}
        await super()._post(handoff, status, **fields)


def test_a_status_without_case_key_is_a_problem_with_case_key() -> None:
    code, output = run(DropsTheCaseKey, "mode", names=("statuses-well-formed",))
    assert code == 1
    line = only_failure(output)
    assert "invalid-message: case.key: missing, not a string" in line, line
    assert "case.address" not in line


def test_a_mode_without_authentication_fails_wrong_secret_refused() -> None:
    code, output = run(AnySecret, "mode", names=("wrong-secret-refused", "request-answered"))
    assert code == 1
    line = only_failure(output)
    assert line.startswith("FAIL wrong-secret-refused (docs/protocol.md §9.2): step 1 (send): ")
    assert "handoff.request answered 200" in line
    assert "expected 401 unauthenticated" in line


# ---------------------------------------------------------------- master mutants fail


class AssignsARepeatAgain(Crm):
    """Processes a repeated case.intake again: a second case.assign."""

    def _on(self, message: dict[str, Any]) -> Answer:
        self._seen.discard(str(message.get("id")))
        return super()._on(message)


class CrmAnySecret(Crm):
    async def _answer(self, rec: Recorded) -> Answer:
        headers = {**rec.headers, "authorization": f"Bearer {self.token}"}
        return await super()._answer(dataclasses.replace(rec, headers=headers))


class RepliesToNothing(Crm):
    """Sends mail.send in reply to a message_ref it made up."""

    async def _mail(self, case: CrmCase, body: str) -> None:
        await self._post("mail.send", case, in_reply_to="made-up-ref", body=body)


@pytest.mark.parametrize(
    ("mutant", "check", "says"),
    [
        (AssignsARepeatAgain, "repeated-id-is-done", "2 case.assign for one intake, not 1"),
        (CrmAnySecret, "wrong-secret-refused", "expected 401 unauthenticated"),
        (
            RepliesToNothing,
            "mail-send-answers-a-recorded-message",
            'in_reply_to "made-up-ref" is not the message_ref of a message the kit sent',
        ),
    ],
)
def test_a_master_mutant_fails_the_check_it_breaks(
    mutant: type[Crm], check: str, says: str
) -> None:
    code, output = run(mutant, "master", names=(check, "intake-assigned"))
    assert code == 1
    line = only_failure(output)
    assert line.startswith(f"FAIL {check} (docs/protocol.md §")
    assert says in line
    assert lines_of(output)["intake-assigned"].startswith("PASS")


# ---------------------------------------------------------------- signed requests


def test_the_kit_signs_its_requests_with_the_secrets_it_is_given() -> None:
    from test_signing import documented_verify, new_secret

    from masd.core import signing

    verify, secret = documented_verify(), new_secret()

    class MustSign(CallbackService):
        async def _answer(self, rec: Recorded) -> Answer:
            if not verify([secret], rec.headers, rec.body, int(time.time())):
                return 401, {"ok": False, "error": "unauthenticated", "detail": "signature"}
            return await super()._answer(rec)

    keys = (signing.parse_secret(secret),)
    code, output = run(MustSign, "mode", names=("seq-increases",), signing_keys=keys)
    assert code == 0, output
    code, output = run(MustSign, "mode", names=("seq-increases",))
    assert code == 1
    assert "handoff.request answered 401" in output
    assert "expected a 2xx" in output


# ---------------------------------------------------------------- the command line


def test_the_command_runs_the_kit_and_exits_by_the_result(tmp_path: Path) -> None:
    async def main() -> tuple[int, str, int, str]:
        good = CallbackService(Stage(io.StringIO()), secrets.token_hex(16))
        bad = AnySecret(Stage(io.StringIO()), secrets.token_hex(16))
        results = []
        for service in (good, bad):
            url = await service.start()
            service.masd = MasdClient("http://127.0.0.1:9")  # status_url is absolute
            token = tmp_path / "peer.token"
            token.write_text(service.token + "\n")
            argv = ["conformance", "peer", "mode", "--target", url, "--token-file", str(token)]
            argv += ["--detail", "phone=+1 555 0100", "--wait", "5", "--check"]
            argv += ["wrong-secret-refused", "--check", "statuses-follow-the-table"]
            results.append(await masd_command(argv))
            await service.stop()
            assert service.masd is not None
            await service.masd.aclose()
        return (*results[0], *results[1])

    good_code, good_out, bad_code, bad_out = asyncio.run(main())
    assert good_code == 0, good_out
    assert good_out.endswith("2 passed, 0 failed\n")
    assert bad_code == 1, bad_out
    assert "FAIL wrong-secret-refused (docs/protocol.md §9.2)" in bad_out
    assert bad_out.endswith("1 passed, 1 failed\n")


def test_the_master_command_listens_where_it_is_told(tmp_path: Path) -> None:
    async def main() -> tuple[int, str]:
        crm = Crm(Stage(io.StringIO()), secrets.token_hex(16))
        url = await crm.start()
        port = free_port()
        crm.masd = MasdClient(f"http://127.0.0.1:{port}")
        token = tmp_path / "crm.token"
        token.write_text(crm.token + "\n")
        argv = ["conformance", "peer", "master", "--target", url, "--token-file", str(token)]
        argv += ["--listen", f"127.0.0.1:{port}", "--wait", "5", "--check", "intake-assigned"]
        try:
            return await masd_command(argv)
        finally:
            await crm.stop()
            await crm.masd.aclose()

    code, output = asyncio.run(main())
    assert code == 0, output
    assert output.startswith("PASS intake-assigned (docs/protocol.md §13.1): ")


async def masd_command(argv: list[str]) -> tuple[int, str]:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "masd",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await child.communicate()
    return await child.wait(), out.decode()


# ---------------------------------------------------------------- the checks as data


def test_every_check_file_loads_and_names_a_section_of_the_protocol_document() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    for role in ("mode", "master"):
        for check in load_checks(CHECKS, role):
            number = check.clause.removeprefix("docs/protocol.md §")
            assert f"\n## {number}. " in text or f"\n### {number} " in text, check.clause


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"name": "x", "role": "slave"}, "role: 'slave'"),
        ({"role": "mode"}, "name: missing"),
        ({"name": "x", "role": "mode", "clause": "§14"}, "clause: '§14'"),
        ({"steps": [{"send": {"message": "case.intake", "answer": "accepted"}}]}, "steps[0].send"),
        ({"steps": [{"expect": {"rule": "no-status", "for": "req"}}]}, "not the name of an"),
        ({"steps": [{"send": {"message": "handoff.update", "answer": "accepted"}}]}, "needs the"),
        ({"steps": [{"wait": 1}]}, "'wait' is not send, collect or expect"),
        ({"steps": [{"collect": {"for": "r", "until": "assign"}}]}, "steps[0].collect"),
    ],
)
def test_a_bad_check_is_refused_naming_the_key(raw: dict[str, Any], says: str) -> None:
    base: dict[str, Any] = {
        "name": "x",
        "role": "mode",
        "clause": "docs/protocol.md §14",
        "description": "d",
        "steps": [{"send": {"message": "handoff.request", "as": "r", "answer": "accepted"}}],
    }
    if "name" not in raw and "role" in raw:
        del base["name"]
    with pytest.raises(CheckError, match=None) as caught:
        parse_check({**base, **raw})
    assert says in caught.value.detail
