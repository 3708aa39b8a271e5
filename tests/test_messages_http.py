"""The mail itself over real sockets against a running masd (docs/protocol.md §16.8-§16.9):
a message's record, its raw bytes, its attachments (whole, HEAD, one Range, several, past
the end), the intake list and a resend; and the commands that print the same."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.masd_process import wait_until
from support.readers import Readers, attached, running

from masd.testing.process import child_env

PDF = b"%PDF-1.4\n" + bytes(range(256)) * 40


def cli(r: Readers, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "masd", *args, "--config", str(r.setup.config)],
        capture_output=True,
        env=child_env(this_masd=True),
        timeout=60,
        check=False,
    )


async def opened(r: Readers, data: bytes) -> dict[str, Any]:
    return await r.intake(r.crm, "case@help.example", data)


def message_path(ref: str, tail: str = "") -> str:
    return f"/mas/v0.1/messages/{ref}{tail}"


async def check_message_doc(r: Readers, data: bytes) -> None:
    intake = await opened(r, data)
    ref = intake["event"]["message_ref"]
    doc = (await r.get(message_path(ref), "crm")).json()["message"]
    assert set(doc) == {
        "message_ref",
        "case",
        "intake_ref",
        "received_at",
        "size",
        "sha256",
        "event",
    }
    assert (doc["message_ref"], doc["case"], doc["intake_ref"]) == (ref, None, intake["intake_ref"])
    assert (doc["size"], doc["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
    assert doc["event"] == intake["event"]
    await r.assign(r.setup.master_token, intake["intake_ref"], "c-7")
    doc = (await r.get(message_path(ref), "crm")).json()["message"]
    assert doc["case"] == {"address": "case=c-7@help.example", "key": "case=c-7@help.example"}
    missing = await r.get(message_path("msg-0000"), "admin")
    assert (missing.status_code, missing.json()["error"]) == (404, "unknown-message")


async def check_raw(r: Readers, data: bytes) -> str:
    ref = (await opened(r, data))["event"]["message_ref"]
    raw = await r.get(message_path(ref, "/raw"), "crm")
    assert raw.status_code == 200
    assert raw.content == data
    assert raw.headers["content-type"] == "message/rfc822"
    assert raw.headers["etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    part = await r.get(message_path(ref, "/raw"), "crm", headers={"Range": "bytes=10-19"})
    assert (part.status_code, part.content) == (206, data[10:20])
    assert part.headers["content-range"] == f"bytes 10-19/{len(data)}"
    again = await r.get(
        message_path(ref, "/raw"), "crm", headers={"If-None-Match": raw.headers["etag"]}
    )
    assert (again.status_code, again.content) == (304, b"")
    # RFC 9110 §13.1.2: weak comparison, a list, and "*" (the message exists).
    etag = raw.headers["etag"]
    for tags in (f"W/{etag}", f'"nope", W/{etag}', "*", f'"x" ,{etag}'):
        again = await r.get(message_path(ref, "/raw"), "crm", headers={"If-None-Match": tags})
        assert (again.status_code, again.content) == (304, b""), tags
        assert again.headers["etag"] == etag
    for tags in ('"nope"', "W/" + etag[:-2] + 'x"', ""):
        again = await r.get(message_path(ref, "/raw"), "crm", headers={"If-None-Match": tags})
        assert (again.status_code, again.content) == (200, data), tags
    # If-Range compares strongly: a weak tag gets the whole body.
    weak = {"Range": "bytes=10-19", "If-Range": f"W/{etag}"}
    whole = await r.get(message_path(ref, "/raw"), "crm", headers=weak)
    assert (whole.status_code, whole.content) == (200, data)
    return ref


async def check_attachment(r: Readers) -> None:
    data = attached("case@help.example", "file", PDF, filename='Überweisung "Q3".pdf')
    ref = (await opened(r, data))["event"]["message_ref"]
    path = message_path(ref, "/attachments/0")
    whole = await r.get(path, "crm")
    sha = hashlib.sha256(PDF).hexdigest()
    assert (whole.status_code, whole.content) == (200, PDF)
    assert whole.headers["content-type"] == "application/pdf"
    assert whole.headers["etag"] == f'"{sha}"'
    assert whole.headers["x-content-type-options"] == "nosniff"
    assert whole.headers["content-disposition"] == (
        'attachment; filename="_berweisung _Q3_.pdf"; '
        "filename*=UTF-8''%C3%9Cberweisung%20%22Q3%22.pdf"
    )
    head = await r.http.head(path, headers={"Authorization": f"Bearer {r.setup.master_token}"})
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-length"] == str(len(PDF))
    ranged = await r.get(path, "crm", headers={"Range": "bytes=100-"})
    assert (ranged.status_code, ranged.content) == (206, PDF[100:])
    assert ranged.headers["content-range"] == f"bytes 100-{len(PDF) - 1}/{len(PDF)}"
    suffix = await r.get(path, "crm", headers={"Range": "bytes=-5"})
    assert (suffix.status_code, suffix.content) == (206, PDF[-5:])
    several = await r.get(path, "crm", headers={"Range": "bytes=0-1,5-9"})
    assert (several.status_code, several.content) == (200, PDF)
    past = await r.get(path, "crm", headers={"Range": f"bytes={len(PDF)}-"})
    assert (past.status_code, past.json()["error"]) == (416, "range-not-satisfiable")
    assert past.headers["content-range"] == f"bytes */{len(PDF)}"
    for n in ("1", "x", "-1", "99999999999"):
        none = await r.get(message_path(ref, f"/attachments/{n}"), "crm")
        assert (none.status_code, none.json()["error"]) == (404, "unknown-message"), n


async def check_intakes_and_resend(r: Readers) -> None:
    pending = (await r.get("/mas/v0.1/intakes", "crm", params={"state": "pending"})).json()
    assert [i["case"] for i in pending["intakes"]] == [None] * len(pending["intakes"])
    assigned = (await r.get("/mas/v0.1/intakes", "crm", params={"state": "assigned"})).json()
    assert [i["case"]["key"] for i in assigned["intakes"]] == ["case=c-7@help.example"]
    item = assigned["intakes"][0]
    assert set(item) == {
        "intake_ref",
        "domain",
        "type",
        "message_ref",
        "requested_mode",
        "created_at",
        "assigned_at",
        "case",
    }
    # Page by page, oldest first, each once.
    seen, after = [], "i0"
    while True:
        page = await r.get("/mas/v0.1/intakes", "crm", params={"after": after, "limit": 1})
        body = page.json()
        if not body["intakes"]:
            break
        seen += [i["intake_ref"] for i in body["intakes"]]
        after = body["next"]
    everything = (await r.get("/mas/v0.1/intakes", "crm")).json()["intakes"]
    assert seen == [i["intake_ref"] for i in everything]
    assert len(seen) == len(pending["intakes"]) + 1
    # The master lost one: it is sent again under a fresh id.
    lost = pending["intakes"][0]
    before = [m.json for m in r.crm.requests if m.json]
    first = next(m for m in before if m.get("intake_ref") == lost["intake_ref"])
    resent = cli(r, "intake", "resend", lost["intake_ref"])
    assert resent.returncode == 0, resent.stderr
    await wait_until(lambda: len(r.crm.requests) > len(before), "case.intake again")
    again = r.crm.requests[-1].json
    assert again is not None
    assert again["id"] != first["id"]
    assert {k: v for k, v in again.items() if k != "id"} == {
        k: v for k, v in first.items() if k != "id"
    }
    refused = cli(r, "intake", "resend", item["intake_ref"])
    assert refused.returncode == 1
    assert b"wrong-state" in refused.stderr
    unknown = await r.http.post(
        "/mas/v0.1/intakes/intake-nope/resend",
        headers={"Authorization": f"Bearer {r.setup.admin_token}"},
    )
    assert (unknown.status_code, unknown.json()["error"]) == (404, "unknown-intake")
    listed = cli(r, "intake", "list")
    assert listed.returncode == 0, listed.stderr
    assert lost["intake_ref"].encode() in listed.stdout


def check_commands(r: Readers, ref: str, data: bytes, tmp_path: Path) -> None:
    shown = cli(r, "message", "show", ref)
    assert shown.returncode == 0, shown.stderr
    assert b'subject "raw one"' in shown.stdout
    assert b"| Hello there." in shown.stdout
    raw = cli(r, "message", "show", ref, "--raw")
    assert raw.stdout == data
    as_json = json.loads(cli(r, "message", "show", ref, "--json").stdout)
    assert as_json["message"]["message_ref"] == ref
    case = cli(r, "case", "show", "case=c-7@help.example")
    assert case.returncode == 0, case.stderr
    assert b"| See the file." in case.stdout


def check_attachment_command(r: Readers, tmp_path: Path) -> None:
    intakes = json.loads(cli(r, "intake", "list", "--state", "pending", "--json").stdout)
    refs = [i["message_ref"] for i in intakes["intakes"]]
    out = tmp_path / "file.pdf"
    for ref in refs:
        got = cli(r, "message", "show", ref, "--attachment", "0", "-o", str(out))
        if got.returncode == 0 and out.read_bytes() == PDF:
            return
    raise AssertionError("no attachment written")


def test_messages_their_bytes_and_intakes(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path) as r:
            await check_message_doc(r, attached("case@help.example", "one"))
            from support.masd_process import mx_mail

            data = mx_mail(
                "ann@example.org", "case@help.example", subject="raw one", body="Hello there.\n"
            )[1]
            ref = await check_raw(r, data)
            await check_attachment(r)
            await check_intakes_and_resend(r)
            await asyncio.to_thread(check_commands, r, ref, data, tmp_path)
            await asyncio.to_thread(check_attachment_command, r, tmp_path)
            assert await r.masd.terminate() == 0
            await asyncio.to_thread(check_resend_without_masd, r)

    asyncio.run(main())


def check_resend_without_masd(r: Readers) -> None:
    """No masd answers: the resend is queued in the store, for masd to send when it runs."""
    pending = json.loads(cli(r, "intake", "list", "--state", "pending", "--json").stdout)
    pending = pending["intakes"][0]
    resent = cli(r, "intake", "resend", pending["intake_ref"])
    assert resent.returncode == 0, resent.stderr
    assert b"queueing it in the store" in resent.stderr
    queued = json.loads(cli(r, "queue", "list", "--json").stdout)["items"]
    waiting = [i for i in queued if i.get("type") == "case.intake" and i["state"] == "queued"]
    assert [i["message_id"] for i in waiting] == [resent.stdout.split()[4].decode()]


def vm(pid: int, field: str) -> int:
    """A /proc/<pid>/status figure, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def test_a_20_mib_attachment_is_streamed_whole_and_by_range(tmp_path: Path) -> None:
    size = 20 * 1024 * 1024
    blob = hashlib.shake_256(b"masd").digest(size)
    data = attached(
        "case@help.example", "big", blob, filename="big.bin", ctype="application/octet-stream"
    )

    async def main() -> None:
        async with running(tmp_path, server="max_message_bytes = 41943040\n") as r:
            intake = await r.intake(r.crm, "case@help.example", data)
            ref = intake["event"]["message_ref"]
            assert intake["event"]["attachments"][0]["size"] == size
            pid = r.masd.proc.pid if r.masd.proc else 0
            idle = vm(pid, "VmRSS")
            reset = Path(f"/proc/{pid}/clear_refs")
            reset.write_text("5")  # the peak starts again from here
            path = message_path(ref, "/attachments/0")
            headers = {"Authorization": f"Bearer {r.setup.master_token}"}
            digest, count = hashlib.sha256(), 0
            async with r.http.stream("GET", path, headers=headers) as response:
                assert response.status_code == 200
                async for piece in response.aiter_bytes():
                    digest.update(piece)
                    count += len(piece)
            assert (count, digest.hexdigest()) == (size, hashlib.sha256(blob).hexdigest())
            headers["Range"] = f"bytes={size - 1_000_000}-{size - 1}"
            tail = await r.http.get(path, headers=headers)
            assert (tail.status_code, tail.content) == (206, blob[-1_000_000:])
            after, peak = vm(pid, "VmRSS"), vm(pid, "VmHWM")
            print(
                f"masd VmRSS idle {idle >> 20} MiB, after {after >> 20} MiB, "
                f"peak while serving {peak >> 20} MiB (attachment {size >> 20} MiB)"
            )
            assert peak - idle < 3 * size

    asyncio.run(main())
