"""Configuring an agent in the console on a phone and on a laptop, in headless Chromium against daphne.

A person without the run_programs capability opens the fleet, picks a template, sees what
it fixes, stores a key (never shown again), creates the instance, and lands on its page;
no page scrolls sideways (390 px on the phone) and the strict CSP refuses nothing.
"""

import re

import pytest

from instances.models import Credential, Instance

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw-ada-123"
SECRET = "sk-ant-api03-" + "p" * 40 + "9XYZ"
NO_SIDEWAYS_SCROLL_JS = "() => document.documentElement.scrollWidth <= window.innerWidth"


def test_an_instance_is_created_from_a_template(django_user_model, server, browser, artifacts, shipped_prices, device):
    user = django_user_model.objects.create_user("ada", password=PASSWORD)
    name, options = device
    context = browser.new_context(**options)
    page = context.new_page()
    refused = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)

    page.goto(server.url + "/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/")
    page.click("text=Create one from a template")
    page.wait_for_url(server.url + "/instances/new/")
    assert page.evaluate(NO_SIDEWAYS_SCROLL_JS)
    page.click("a:has-text('Use triage')")
    page.wait_for_url(server.url + "/instances/new/triage/")
    assert page.evaluate(NO_SIDEWAYS_SCROLL_JS)
    fixed = page.locator(".fixed").inner_text()
    assert "search_files" in fixed and "Claude" in fixed  # what the template fixes, read-only
    assert page.locator("[name=command], [name=checks], [name=env]").count() == 0

    page.click("text=Add an API key")
    page.wait_for_url(re.compile(r".*/credentials/\?next="))
    page.fill("#id_label", "personal")
    page.fill("#id_secret", SECRET)
    page.click("button:has-text('Store key')")
    page.wait_for_url(server.url + "/instances/new/triage/")
    assert SECRET not in page.content()

    page.fill("#id_name", "inbox-triage")
    page.fill("#id_max_iterations", "3")
    page.select_option("#id_credential", label="personal (…9XYZ)")
    page.screenshot(path=str(artifacts / f"instance-new-{name}.png"), full_page=True)
    page.click("button:has-text('Create instance')")
    page.wait_for_url(re.compile(r".*/instances/\d+/$"))
    assert "Created “inbox-triage”" in page.inner_text("main")
    assert page.evaluate(NO_SIDEWAYS_SCROLL_JS)
    page.screenshot(path=str(artifacts / f"instance-created-{name}.png"), full_page=True)

    made = Instance.objects.get(owner=user)
    assert (made.name, made.template.name, made.max_iterations) == ("inbox-triage", "triage", 3)
    assert made.credential == Credential.objects.get(owner=user, label="personal")
    assert SECRET not in page.content()
    assert refused == []
    context.close()
