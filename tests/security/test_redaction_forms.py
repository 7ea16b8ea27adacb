"""A key in another form is redacted too: hex, reversed, split, %-escaped, rot13, base32, joined, case-changed.

Each form is caught whole and as any 12-character run of it; ordinary prose, code, hex, base32 and
URLs are left alone. The tool journal stores no key in the clear yet replays the model's answer
verbatim, and a key an agent writes in such a form reaches neither the events, the run page,
the journal nor the admin.
"""

import base64
import codecs
import json
import re
import secrets
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from loops import journal, leases, runner, services
from loops.models import Event, Iteration, ToolCall
from tests.fakes.messages_server import MessagesServer, text, tool_use
from tether.redaction import REDACTED, Redactor

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-ant-api03-" + secrets.token_urlsafe(72)[:95]
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]


def _chunks(value: str, size: int) -> list[str]:
    return [value[i : i + size] for i in range(0, len(value), size)]


def _escaped(value: str, every: int = 1) -> str:
    """%-escape every `every`th character of `value` (all of them by default)."""
    return "".join(f"%{ord(c):02X}" if i % every == 0 else c for i, c in enumerate(value))


# Each form: how a text (the key, or a piece of it) is written in it.
FORMS = {
    "hex": lambda v: v.encode().hex(),
    "HEX": lambda v: v.encode().hex().upper(),
    "reversed": lambda v: v[::-1],
    "spaced every 4": lambda v: " ".join(_chunks(v, 4)),
    "a space between every character": " ".join,
    "a line break every 7": lambda v: "\n".join(_chunks(v, 7)),
    "CRLF and tabs every 5": lambda v: "\r\n\t".join(_chunks(v, 5)),
    "%-escaped": _escaped,
    "%-escaped, lower-case hex": lambda v: _escaped(v).lower(),
    "%-escaped every third": lambda v: _escaped(v, 3),
    "rot13": lambda v: codecs.encode(v, "rot13"),
    "base32": lambda v: base64.b32encode(v.encode()).decode().rstrip("="),
    "upper": str.upper,
    "lower": str.lower,
    "swapped case": str.swapcase,
    **{f"joined by U+{ord(c):04X}": c.join for c in INVISIBLE},
}


@pytest.fixture(scope="module")
def scanner():
    return Redactor([KEY])


@pytest.mark.parametrize("form", FORMS)
def test_the_whole_key_in_each_form_is_redacted(scanner, form):
    assert scanner.redact(f"before {FORMS[form](KEY)} after") == f"before {REDACTED} after"


@pytest.mark.parametrize("start", [13, 40, len(KEY) - 12])
@pytest.mark.parametrize("form", FORMS)
def test_a_piece_of_twelve_characters_of_the_key_in_each_form_is_redacted(scanner, form, start):
    piece = FORMS[form](KEY[start : start + 12])
    redacted = scanner.redact(f"before {piece} after")
    if form == "base32":  # its last character also encodes the zero bits after the piece: it may stay
        assert re.fullmatch(r"before \[redacted\][A-Z2-7]? after", redacted), redacted
    else:
        assert redacted == f"before {REDACTED} after"


# A fixed-string encoding: any 12 consecutive characters of it (fewer than 12 of the key's).
ENCODED = {
    "hex": KEY.encode().hex(),
    "HEX": KEY.encode().hex().upper(),
    "%-escaped": _escaped(KEY),
    "base32": base64.b32encode(KEY.encode()).decode(),
    "base32 of the key after 3 bytes": base64.b32encode(KEY.encode()[3:]).decode(),
    "rot13": codecs.encode(KEY, "rot13"),
    "reversed": KEY[::-1],
}


@pytest.mark.parametrize("start", [0, 1, 37, len(KEY) - 13])
@pytest.mark.parametrize("form", ENCODED)
def test_twelve_characters_of_each_encoding_are_redacted(scanner, form, start):
    piece = ENCODED[form][start : start + 12]
    assert scanner.redact(f"x={piece};") == f"x={REDACTED};"
    assert scanner.redact(f"before {piece} after") == f"before {REDACTED} after"


@pytest.mark.parametrize("start", [0, 1, 37, len(KEY) - 13])
@pytest.mark.parametrize("form", ENCODED)
def test_eleven_characters_of_an_encoding_are_ordinary_text(scanner, form, start):
    sample = f"before {ENCODED[form][start : start + 11]} after"
    assert scanner.redact(sample) == sample


