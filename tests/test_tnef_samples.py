"""Real winmail.dat files, read by masd and by Debian's ``tnef`` (in C): the same files, byte
for byte.

The samples are tnefparse 1.4.0's own test files (tests/examples/*.tnef in its sdist, LGPL-3.0),
Outlook and Exchange mail its project collected; .ci/setup.d/tnef-samples.sh puts them in
``/usr/local/share/masd-tests/tnef`` (or ``$MASD_TNEF_SAMPLES``) and installs ``tnef``.
Each file is read as masd reads a mail: the sample base64-encoded in a ``winmail.dat`` part, its
files listed in the event (names and SHA-256) and served from the raw message.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from support.system import REQUIRE_VARIABLE, require_program, system_tests_required
from test_mime_cases import HEAD, _tnef_attr, event

from masd.core.partspans import attachment_spans, span_bytes
from masd.core.tnef import tnef_files

SAMPLES = Path(os.environ.get("MASD_TNEF_SAMPLES", "/usr/local/share/masd-tests/tnef"))
#: Samples ``tnef`` itself cannot read whole (it stops with "Unexpected end of input"): a
#: file whose attribute lengths run past its end.
UNREADABLE_BY_TNEF = {"bad_checksum.tnef"}
#: Files cut by tnefparse's rstrip(b"\x00") before masd read the declared length: the sample,
#: the file, and the bytes it lost.
WERE_CUT = {
    ("MAPI_ATTACH_DATA_OBJ.tnef", "VIA_Nytt_1402.doc", 418),
    ("MAPI_OBJECT.tnef", "Untitled_Attachment", 430),
}


def samples() -> list[Path]:
    found = sorted(SAMPLES.glob("*.tnef"))
    if not found:
        message = f"no TNEF samples in {SAMPLES} (run .ci/setup.d/tnef-samples.sh)"
        if system_tests_required():
            pytest.fail(f"{message}, and {REQUIRE_VARIABLE} is set", pytrace=False)
        pytest.skip(message)
    return found


def mail(blob: bytes) -> bytes:
    return (
        HEAD
        + b"Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\nsee\n"
        + b'--b\nContent-Type: application/ms-tnef; name="winmail.dat"\n'
        + b"Content-Transfer-Encoding: base64\n\n"
        + base64.encodebytes(blob)
        + b"--b--\n"
    )


def tnef_reads(program: str, sample: Path, out: Path) -> list[bytes] | None:
    """The files ``tnef`` extracts (a repeated name numbered, not refused; checksums not
    checked, as masd does not); None if it fails."""
    out.mkdir()
    cmd = [program, "--number-backups", "--ignore-checksum", "-C", str(out), "-f", str(sample)]
    if subprocess.run(cmd, capture_output=True, timeout=60).returncode != 0:
        return None
    return [p.read_bytes() for p in sorted(out.iterdir())]


def served_files(raw: bytes) -> list[bytes]:
    """Each listed attachment's bytes as the HTTP edge serves them, from the raw message."""
    return [span_bytes(raw[s.start : s.end], s) for s in attachment_spans(raw)]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_every_file_masd_serves_is_what_tnef_extracts(tmp_path: Path) -> None:
    program = require_program("tnef")
    compared = 0
    for sample in samples():
        theirs = tnef_reads(program, sample, tmp_path / sample.name)
        if theirs is None:
            assert sample.name in UNREADABLE_BY_TNEF, f"tnef could not read {sample.name}"
            continue
        raw = mail(sample.read_bytes()).replace(b"\n", b"\r\n")
        listed = event(mail(sample.read_bytes())).attachments[1:]
        served = served_files(raw)[1:]
        assert [a.sha256 for a in listed] == [sha(d) for d in served], sample.name
        assert Counter(map(sha, served)) == Counter(map(sha, theirs)), sample.name
        compared += len(theirs)
    assert compared == 28  # the files tnef extracts from tnefparse 1.4.0's samples


def test_files_ending_in_nul_bytes_keep_them() -> None:
    by_name = {sample.name: sample for sample in samples()}
    for sample, filename, lost in sorted(WERE_CUT):
        ev = event(mail(by_name[sample].read_bytes()))
        (file,) = [a for a in ev.attachments if a.filename == filename]
        served = served_files(mail(by_name[sample].read_bytes()).replace(b"\n", b"\r\n"))
        data = served[ev.attachments.index(file)]
        assert data.endswith(b"\x00" * lost), (sample, filename)
        assert file.size == len(data)


@pytest.mark.parametrize("where", [0x00069005, 0x00069003])
def test_a_mapi_list_claiming_four_billion_properties_is_one_opaque_part(where: int) -> None:
    """tnefparse walks a MAPI list's declared count even past its end: 2**32 - 1 turns."""
    blob = struct.pack("<IH", 0x223E9F78, 1) + _tnef_attr(2, 0x00069002, b"\x00" * 14)
    blob += _tnef_attr(2, 0x0006800F, b"file") + _tnef_attr(2, 0x00018010, b"A.TXT\x00")
    level = 2 if where == 0x00069005 else 1
    blob += _tnef_attr(level, where, struct.pack("<I", 2**32 - 1) + bytes(64))
    assert tnef_files(blob) == []
    assert [a.filename for a in event(mail(blob)).attachments] == ["winmail.dat"]
