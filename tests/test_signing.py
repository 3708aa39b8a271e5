"""Signed requests (docs/protocol.md §9.8): the scheme, its configuration, both directions.

The test vector is the Standard Webhooks specification's own: the values of
``test_sign_function``, ``test_invalid_signature_raises_error`` and
``test_multi_sig_payload_is_valid`` in libraries/python/tests/test_webhooks.py
of the standard-webhooks/standard-webhooks repository.
"""

from __future__ import annotations

import base64
import re
import secrets
from pathlib import Path
from typing import Any

import pytest
from support.http import write_config

from masd.config import ConfigErrors, format_summary, load_config
from masd.core import signing

ROOT = Path(__file__).resolve().parent.parent

# The specification's vector (see the module docstring).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TIMESTAMP = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
VECTOR_WRONG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="
VECTOR_DECOYS = (
    "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
    "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
)


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def vector_headers(sig: str = VECTOR_SIGNATURE) -> dict[str, str]:
    return {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TIMESTAMP),
        "webhook-signature": sig,
    }


def vector_problem(headers: dict[str, str], now: float = VECTOR_TIMESTAMP) -> str | None:
    key = signing.parse_secret(VECTOR_SECRET)
    return signing.problem([key], headers.get, VECTOR_BODY, now)


# ---------------------------------------------------------------- the scheme


def test_signing_reproduces_the_specifications_vector() -> None:
    key = signing.parse_secret(VECTOR_SECRET)
    assert signing.signature(key, VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY) == VECTOR_SIGNATURE
    two = signing.headers([key, key], VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY)
    assert two["webhook-signature"] == f"{VECTOR_SIGNATURE} {VECTOR_SIGNATURE}"


def test_verifying_accepts_the_vector_and_refuses_its_altered_signature() -> None:
    assert vector_problem(vector_headers()) is None
    wrong = vector_problem(vector_headers(VECTOR_WRONG))
    assert wrong is not None
    assert wrong.startswith("webhook-signature:")
    # Decoys of another version or another key around the right one.
    listed = " ".join([*VECTOR_DECOYS, VECTOR_SIGNATURE, VECTOR_DECOYS[0]])
    assert vector_problem(vector_headers(listed)) is None
    assert vector_problem(vector_headers(" ".join(VECTOR_DECOYS))) is not None


def test_a_tampered_body_or_id_does_not_verify() -> None:
    key = signing.parse_secret(VECTOR_SECRET)
    assert signing.problem([key], vector_headers().get, VECTOR_BODY + b" ", VECTOR_TIMESTAMP)
    other = {**vector_headers(), "webhook-id": VECTOR_ID + "x"}
    assert signing.problem([key], other.get, VECTOR_BODY, VECTOR_TIMESTAMP)


@pytest.mark.parametrize("drift", [-300, 300, 0])
def test_a_timestamp_within_five_minutes_either_way_is_accepted(drift: int) -> None:
    assert vector_problem(vector_headers(), now=VECTOR_TIMESTAMP - drift) is None


@pytest.mark.parametrize("drift", [-301, 301, 86400])
def test_a_timestamp_further_off_is_refused_naming_the_header(drift: int) -> None:
    got = vector_problem(vector_headers(), now=VECTOR_TIMESTAMP - drift)
    assert got is not None
    assert got.startswith("webhook-timestamp:")


@pytest.mark.parametrize("name", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_header_is_named(name: str) -> None:
    headers = vector_headers()
    del headers[name]
    got = vector_problem(headers)
    assert got is not None
    assert got.startswith(f"{name}: missing")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("webhook-timestamp", "hello"),
        ("webhook-timestamp", "1e9"),
        ("webhook-timestamp", "-1614265330"),
        ("webhook-timestamp", "١٦١٤٢٦٥٣٣٠"),  # digits, but not ASCII ones
        ("webhook-signature", "v1"),
        ("webhook-signature", "v1,"),
        ("webhook-signature", "v1,not base64 at all é"),
        ("webhook-signature", ","),
    ],
)
def test_malformed_headers_are_refusals_never_exceptions(field: str, value: str) -> None:
    got = vector_problem({**vector_headers(), field: value})
    assert got is not None
    assert got.startswith(f"{field}:")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "does not start with whsec_"),
        ("whsec_" + base64.b64encode(b"x" * 23).decode(), "23 bytes, fewer than 24"),
        ("whsec_not*base64", "not base64"),
        ("whsec_", "0 bytes"),
    ],
)
def test_a_bad_secret_is_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        signing.parse_secret(text)


