"""Under the strict Content-Security-Policy the console still works in Chromium: the live
sockets connect, the forms post, and the browser reports no violation."""

import re

import pytest

from tests.browser.conftest import LAPTOP

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

PASSWORD = "pw-ada-123"
VIOLATIONS_JS = """() => {
  window.tetherViolations = [];
  document.addEventListener("securitypolicyviolation", (e) => window.tetherViolations.push(e.violatedDirective + " " + e.blockedURI));
}"""


def test_the_console_runs_under_its_policy_without_a_violation(browser, server, django_user_model, make_instance):
    from loops import services

    user = django_user_model.objects.create_user("ada", password=PASSWORD)
    instance = make_instance(user, name="csp-check")
    run = services.run_start(instance=instance, user=user, objective="write the report", max_cost_usd="5")

    context = browser.new_context(**LAPTOP)
    page = context.new_page()
    page.add_init_script(f"({VIOLATIONS_JS})()")
    reported = []
    page.on("console", lambda m: "Content Security Policy" in m.text and reported.append(m.text))
    page.on("pageerror", lambda exc: reported.append(str(exc)))

    response = page.goto(server.url + "/login/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/")
    page.wait_for_selector('.live-bar[data-state="live"]')  # the fleet socket: connect-src allows it

    page.goto(f"{server.url}/runs/{run.pk}/")
    page.wait_for_selector('.live-bar[data-state="live"]')
    assert page.locator(".meter rect.meter-spent").count() >= 1
    assert page.evaluate("() => window.tetherViolations") == []

    page.click(".top-nav >> text=Tokens")
    page.wait_for_url(server.url + "/tokens/")
    page.fill("#id_name", "laptop")
    page.click("text=Make token")
    secret = page.locator("[data-new-token]").inner_text()
    assert re.fullmatch(r"tth_[A-Za-z0-9_-]{20,}", secret)
    page.reload()  # the page a POST redirected to: reloading it mints nothing and shows nothing
    assert page.locator("[data-new-token]").count() == 0
    page.click("summary:has-text('Revoke')")  # destructive: it asks first
    page.click("button:has-text('Yes, revoke it')")
    page.wait_for_selector("text=Revoked the token")
    assert page.evaluate("() => window.tetherViolations") == []
    assert reported == []
    context.close()
