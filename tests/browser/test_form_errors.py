"""A refused form in a real browser (issue #26, item 6), on a phone and on a laptop.

A create that the server refuses comes back with the error summary at the top of the form: the
focus is on it (not on BODY), it is in view without scrolling, it links the field, and the field
is outlined. The brain switch shows only what the brain uses (item 12).
"""

import pytest
from django.contrib.auth.models import Permission

from instances.models import Instance

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw-ada-123"
IN_VIEW_JS = """(el) => { const r = el.getBoundingClientRect(); return r.top >= 0 && r.bottom <= window.innerHeight + 1; }"""


def sign_in(page, server):
    page.goto(server.url + "/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/")


def test_a_refused_create_focuses_the_summary_and_outlines_the_field(
    django_user_model, server, browser, artifacts, shipped_prices, device
):
    user = django_user_model.objects.create_user("ada", password=PASSWORD)
    Instance.objects.create(owner=user, name="inbox", command=["true"])
    name, options = device
    context = browser.new_context(**options)
    page = context.new_page()
    sign_in(page, server)
    page.goto(server.url + "/instances/new/triage/")
    page.fill("#id_name", "inbox")  # taken: the service refuses it
    page.fill("#id_max_iterations", "0")  # out of bounds: the form refuses it first
    page.click("button:has-text('Create instance')")
    page.wait_for_selector("[data-error-summary]")
    assert page.evaluate("() => document.activeElement.hasAttribute('data-error-summary')")
    summary = page.locator("[data-error-summary]")
    assert summary.evaluate(IN_VIEW_JS)
    assert "Max iterations" in summary.inner_text()
    field = page.locator("#id_max_iterations")
    assert field.get_attribute("aria-invalid") == "true"
    assert field.evaluate("(el) => getComputedStyle(el).borderTopColor") == "rgb(180, 35, 24)"  # --bad
    page.screenshot(path=str(artifacts / f"form-errors-{name}.png"))

    # Fixed, the service's own refusal (the name) gets the same summary, focused.
    page.fill("#id_max_iterations", "3")
    page.click("button:has-text('Create instance')")
    page.wait_for_selector("[data-error-summary]")
    assert page.evaluate("() => document.activeElement.hasAttribute('data-error-summary')")
    assert "already have an instance named" in page.locator("[data-error-summary]").inner_text()
    assert page.locator("#id_name").get_attribute("aria-invalid") == "true"
    # Following the summary's link lands on the field.
    page.click("[data-error-summary] a[href='#id_name']")
    assert page.evaluate("() => location.hash") == "#id_name"
    assert Instance.objects.filter(owner=user).count() == 1
    context.close()


def test_the_brain_switch_shows_only_what_the_brain_uses(django_user_model, server, browser, shipped_prices, device):
    user = django_user_model.objects.create_user("ada", password=PASSWORD)
    user.user_permissions.add(Permission.objects.get(codename="run_programs"))
    context = browser.new_context(**device[1])
    page = context.new_page()
    sign_in(page, server)
    page.goto(server.url + "/instances/new/coder/")
    assert page.locator("#id_model").is_visible() and page.locator("#id_system_prompt").is_visible()
    assert not page.locator("#id_command").is_visible()
    page.select_option("#id_brain", "command")
    assert not page.locator("#id_system_prompt").is_visible()
    assert page.locator("#id_model").is_visible()  # Claude still judges it (the llm decider)
    page.select_option("#id_decider", "checks")
    assert not page.locator("#id_model").is_visible()
    assert not page.locator("input[name=tools][value=read_file]").is_visible()
    assert page.locator("input[name=tools][value=delegate]").is_visible()
    assert page.locator("#id_command").is_visible()
    context.close()
