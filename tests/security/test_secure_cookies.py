"""TETHER_SECURE_COOKIES=1 (deployments behind TLS): Secure session and CSRF cookies, and HSTS."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, django
django.setup()
from django.conf import settings
from django.test import Client
response = Client().get("/login/", headers={"X-Forwarded-Proto": "https"})
cookie = response.cookies.get("csrftoken")
print(json.dumps({
    "session_secure": settings.SESSION_COOKIE_SECURE,
    "csrf_secure": settings.CSRF_COOKIE_SECURE,
    "hsts_seconds": settings.SECURE_HSTS_SECONDS,
    "status": response.status_code,
    "cookie_secure": bool(cookie and cookie["secure"]),
    "hsts_header": response.headers.get("Strict-Transport-Security"),
}))
"""


def probe(tmp_path, **env) -> dict:
    """Start a fresh process with `env` and report the settings and one answer to an https request."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
    environ.update(DJANGO_SETTINGS_MODULE="tether.settings", TETHER_HOME=str(tmp_path), **env)
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_secure_cookies_are_off_by_default(tmp_path):
    found = probe(tmp_path)
    assert found["session_secure"] is False and found["csrf_secure"] is False
    assert found["hsts_seconds"] == 0 and found["hsts_header"] is None
    assert found["status"] == 200 and found["cookie_secure"] is False


def test_tether_secure_cookies_turns_on_secure_cookies_and_hsts(tmp_path):
    found = probe(tmp_path, TETHER_SECURE_COOKIES="1")
    assert found["session_secure"] is True and found["csrf_secure"] is True
    assert found["hsts_seconds"] == 365 * 24 * 3600
    assert found["status"] == 200 and found["cookie_secure"] is True
    assert found["hsts_header"] == "max-age=31536000"


def test_the_hsts_lifetime_is_settable(tmp_path):
    found = probe(tmp_path, TETHER_SECURE_COOKIES="1", TETHER_HSTS_SECONDS="3600")
    assert found["hsts_seconds"] == 3600 and found["hsts_header"] == "max-age=3600"
