"""Secrets: a piece of a key that reaches an agent goes no further; Tether's files are private.

A Claude run (the local Messages server plays Claude) reads workspace files holding a
48-character middle piece of its stored key and the base64 of the key; the model repeats them.
Neither reaches the events, the run page, the logs, the receipt or the model's next request.
"""

import base64
import json
import logging
import logging.config
import os
import secrets
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from loops import leases, runner, services
from loops.models import Event, Iteration
from reviews import receipts
from tests.fakes.messages_server import MessagesServer, text, tool_use

ROOT = Path(__file__).resolve().parents[2]
MODEL = "claude-test-1"
# Shaped like a real Anthropic key: a fixed prefix and 95 random characters.
STORED_KEY = "sk-ant-api03-" + secrets.token_urlsafe(72)[:95]
PIECE = STORED_KEY[30:78]  # 48 characters from the middle
SHORT = STORED_KEY[50:61]  # 11 characters: ordinary text, left alone
ENCODED = base64.b64encode(b"user:" + STORED_KEY.encode()).decode()  # the key inside longer base64


def _windows(value: str, size: int = 12) -> set[str]:
    return {value[i : i + size] for i in range(len(value) - size + 1)}


def _leaks(recorded: str) -> list[str]:
    """Return what of the key (12+ characters of it, or of its base64) `recorded` holds."""
    found = [w for w in _windows(PIECE) if w in recorded]
    for skip in range(3):
        encoded = base64.b64encode(STORED_KEY.encode()[skip:]).decode()[:-4]
        found += [w for w in _windows(encoded) if w in recorded]
    return found


@pytest.fixture(autouse=True)
def no_ambient_keys(monkeypatch, settings):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    settings.TETHER_ANTHROPIC_RETRIES = 1
    settings.TETHER_ANTHROPIC_BACKOFF_SECONDS = 0.001
    settings.TETHER_ALLOW_PRIVATE_BASE_URLS = True  # the local Messages server is on loopback


@pytest.fixture
def claude():
    with MessagesServer(api_key=STORED_KEY) as running:
        yield running


@pytest.fixture
def log_lines():
    """Every log line of the test, formatted by each formatter Tether's settings configure."""
    configurator = logging.config.DictConfigurator(django_settings.LOGGING)
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            for name, config in django_settings.LOGGING["formatters"].items():
                formatter = configurator.configure_formatter(dict(config))
                lines.append(f"{name}: {formatter.format(record)}")

    handler = Collect(level=logging.DEBUG)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield lines
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.mark.django_db(transaction=True)
def test_a_piece_of_a_stored_key_read_by_an_agent_goes_no_further(user, make_instance, claude, price, client, log_lines):
    from instances.models import Credential

    credential = Credential.create_for(user, label="mine", secret=STORED_KEY)
    instance = make_instance(
        user,
        brain="anthropic",
        decider="llm",
        base_url=claude.url,
        credential=credential,
        model=MODEL,
        tools=["read_file", "search_files"],
        command=[],
        max_iterations=1,
    )
    workspace = instance.workspace_path()
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.txt").write_text(f"deploy notes\ntoken piece: {PIECE}\nticket: {SHORT}\n")
    (workspace / "auth.b64").write_text(f"{ENCODED}\n")
    claude.enqueue(
        tool_use("read_file", {"path": "notes.txt"}),
        tool_use("read_file", {"path": "auth.b64"}),
        tool_use("search_files", {"pattern": "token piece"}),
        text(f"The notes hold {PIECE} and the file holds {ENCODED}."),
        tool_use("record_decision", {"verdict": "done", "reason": f"found {PIECE} in notes.txt"}),
    )
    logging.getLogger("instances.brains.anthropic").warning("model said %s / %s", PIECE, ENCODED)

    run = services.run_start(instance=instance, user=user, objective="summarise the notes")
    lease = leases.claim(run.pk, run.next_iteration, "test-driver")
    assert lease is not None
    runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()
    assert run.status == "finished", run.outcome_detail
    assert claude.calls == 5 and claude.problems == []

    # The model's next requests: the tool results it is sent are redacted, the 11 characters are not.
    notes_result = claude.bodies[1]["messages"][-1]["content"][0]["content"]
    assert "token piece: [redacted]" in notes_result and f"ticket: {SHORT}" in notes_result
    assert "[redacted]" in claude.bodies[2]["messages"][-1]["content"][0]["content"]
    assert "token piece: [redacted]" in claude.bodies[3]["messages"][-1]["content"][0]["content"]
    for received in claude.requests:
        assert _leaks(received.raw.decode()) == [], received.path

    # Events, what the iteration recorded, the run page, the receipt and the log lines.
    events = json.dumps([e.data for e in Event.objects.filter(run=run)])
    assert "[redacted]" in events
    recorded = [events]
    recorded += [f"{i.response} {i.act_detail} {i.decision} {i.checks}" for i in Iteration.objects.filter(run=run)]
    recorded += [run.outcome_detail, json.dumps(run.history), run.next_instruction]
    client.force_login(user)
    page = client.get(f"/runs/{run.pk}/")
    assert page.status_code == 200
    recorded.append(page.content.decode())
    recorded.append(json.dumps(receipts.for_run(run)))
    assert any("model said [redacted] / " in line for line in log_lines)
    recorded += log_lines
    assert _leaks("\n".join(recorded)) == []
    assert SHORT in notes_result  # no over-redaction of ordinary text