def test_the_documents_verification_snippet_checks_the_vector_and_masds_own_headers() -> None:
    verify = documented_verify()
    assert verify([VECTOR_SECRET], vector_headers(), VECTOR_BODY, VECTOR_TIMESTAMP)
    assert not verify([VECTOR_SECRET], vector_headers(VECTOR_WRONG), VECTOR_BODY, VECTOR_TIMESTAMP)
    assert not verify([VECTOR_SECRET], vector_headers(), VECTOR_BODY, VECTOR_TIMESTAMP + 301)
    old, new = new_secret(), new_secret()
    keys = [signing.parse_secret(old), signing.parse_secret(new)]
    made = signing.headers(keys, "m-1", 1_800_000_000, b"{}")
    assert verify([new], made, b"{}", 1_800_000_000)
    assert verify([old], made, b"{}", 1_800_000_000)
    assert not verify([new_secret()], made, b"{}", 1_800_000_000)


def documented_verify() -> Any:
    """The ``verify`` function of docs/protocol.md §9.8's Python snippet."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    section = text.split("### 9.8 Signed requests", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, re.S)
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/protocol.md §9.8", "exec"), scope)
    return scope["verify"]


# ---------------------------------------------------------------- configuration

ENDPOINT = 'token_file = "callback.token"\n'


def write_secrets(directory: Path, *secret_lines: str, mode: int = 0o600) -> Path:
    path = directory / "callback.whsec"
    path.write_text("".join(line + "\n" for line in secret_lines))
    path.chmod(mode)
    return path


def signed_config(require: bool = True) -> Any:
    def adjust(text: str) -> str:
        extra = 'signing_secret_file = "callback.whsec"\n'
        if require:
            extra += "require_signature = true\n"
        assert ENDPOINT in text
        return text.replace(ENDPOINT, ENDPOINT + extra, 1)

    return adjust


def config_errors(tmp_path: Path, *secret_lines: str, mode: int = 0o600, **kw: Any) -> list[str]:
    path = write_config(tmp_path)
    write_secrets(tmp_path, *secret_lines, mode=mode)
    path.write_text(signed_config(**kw)(path.read_text()))
    try:
        load_config(path)
    except ConfigErrors as exc:
        return [f"{e.path}: {e.detail}" for e in exc.errors]
    return []


def test_check_config_reads_each_line_of_the_secrets_file(tmp_path: Path) -> None:
    first, second = new_secret(), new_secret()
    path = write_config(tmp_path)
    write_secrets(tmp_path, first, "", second)
    path.write_text(signed_config()(path.read_text()))
    endpoint = load_config(path).domains["help.example"].types["ticket"].endpoints["callback"]
    assert endpoint.signing.required is True
    assert endpoint.signing.keys == (signing.parse_secret(first), signing.parse_secret(second))
    assert first[6:] not in repr(endpoint)
    summary = format_summary(load_config(path))
    assert "!callback -> http://127.0.0.1:9/mas" in summary
    assert "signed with 2 secrets; its requests must be signed" in summary
    assert first not in summary


KEY = 'domains."help.example".types.ticket.endpoints.callback.signing_secret_file'


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "line 1: the secret does not start with whsec_"),
        ("whsec_c2hvcnQ=", "line 1: the secret holds 5 bytes, fewer than 24"),
        ("whsec_%%%%", "line 1: the secret what follows whsec_ is not base64"),
    ],
)
def test_check_config_names_a_bad_secret_by_its_key_and_line(
    tmp_path: Path, line: str, why: str
) -> None:
    [error] = config_errors(tmp_path, line)
    assert error.startswith(KEY + ": ")
    assert why in error
    assert line not in error.replace("whsec_ + base64", "")


def test_check_config_refuses_a_secrets_file_others_can_read(tmp_path: Path) -> None:
    [error] = config_errors(tmp_path, new_secret(), mode=0o640)
    assert error.startswith(KEY + ": ")
    assert "mode 0640" in error


def test_check_config_refuses_require_signature_without_secrets(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace(ENDPOINT, ENDPOINT + "require_signature = true\n"))
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    [error] = caught.value.errors
    assert error.path.endswith("callback.require_signature")


def test_check_config_refuses_an_empty_secrets_file(tmp_path: Path) -> None:
    [error] = config_errors(tmp_path)
    assert error.startswith(KEY + ": ")
    assert "holds no secret" in error


def test_a_master_entry_signs_too_and_its_errors_name_its_key(tmp_path: Path) -> None:
    from masd.service.peer_directory import peers_of

    path = write_config(tmp_path)
    secret = new_secret()
    write_secrets(tmp_path, secret)
    inline = 'token_file = "crm.token" }'
    signed = 'token_file = "crm.token", signing_secret_file = "callback.whsec" }'
    path.write_text(path.read_text().replace(inline, signed))
    [master] = [p for p in peers_of(load_config(path)) if p.kind == "master"]
    assert master.signing.keys == (signing.parse_secret(secret),)
    assert master.signing.required is False
    (tmp_path / "callback.whsec").chmod(0o604)
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    [error] = caught.value.errors
    assert error.path == 'domains."help.example".types.case.master.signing_secret_file'
