"""A strict Content-Security-Policy on every page, and pages that need nothing it forbids:
no inline script, no inline event handlers, no hx-on, no inline style."""

import json
import re
from html.parser import HTMLParser

import pytest
from django.test import Client

from triggers.models import Trigger
from web.auth import make_token

pytestmark = pytest.mark.django_db


class InlineFinder(HTMLParser):
    """Collect what a strict CSP would block: script without src, on* handlers, hx-on, style attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag, attrs):
        names = {name.lower() for name, _ in attrs}
        if tag == "script" and "src" not in names:
            self.found.append("<script> without src")
        if tag == "style":
            self.found.append("<style> element")
        for name in names:
            if name.startswith("on") or name.startswith("hx-on") or name == "style":
                self.found.append(f"<{tag} {name}=...>")


def inline_parts(html: str) -> list[str]:
    finder = InlineFinder()
    finder.feed(html)
    return finder.found


def policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {d.split()[0]: d.split()[1:] for d in (part.strip() for part in header.split(";")) if d}


def test_the_finder_sees_inline_script_handlers_and_style():
    html = '<script>alert(1)</script><a onclick="x()">a</a><div hx-on:click="y"></div><span style="width: 1%"></span>'
    assert len(inline_parts(html)) == 4
    assert inline_parts('<script src="/static/a.js"></script><a href="/">a</a>') == []


@pytest.fixture
def pages(user, make_instance):
    from loops import services

    instance = make_instance(user)
    run = services.run_start(instance=instance, user=user, objective="write the report", max_cost_usd="5")
    client = Client()
    client.force_login(user)
    made = client.post("/tokens/", {"name": "ci", "days": "7"}, follow=True)
    assert made.redirect_chain == [("/tokens/", 303)]
    paths = ["/", f"/instances/{instance.pk}/", f"/runs/{run.pk}/", "/history/", "/tokens/", "/reviews/",
             "/instances/new/", "/instances/new/coder/", f"/instances/{instance.pk}/edit",
             f"/instances/{instance.pk}/duplicate", f"/instances/{instance.pk}/budget", "/credentials/",
             f"/instances/{instance.pk}/triggers/"]
    # A trigger with a delivery: its page draws the secret shown once and the deliveries list.
    trigger = client.post(
        f"/instances/{instance.pk}/triggers/",
        {"name": "hook", "objective_template": "Fix {issue.title}", "max_per_minute": "5"},
        follow=True,
    )
    assert trigger.redirect_chain == [(f"/instances/{instance.pk}/triggers/", 303)]
    Client().post(f"/v1/hooks/{Trigger.objects.get().pk}", data=b"{}", content_type="application/json")
    return client, paths, [("/tokens/ (created)", made), ("triggers (secret shown)", trigger)]


def test_every_console_page_has_a_strict_policy_and_no_inline_script_or_style(pages, django_user_model):
    client, paths, made = pages
    responses = [(path, client.get(path)) for path in paths] + made
    responses += [("/login/", Client().get("/login/")), ("/admin/login/", Client().get("/admin/login/"))]
    operator = Client()
    operator.force_login(django_user_model.objects.create_superuser("root", email=""))
    responses += [(path, operator.get(path)) for path in ("/admin/", "/admin/auth/user/", "/admin/axes/accessattempt/",
                                                          "/instances/new/pilot/")]
    run_page = dict(responses)[paths[2]]
    assert b'class="meter"' in run_page.content  # the budget bar, drawn without inline style
    for path, response in responses:
        assert response.status_code in (200, 201), path
        directives = policy(response)
        assert directives["script-src"] == ["'self'"], path
        assert directives["style-src"] == ["'self'"], path
        assert directives["object-src"] == ["'none'"] and directives["frame-ancestors"] == ["'none'"], path
        assert "'unsafe-inline'" not in response["Content-Security-Policy"], path
        assert "'unsafe-eval'" not in response["Content-Security-Policy"], path
        assert inline_parts(response.content.decode()) == [], path


def test_the_lockout_page_and_api_answers_carry_the_policy_too(client, user):
    for n in range(6):
        locked = client.post("/login/", {"username": "ada", "password": f"guess-{n}"})
    assert locked.status_code == 429 and inline_parts(locked.content.decode()) == []
    assert "script-src 'self'" in locked["Content-Security-Policy"]
    api = Client().get("/v1/instances", headers={"Authorization": f"Bearer {make_token(user)}"})
    assert "default-src 'self'" in api["Content-Security-Policy"]


def test_htmx_is_told_not_to_inject_styles_or_evaluate_code(client, user):
    client.force_login(user)
    page = client.get("/").content.decode()
    config = json.loads(re.search(r'<meta name="htmx-config" content=\'([^\']*)\'>', page).group(1))
    assert config["includeIndicatorStyles"] is False and config["allowEval"] is False
    # Settling a swap copies the attributes named here with setAttribute: a style attribute would be blocked.
    assert "style" not in config["attributesToSettle"]