def test_a_split_key_glued_to_other_text_is_redacted_and_the_text_kept(scanner):
    split = "\n".join(_chunks(KEY[20:50], 6))
    assert scanner.redact(f'token="{split}";') == f'token="{REDACTED}";'
    joined = "\u200b".join(KEY[10:40])
    assert scanner.redact(f"({joined})") == f"({REDACTED})"


def test_a_key_escaped_in_a_url_is_redacted_and_the_url_kept(scanner):
    url = f"https://example.com/cb?key={_escaped(KEY, 2)}&next=%2Fhome"
    assert scanner.redact(url) == f"https://example.com/cb?key={REDACTED}&next=%2Fhome"


def _ordinary() -> str:
    """About 500 KB of ordinary text: Tether's own README and code, hex digests, base32, URLs."""
    parts = [(ROOT / "README.md").read_text()]
    parts += [p.read_text() for p in sorted((ROOT / "loops").glob("*.py"))]
    parts += [f"commit {secrets.token_hex(20)} sha256:{secrets.token_hex(32).upper()}\n" for _ in range(800)]
    parts += [base64.b32encode(secrets.token_bytes(40)).decode() + "\n" for _ in range(800)]
    parts += [f"GET /search?q={quote(secrets.token_urlsafe(30))}&page=2%20of%203\n" for _ in range(800)]
    body = "".join(parts)
    return (body * (500_000 // len(body) + 1))[:500_000]


def test_ordinary_prose_code_hex_and_urls_are_left_alone_and_scanned_quickly():
    scanner = Redactor([KEY, secrets.token_urlsafe(60), secrets.token_hex(32), secrets.token_urlsafe(40)])
    ordinary = _ordinary()
    began = time.process_time()
    assert scanner.redact(ordinary) == ordinary
    assert time.process_time() - began < 2.0  # about 50 ms on a quiet machine


def test_a_text_made_of_keys_is_scanned_in_linear_time(scanner):
    line = f"key={KEY.encode().hex()} "
    many = (line * (500_000 // len(line) + 1))[:500_000]
    began = time.process_time()
    assert KEY.encode().hex()[:12] not in scanner.redact(many)
    assert time.process_time() - began < 3.0


# --- the tool journal ------------------------------------------------------------------------------

ALL_FORMS = {"plain": KEY, **{name: make(KEY) for name, make in FORMS.items()}}


def _plain(recorded: str) -> str:
    """`recorded` without whitespace and invisible characters, in lower case: a split key is whole again."""
    recorded = "".join(recorded.split())
    for c in INVISIBLE:
        recorded = recorded.replace(c, "")
    return recorded.lower()


def _leaks(recorded: str) -> list[str]:
    """Return the forms of which `recorded` holds 12 consecutive characters."""
    seen = _plain(recorded)
    found = []
    for name, form in ALL_FORMS.items():
        form = _plain(form)
        if any(form[i : i + 12] in seen for i in range(len(form) - 11)):
            found.append(name)
    return found


def test_the_leak_check_sees_every_form():
    assert _leaks(json.dumps(ALL_FORMS, ensure_ascii=False)) == list(ALL_FORMS)


@pytest.fixture
def stored_key(user):
    from instances.models import Credential

    return Credential.create_for(user, label="mine", secret=KEY)


@pytest.mark.django_db
def test_the_journal_stores_no_key_and_replays_the_answer_verbatim(user, make_instance, stored_key, admin_client):
    run = services.run_start(instance=make_instance(user), user=user, objective="o")
    call = {"id": "t1", "name": "write_file", "input": {"path": "k.txt", "content": f"KEY={KEY}\nHEX={KEY.encode().hex()}"}}
    content = [{"type": "text", "text": f"writing {codecs.encode(KEY, 'rot13')}"}, {"type": "tool_use", **call}]
    first = journal.ToolJournal(run.pk, 1, 1)
    key = first.started(1, 0, call, content)
    first.finished(key, f"wrote {KEY[::-1]}", False)
    quiet = journal.ToolJournal(run.pk, 1, 1).started(2, 0, {"id": "t2", "name": "list_files", "input": {}}, [])

    row = ToolCall.objects.get(turn=1)
    stored = json.dumps([row.name, row.call, row.turn_content, row.result], ensure_ascii=False)
    assert _leaks(stored) == [] and REDACTED in stored
    assert row.call["input"]["content"] == f"KEY={REDACTED}\nHEX={REDACTED}"
    assert row.turn_content["redacted"][0]["text"] == f"writing {REDACTED}"
    assert row.result == f"wrote {REDACTED}"
    assert ToolCall.objects.get(turn=2).turn_content == []  # nothing to hide: stored as it was
    page = admin_client.get(f"/admin/loops/toolcall/{row.pk}/change/").content.decode()
    assert _leaks(page) == [] and key in page

    turns = journal.ToolJournal(run.pk, 1, 2).replay()
    assert turns[1].content == content  # the model gets its own answer back, and a call not started its input
    assert turns[1].calls[0].result == f"wrote {REDACTED}" and turns[2].calls[0].key == quiet


@pytest.mark.django_db
def test_an_answer_no_secret_opens_is_replayed_redacted(user, make_instance, stored_key, settings):
    run = services.run_start(instance=make_instance(user), user=user, objective="o")
    call = {"id": "t1", "name": "run_command", "input": {"command": f"echo {KEY.upper()}"}}
    journal.ToolJournal(run.pk, 1, 1).started(1, 0, call, [{"type": "tool_use", **call}])
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "another secret " + secrets.token_hex(20), []
    turns = journal.ToolJournal(run.pk, 1, 2).replay()
    assert turns[1].content == [{"type": "tool_use", **call, "input": {"command": f"echo {REDACTED}"}}]


# --- end to end: an agent writes the key in other forms ----------------------------------------------


@pytest.fixture
def claude(monkeypatch, settings):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    settings.TETHER_ANTHROPIC_RETRIES = 1
    settings.TETHER_ANTHROPIC_BACKOFF_SECONDS = 0.001
    settings.TETHER_ALLOW_PRIVATE_BASE_URLS = True  # the local Messages server is on loopback
    with MessagesServer(api_key=KEY) as running:
        yield running


@pytest.mark.django_db(transaction=True)
def test_a_key_an_agent_writes_in_other_forms_reaches_no_event_page_or_journal(
    user, make_instance, stored_key, claude, price, client
):
    instance = make_instance(
        user, brain="anthropic", decider="llm", base_url=claude.url, credential=stored_key, model="claude-test-1",
        tools=["write_file"], command=[], max_iterations=1,
    )
    instance.workspace_path().mkdir(parents=True, exist_ok=True)
    said = "\n".join(f"{name}: {form}" for name, form in ALL_FORMS.items())
    claude.enqueue(
        tool_use("write_file", {"path": "k.txt", "content": ALL_FORMS["hex"]}, say=f"the key: {ALL_FORMS['rot13']}"),
        text(f"Here it is in every form:\n{said}"),
        tool_use("record_decision", {"verdict": "done", "reason": f"wrote {ALL_FORMS['%-escaped every third']}"}),
    )
    run = services.run_start(instance=instance, user=user, objective="write the key down")
    lease = leases.claim(run.pk, run.next_iteration, "test-driver")
    assert lease is not None
    runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()
    assert run.status == "finished", run.outcome_detail
    assert claude.calls == 3 and claude.problems == []  # (its own answer went back to the model verbatim)
    assert (instance.workspace_path() / "k.txt").read_text() == ALL_FORMS["hex"]  # the call ran as asked
    assert ToolCall.objects.filter(run=run, name="write_file").exists()

    events = json.dumps([e.data for e in Event.objects.filter(run=run)], ensure_ascii=False)
    assert events.count(REDACTED) >= len(ALL_FORMS)
    client.force_login(user)
    page = client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    recorded = {
        "events": events,
        "iterations": json.dumps(
            [[i.response, i.act_detail, i.decision, i.checks] for i in Iteration.objects.filter(run=run)],
            ensure_ascii=False,
        ),
        "run": json.dumps([run.outcome_detail, run.history, run.next_instruction], ensure_ascii=False),
        "page": page.content.decode(),
        "journal": json.dumps(
            [[c.name, c.call, c.turn_content, c.result] for c in ToolCall.objects.filter(run=run)], ensure_ascii=False
        ),
    }
    assert {where: _leaks(what) for where, what in recorded.items()} == dict.fromkeys(recorded, [])