@pytest.mark.django_db(transaction=True)
def test_a_piece_of_a_stored_key_printed_by_a_command_agent_or_a_check_goes_no_further(user, make_instance, script):
    from instances.models import Credential

    Credential.create_for(user, label="mine", secret=STORED_KEY)
    show = script("sys.stdout.write(open('notes.txt').read()); sys.stderr.write(open('auth.b64').read()); sys.exit(1)")
    instance = make_instance(
        user, brain="command", decider="checks", command=show, max_iterations=1,
        checks=[{"name": "notes", "command": show, "required": True}],
    )
    workspace = instance.workspace_path()
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.txt").write_text(f"token piece: {PIECE}\nticket: {SHORT}\n")
    (workspace / "auth.b64").write_text(f"{ENCODED}\n")

    run = services.run_start(instance=instance, user=user, objective="show the notes")
    lease = leases.claim(run.pk, run.next_iteration, "test-driver")
    assert lease is not None
    runner.drive(lease, slice_seconds=3600)
    run.refresh_from_db()
    assert run.status == "finished", run.outcome_detail

    iteration = Iteration.objects.get(run=run)
    assert "token piece: [redacted]" in iteration.response and f"ticket: {SHORT}" in iteration.response
    assert "token piece: [redacted]" in iteration.checks[0]["output"]
    recorded = [json.dumps([e.data for e in Event.objects.filter(run=run)])]
    recorded += [f"{iteration.response} {iteration.act_detail} {iteration.decision} {iteration.checks}"]
    recorded += [run.outcome_detail, json.dumps(run.history), json.dumps(receipts.for_run(run))]
    assert _leaks("\n".join(recorded)) == []


def test_log_lines_are_redacted_by_every_configured_formatter(settings, monkeypatch, log_lines):
    server_key = secrets.token_urlsafe(40)
    monkeypatch.setenv("ANTHROPIC_API_KEY", server_key)
    try:
        raise RuntimeError(f"refused key {server_key[5:30]}")
    except RuntimeError:
        logging.getLogger("loops.runner").exception("while talking to %s", server_key[3:20])
    assert len(log_lines) == len(settings.LOGGING["formatters"]) >= 2
    for line in log_lines:
        assert server_key[3:15] not in line and server_key[5:17] not in line, line
        assert "while talking to [redacted]" in line and "refused key [redacted]" in line


# --- file modes ----------------------------------------------------------------------------------

PROBE = textwrap.dedent(
    """
    import json, os, stat, django
    django.setup()
    from django.conf import settings
    from django.db import connection
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS probe (x)")
        cursor.execute("INSERT INTO probe VALUES (1)")
    home = settings.TETHER_HOME
    name = settings.DATABASES["default"]["NAME"]
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (str(home), name, name + "-wal", name + "-shm")}
    print(json.dumps(modes))
    """
)


