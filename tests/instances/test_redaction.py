"""tether.redaction: runs of 12+ characters of a key, and of its base64, are redacted; less is not."""

import base64
import secrets

import pytest

from tests.instances.conftest import KEY
from tether import redaction
from tether.redaction import REDACTED, Redactor, redact

LONG = "sk-ant-api03-" + secrets.token_urlsafe(72)
# A key is also matched across whitespace and in any case, so the text around a piece of it in
# these tests is set off by "|", a character no form of a key has: "x" next to a piece whose key
# has an "x" there would rightly be redacted with it.


def test_every_whole_key_is_replaced():
    assert Redactor([KEY]).redact(f"a {KEY} b {KEY}") == f"a {REDACTED} b {REDACTED}"


@pytest.mark.parametrize(("start", "length"), [(0, 12), (20, 12), (30, 48), (40, 60), (len(LONG) - 12, 12)])
def test_any_run_of_twelve_or_more_characters_is_replaced_whole(start, length):
    piece = LONG[start : start + length]
    assert Redactor([LONG]).redact(f"before | {piece} | after") == f"before | {REDACTED} | after"


@pytest.mark.parametrize("start", [0, 17, 50, len(LONG) - 11])
def test_eleven_characters_are_ordinary_text(start):
    text = f"before | {LONG[start : start + 11]} | after"
    assert Redactor([LONG]).redact(text) == text


def test_pieces_of_two_keys_and_text_around_them():
    other = secrets.token_urlsafe(40)
    text = f"x={LONG[5:25]};y={other[3:30]}."
    assert Redactor([LONG, other]).redact(text) == f"x={REDACTED};y={REDACTED}."


def _windows(text, size=12):
    return {text[i : i + size] for i in range(len(text) - size + 1)}


@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
@pytest.mark.parametrize("before", [b"", b"a", b"ab", b"abc", b"Authorization: Bearer "])
def test_base64_of_a_key_or_of_a_piece_inside_longer_data_is_replaced(encode, before):
    scanner = Redactor([LONG])
    for chunk in (LONG, LONG[10:58]):
        out = scanner.redact(encode(before + chunk.encode() + b"\n and more after it").decode())
        assert REDACTED in out
        # No 12 characters of the chunk's base64, at any byte alignment, are left.
        for skip in range(3):
            encoded = encode(chunk.encode()[skip:]).decode().rstrip("=")[:-4]
            assert not any(window in out for window in _windows(encoded))


def test_short_keys_are_not_redacted_from_ordinary_text():
    assert Redactor(["postgres", "tether"]).redact("postgresql and tether") == "postgresql and tether"


def test_data_is_redacted_all_the_way_down():
    data = {"a": [LONG[:20], {"b": f"x | {LONG[30:70]} | y", LONG[1:20]: 3}], "n": 4, "ok": True}
    out = Redactor([LONG]).redact(str(data))
    assert LONG[:20] not in out
    redacted = redaction.redact_data(data, [LONG])
    assert redacted == {"a": [REDACTED, {"b": f"x | {REDACTED} | y", REDACTED: 3}], "n": 4, "ok": True}


def test_the_servers_own_keys_are_redacted_without_being_named(settings, monkeypatch):
    settings.SECRET_KEY = "s" + secrets.token_urlsafe(40)
    settings.TETHER_METRICS_TOKEN = secrets.token_urlsafe(24)
    service_token = "tok-" + secrets.token_hex(12)
    monkeypatch.setenv("ANTHROPIC_API_KEY", LONG)
    monkeypatch.setenv("SOME_SERVICE_TOKEN", service_token)
    for key in (settings.SECRET_KEY, settings.TETHER_METRICS_TOKEN, LONG, service_token):
        assert redact(f"<{key[2:16]}>") == f"<{REDACTED}>"


@pytest.mark.django_db
def test_stored_credentials_are_redacted_and_forgotten_when_deleted(user):
    from instances.models import Credential

    stored = "sk-ant-api03-" + secrets.token_urlsafe(60)
    credential = Credential.create_for(user, label="k", secret=stored)
    assert redact(stored[8:40]) == REDACTED
    credential.delete()
    assert redact(stored[8:40]) == stored[8:40]


def test_a_64_kilobyte_text_is_scanned_in_milliseconds():
    import time

    scanner = Redactor([secrets.token_urlsafe(80) for _ in range(50)])
    text = ("an ordinary line of tool output, 0123456789 abcdef\n" * 2000)[: 64 * 1024]
    began = time.perf_counter()
    assert scanner.redact(text) == text
    assert time.perf_counter() - began < 0.5
