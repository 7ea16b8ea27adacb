"""The 403 and 500 pages are console pages (issue #26: axe on every page, no inline style under the CSP).

A form whose CSRF check fails (a page older than the sign-in, a cookie not sent) and a refused
permission answer 403 in the console's own layout, with a main landmark, a heading, what happened and
a way on; Django's built-in pages had neither landmark nor the policy's blessing (an inline <style>).
A view that raises answers 500 with a static page in the same layout, saying what to do next and
nothing of the error.
"""

import pytest
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.test import Client, override_settings
from django.urls import path
from django.views import defaults

from tests.security.test_csp import inline_parts

pytestmark = pytest.mark.django_db

SECRET_WORDS = "sk-ant-api03-the-secret-in-the-error"


def broken_view(request: HttpRequest) -> None:
    raise RuntimeError(f"the database said no; key {SECRET_WORDS}")


urlpatterns = [path("broken/", broken_view)]  # this module is the URLconf of the 500 test


def test_a_failed_csrf_check_answers_with_the_consoles_page(user):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    answer = client.post("/tokens/", {"name": "laptop", "days": ""})
    assert answer.status_code == 403
    html = answer.content.decode()
    assert "<main>" in html and "<h1>That form was out of date</h1>" in html
    assert "Nothing was done" in html and "reload that page" in html
    assert 'aria-label="Main"' in html  # the console's navigation: the person is still signed in
    assert inline_parts(html) == []


def test_a_refused_permission_answers_with_the_consoles_page(rf, user):
    request = rf.get("/somewhere/")
    request.user = user
    answer = defaults.permission_denied(request, PermissionDenied("Only the owner may do this."))
    assert answer.status_code == 403
    html = answer.content.decode()
    assert "<main>" in html and "<h1>Not allowed</h1>" in html and "Only the owner may do this." in html
    assert inline_parts(html) == []


@override_settings(ROOT_URLCONF=__name__, DEBUG=False)
def test_a_view_that_raises_answers_with_the_consoles_500_page(user):
    client = Client(raise_request_exception=False)
    client.force_login(user)
    answer = client.get("/broken/")
    assert answer.status_code == 500
    html = answer.content.decode()
    assert "<main>" in html and "<h1>Something went wrong on Tether's side</h1>" in html
    assert "Reload the page to see whether it was done, then try again." in html
    assert "tell whoever runs this Tether" in html and 'href="/"' in html
    assert '<link rel="stylesheet" href="/static/console/console' in html
    for leaked in ("Traceback", "RuntimeError", "the database said no", SECRET_WORDS, "broken_view", "/broken/"):
        assert leaked not in html
    assert inline_parts(html) == []
