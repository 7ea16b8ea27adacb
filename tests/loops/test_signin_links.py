"""Sign-in links are independent of each other; `loginlink` names serve's address and explains a missing home."""

import io
import json
import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from web.accounts import login_link

pytestmark = pytest.mark.django_db


def path_of(link):
    return link.removeprefix("http://testserver")


def test_using_one_sign_in_link_leaves_another_outstanding_one_working(client, django_user_model):
    ada = django_user_model.objects.create_user("ada")
    first, second = path_of(login_link(ada, "http://testserver")), path_of(login_link(ada, "http://testserver"))
    assert first != second
    assert client.get(first).status_code == 302
    client.logout()
    assert client.get(second).status_code == 302  # was 400: "used already, expired, or not copied whole"
    assert client.get("/").status_code == 200
    client.logout()
    # Each is still good once only.
    assert client.get(first).status_code == 400 and client.get(second).status_code == 400


def test_a_link_for_one_user_does_not_sign_in_another(client, django_user_model):
    ada = django_user_model.objects.create_user("ada")
    bob = django_user_model.objects.create_user("bob")
    link = path_of(login_link(ada, "http://testserver"))
    uid_of_bob = path_of(login_link(bob, "http://testserver")).split("/")[3]
    parts = link.split("/")
    parts[3] = uid_of_bob
    assert client.get("/".join(parts)).status_code == 400


def test_a_new_password_voids_the_links_made_before(client, django_user_model):
    ada = django_user_model.objects.create_user("ada")
    link = path_of(login_link(ada, "http://testserver"))
    ada.set_password("a-new-password-1")
    ada.save()
    assert client.get(link).status_code == 400


def test_an_expired_link_is_refused(client, django_user_model, settings):
    ada = django_user_model.objects.create_user("ada")
    link = path_of(login_link(ada, "http://testserver"))
    settings.PASSWORD_RESET_TIMEOUT = -1
    assert client.get(link).status_code == 400


@pytest.fixture
def no_serve_note():
    path = settings.TETHER_HOME / "serve.json"
    path.unlink(missing_ok=True)
    yield path
    path.unlink(missing_ok=True)


def test_loginlink_names_the_address_a_running_serve_listens_on(django_user_model, no_serve_note, monkeypatch):
    django_user_model.objects.create_user("ada")
    monkeypatch.delenv("PORT", raising=False)
    monkeypatch.delenv("HOST", raising=False)
    # What `serve --port 8765` notes when it starts (this test process stands in for it: it runs).
    from web.management.commands.serve import record_address

    record_address("127.0.0.1", 8765)
    assert json.loads(no_serve_note.read_text())["pid"] == os.getpid()
    out, err = io.StringIO(), io.StringIO()
    call_command("loginlink", "ada", stdout=out, stderr=err)
    assert out.getvalue().startswith("http://127.0.0.1:8765/login/once/"), out.getvalue()
    assert err.getvalue() == ""


def test_loginlink_ignores_a_note_left_by_a_serve_that_is_gone(django_user_model, no_serve_note, monkeypatch):
    django_user_model.objects.create_user("ada")
    monkeypatch.delenv("PORT", raising=False)
    monkeypatch.delenv("HOST", raising=False)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    no_serve_note.write_text(json.dumps({"host": "127.0.0.1", "port": 8765, "pid": int(gone.stdout)}))
    out, err = io.StringIO(), io.StringIO()
    call_command("loginlink", "ada", stdout=out, stderr=err)
    assert out.getvalue().startswith("http://127.0.0.1:8000/login/once/")
    assert "no `serve` is running" in err.getvalue() and "--base-url" in err.getvalue()


def test_serve_forgets_its_address_when_it_stops(no_serve_note):
    from web.management.commands.serve import forget_address, read_address, record_address

    record_address("0.0.0.0", 8123)
    assert read_address() == {"host": "0.0.0.0", "port": 8123, "pid": os.getpid()}
    forget_address()
    assert not no_serve_note.exists() and read_address() == {}


def test_loginlink_without_a_database_says_what_to_do_instead_of_a_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "TETHER_SQLITE_PATH")}
    env["TETHER_HOME"] = str(tmp_path / "empty-home")
    done = subprocess.run(
        [sys.executable, str(settings.BASE_DIR / "manage.py"), "loginlink", "admin"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert "there is no Tether database" in done.stderr
    assert f"TETHER_HOME is {tmp_path / 'empty-home'}" in done.stderr
    assert "manage.py serve" in done.stderr


def test_loginlink_says_when_tether_home_is_not_set(monkeypatch):
    from django.db import OperationalError

    from web.management.commands.loginlink import no_database

    monkeypatch.delenv("TETHER_HOME", raising=False)
    message = str(no_database(OperationalError("no such table: auth_user")))
    assert "TETHER_HOME is not set in this terminal, so it is the default" in message


def test_loginlink_refuses_an_unknown_user_plainly():
    with pytest.raises(CommandError, match="no active user named 'nobody'"):
        call_command("loginlink", "nobody", stdout=io.StringIO(), stderr=io.StringIO())
