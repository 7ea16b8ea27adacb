"""The 403 pages are console pages (issue #26: axe on every page, no inline style under the CSP).

A form whose CSRF check fails (a page older than the sign-in, a cookie not sent) and a refused
permission answer 403 in the console's own layout, with a main landmark, a heading, what happened and
a way on; Django's built-in pages had neither landmark nor the policy's blessing (an inline <style>).
"""

import pytest
from django.core.exceptions import PermissionDenied
from django.test import Client
from django.views import defaults

from tests.security.test_csp import inline_parts

pytestmark = pytest.mark.django_db


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
