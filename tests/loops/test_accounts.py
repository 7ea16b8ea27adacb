"""No fixed password anywhere: the first start makes 'admin' and a one-time sign-in link."""

import io
import re

import pytest
from django.core.management import call_command

from web.accounts import login_link

pytestmark = pytest.mark.django_db


def test_a_sign_in_link_works_once(client, django_user_model):
    admin = django_user_model.objects.create_superuser("admin", email="")
    admin.set_unusable_password()
    admin.save()
    path = login_link(admin, "http://testserver").removeprefix("http://testserver")
    first = client.get(path)
    assert first.status_code == 302 and client.get("/").status_code == 200
    client.logout()
    again = client.get(path)
    assert again.status_code == 400 and b"loginlink" in again.content
    assert client.get("/").status_code == 302  # still signed out


def test_a_used_link_answers_the_consoles_own_page(client, django_user_model):
    """Not a bare text 400: the styled page says what happened and how to sign in instead."""
    ada = django_user_model.objects.create_user("ada")
    path = login_link(ada, "http://testserver").removeprefix("http://testserver")
    client.get(path)
    client.logout()
    again = client.get(path)
    page = again.content.decode()
    assert again.status_code == 400 and again["Content-Type"].startswith("text/html")
    # The base layout (its stylesheet by its plain name, or by its hashed one once collectstatic ran).
    assert re.search(r"console/console(\.[0-9a-f]+)?\.css", page) and 'class="brand"' in page
    assert "used already, has expired" in page
    assert "manage.py loginlink" in page and 'href="/login/"' in page
    token = path.rstrip("/").rsplit("/", 1)[1]
    assert token not in page  # the link's secret is not echoed back


def test_a_forged_link_is_refused(client, django_user_model):
    django_user_model.objects.create_user("ada")
    assert client.get("/login/once/MQ/not-a-token/").status_code == 400
    assert client.get("/login/once/%%%/x/").status_code in (400, 404)


def test_first_start_creates_admin_without_a_password(django_user_model):
    from web.management.commands.serve import Command

    out = io.StringIO()
    command = Command(stdout=out)
    command._first_start("127.0.0.1", 8000)
    admin = django_user_model.objects.get(username="admin")
    assert admin.is_superuser and not admin.has_usable_password()
    assert "/login/once/" in out.getvalue()
    command._first_start("127.0.0.1", 8000)  # later starts make nothing and print no link
    assert django_user_model.objects.filter(is_superuser=True).count() == 1
    assert out.getvalue().count("/login/once/") == 1


def test_loginlink_command(django_user_model):
    from django.core.management.base import CommandError

    django_user_model.objects.create_user("ada")
    out = io.StringIO()
    call_command("loginlink", "ada", stdout=out)
    assert "/login/once/" in out.getvalue()
    with pytest.raises(CommandError, match="no active user"):
        call_command("loginlink", "nobody")


def test_serve_refuses_a_bad_port():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="PORT must be a TCP port"):
        call_command("serve", "--port", "eighty", "--no-migrate")
