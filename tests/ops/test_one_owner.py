"""One owner per fact: a source scan fails when a copy of something owned elsewhere comes back.

Each test names the owner; the app code (migrations aside) must reach the fact through it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("tether", "audit", "budgets", "instances", "loops", "reviews", "triggers")


def app_sources(suffix: str = ".py"):
    for app in APPS:
        for path in sorted((ROOT / app).rglob(f"*{suffix}")):
            if "migrations" not in path.parts and "__pycache__" not in path.parts:
                yield path


def where(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_htmx_requests_are_recognised_by_django_htmx_only():
    """`request.htmx` (django_htmx's middleware) says whether htmx sent a request: no view reads the header."""
    from django.conf import settings

    assert "django_htmx.middleware.HtmxMiddleware" in settings.MIDDLEWARE
    copies = [where(path) for path in app_sources() if "HX-Request" in path.read_text()]
    assert not copies, "read request.htmx instead of the HX-Request header:\n" + "\n".join(copies)