def _probe(home: Path) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "DATABASE_URL", "REDIS_URL"))}
    env.update(TETHER_HOME=str(home), DJANGO_SETTINGS_MODULE="tether.settings", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", f"import os; os.umask(0o022)\n{PROBE}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_tether_home_is_0700_and_its_database_files_0600(tmp_path):
    home = tmp_path / "fresh" / "home"
    modes = _probe(home)
    assert modes.pop(str(home)) == 0o700
    assert sorted(modes.values()) == [0o600, 0o600, 0o600], modes


def test_an_existing_home_and_database_left_readable_are_tightened(tmp_path):
    home = tmp_path / "old-home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    database = home / "tether.sqlite3"
    database.touch()
    database.chmod(0o644)
    modes = _probe(home)
    assert modes[str(home)] == 0o700
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
    assert set(modes.values()) == {0o700, 0o600}


# --- key rotation, end to end: real settings files, one process per step (a restart between) -----------

SETUP = """
from django.contrib.auth import get_user_model
from instances.models import Credential, Instance
from loops.models import Run
from reviews import receipts
owner = get_user_model().objects.create_user("ada")
credential = Credential.create_for(owner, label="mine", secret=KEY)
instance = Instance.objects.create(owner=owner, name="agent", brain="command", command=["true"])
run = Run.objects.create(instance=instance, owner=owner, objective="o", max_iterations=1, status="finished", outcome="done")
receipts.issue(run)
"""
CHECK = """
import json
from instances import credentials
from instances.models import Credential
from reviews import receipts
from reviews.models import Receipt
try:
    opened = Credential.objects.get().reveal() == KEY
except credentials.CredentialUnreadable:
    opened = False
envelope = Receipt.objects.get().envelope
print(json.dumps({"opened": opened, "receipt": receipts.verify(envelope).ok,
                  "signed_now": envelope["signature"]["key_id"] == receipts.key_id(receipts.signing_key())}))
"""


def _tether(home: Path, *argv: str, code: str = "", **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TETHER_", "DATABASE_URL", "REDIS_URL"))}
    env.update(TETHER_HOME=str(home), DJANGO_SETTINGS_MODULE="tether.settings", PYTHONPATH=str(ROOT), **env_extra)
    if code:
        argv = ("shell", "-c", f"KEY = {STORED_KEY!r}\n{code}")
    return subprocess.run(
        [sys.executable, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def _state(home: Path, **env: str) -> dict:
    done = _tether(home, code=CHECK, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # ten Tether processes, one after another
def test_rotating_the_secret_key_end_to_end(tmp_path):
    home = tmp_path / "home"
    for done in (_tether(home, "migrate", "-v0"), _tether(home, code=SETUP)):
        assert done.returncode == 0, done.stderr[-3000:]
    old = (home / "secret_key").read_text().strip()
    assert _state(home) == {"opened": True, "receipt": True, "signed_now": True}

    done = _tether(home, "rotate_keys")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 stored credential(s) re-encrypted" in done.stdout and "--finish" in done.stdout
    new = (home / "secret_key").read_text().strip()
    assert new != old and len(new) >= 50
    assert (home / "secret_key.fallbacks").read_text().split() == [old]
    for name in ("secret_key", "secret_key.fallbacks"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600
    # Restarted: the credential is under the new key already; the receipt verifies through the fallback.
    assert _state(home) == {"opened": True, "receipt": True, "signed_now": False}
    assert _state(home, TETHER_SECRET_KEY=new)["opened"]  # the new key alone opens it

    done = _tether(home, "rotate_keys", "--finish")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 receipt(s) re-signed" in done.stdout
    assert not (home / "secret_key.fallbacks").exists()
    assert _state(home) == {"opened": True, "receipt": True, "signed_now": True}
    # The old key alone opens nothing any more.
    assert _state(home, TETHER_SECRET_KEY=old) == {"opened": False, "receipt": False, "signed_now": False}


def test_a_secret_key_from_the_environment_is_rotated_by_its_operator(tmp_path):
    done = _tether(tmp_path / "home", "rotate_keys", TETHER_SECRET_KEY="k" * 50)
    assert done.returncode != 0
    assert "TETHER_SECRET_KEY_FALLBACKS" in done.stderr and "rotate_keys --finish" in done.stderr
