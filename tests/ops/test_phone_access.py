"""Reaching the console from a phone: HOST=0.0.0.0 prints a link a phone can open, or says what to set."""

import io
import re
import socket
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command
from django.test import Client

from tether import addresses, origin

pytestmark = pytest.mark.django_db

ALLOWED_HOSTS_SET = re.compile(r"TETHER_ALLOWED_HOSTS=(\S+)")


@pytest.fixture
def admin(django_user_model):
    user = django_user_model.objects.create_superuser("admin", email="")
    user.set_unusable_password()
    user.save()
    return user


def first_start(host, port=8123):
    from web.management.commands.serve import Command

    out = io.StringIO()
    assert Command(stdout=out)._first_start(host, port)
    (link,) = re.findall(r"http://\S+/login/once/\S+", out.getvalue())
    return link, out.getvalue()


def signs_in(link, settings):
    """Open `link` as a phone would (its Host header), then post a console form with its Origin."""
    parts = urlsplit(link)
    phone = Client(enforce_csrf_checks=True, HTTP_HOST=parts.netloc)
    opened = phone.get(parts.path)
    if opened.status_code != 302:
        return False
    assert phone.get("/").status_code == 200
    token = phone.cookies["csrftoken"].value
    # The console's forms post with the page's own Origin: no TETHER_CSRF_TRUSTED_ORIGINS needed.
    out = phone.post("/logout/", {"csrfmiddlewaretoken": token}, HTTP_ORIGIN=f"http://{parts.netloc}")
    assert out.status_code == 302, out.status_code
    return True


def test_first_start_on_every_interface_prints_a_reachable_link(django_user_model, settings):
    link, warnings = first_start("0.0.0.0")
    host = urlsplit(link).hostname
    assert host not in ("0.0.0.0", "::", "")
    assert f"http://{addresses.reachable_host('0.0.0.0')}:8123/login/once/" in link
    # Not yet allowed: the output says exactly what to set, and with that set the link works.
    (hosts,) = ALLOWED_HOSTS_SET.findall(warnings)
    assert addresses.reachable_host("0.0.0.0") in hosts.split(",")
    settings.ALLOWED_HOSTS = hosts.split(",")
    django_user_model.objects.get(username="admin")
    assert signs_in(link, settings)


def test_loginlink_with_an_allowed_lan_address_just_works(admin, settings, monkeypatch):
    lan = addresses.reachable_host("0.0.0.0")
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1", lan]
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.setenv("PORT", "8124")
    out, err = io.StringIO(), io.StringIO()
    call_command("loginlink", "admin", stdout=out, stderr=err)
    link = out.getvalue().strip()
    assert link.startswith(f"http://{lan}:8124/login/once/") and "0.0.0.0" not in link
    assert err.getvalue() == ""
    assert signs_in(link, settings)
    # The run page's live socket opens from the phone's page too (same origin, allowed host).
    netloc = urlsplit(link).netloc
    assert origin.origin_allowed(f"http://{netloc}", netloc, secure=False)


def test_loginlink_warns_when_the_address_would_be_refused(admin, settings, monkeypatch):
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
    monkeypatch.setenv("HOST", "0.0.0.0")
    out, err = io.StringIO(), io.StringIO()
    call_command("loginlink", "admin", stdout=out, stderr=err)
    link = out.getvalue().strip()
    assert not signs_in(link, settings)  # 400: what a phone saw before
    (hosts,) = ALLOWED_HOSTS_SET.findall(err.getvalue())
    settings.ALLOWED_HOSTS = hosts.split(",")
    assert signs_in(link, settings)


def test_the_default_host_stays_loopback(admin, monkeypatch):
    monkeypatch.delenv("HOST", raising=False)
    monkeypatch.setenv("PORT", "8125")
    out, err = io.StringIO(), io.StringIO()
    call_command("loginlink", "admin", stdout=out, stderr=err)
    assert out.getvalue().startswith("http://127.0.0.1:8125/login/once/") and err.getvalue() == ""


class NoRoute(socket.socket):
    """A machine on no network: every route lookup fails."""

    def connect(self, address):
        raise OSError(101, "Network is unreachable")


def test_without_a_network_the_host_name_is_named(monkeypatch):
    monkeypatch.setattr(addresses.socket, "socket", NoRoute)
    monkeypatch.setattr(addresses.socket, "gethostname", lambda: "tether-box")
    assert addresses.lan_address() is None
    assert addresses.base_url("0.0.0.0", 8000) == "http://tether-box:8000"
    assert addresses.base_url("::", 8000) == "http://tether-box:8000"


def test_addresses_as_urls_write_them():
    assert addresses.base_url("192.168.1.5", 80) == "http://192.168.1.5:80"
    assert addresses.base_url("fe80::1", 8000) == "http://[fe80::1]:8000"
    assert addresses.base_url("[::1]", 8000) == "http://[::1]:8000"
    assert addresses.base_url("tether.lan", 8000) == "http://tether.lan:8000"
