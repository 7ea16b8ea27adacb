"""Where the money went, in headless Chromium: readable on a phone, an overdraft in red, older iterations on demand."""

import re

import pytest

from budgets import services as budget_services
from budgets.models import Reservation
from loops import services
from tests.browser.conftest import LAPTOP, PHONE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw-ada-123"
NO_SIDEWAYS_SCROLL_JS = "() => document.documentElement.scrollWidth <= window.innerWidth"
RED = "rgb(180, 35, 24)"  # --bad in console.css


@pytest.fixture
def run_with_a_trail(django_user_model, make_instance):
    """A run of 14 iterations of metered calls with long model names; its last iteration overdrew."""
    user = django_user_model.objects.create_user("ada", password=PASSWORD)
    inst = make_instance(user, name="a-rather-long-instance-name-for-a-narrow-screen")
    run = services.run_start(instance=inst, user=user, objective="spend", max_iterations=100, max_cost_usd="5")
    chain = budget_services.open_run_pools(run).chain_ids()
    rows = [
        Reservation(
            run_id=run.pk, iteration=n, call=c, model="claude-sonnet-4-5-20250929-with-a-long-suffix",
            status="settled", chain=chain, amount=123_456, actual=98_765,
            usage={"input_tokens": 123_456, "output_tokens": 7_890, "cache_write_tokens": 4_567,
                   "cache_read_tokens": 89_012},
        )
        for n in range(1, 15)
        for c in range(1, 4)
    ]
    rows.append(Reservation(run_id=run.pk, iteration=14, call=0, status="settled", chain=chain,
                            amount=50_000, actual=50_000_000, overdraft=49_950_000))
    Reservation.objects.bulk_create(rows)
    return run


def sign_in(page, base_url, next_path):
    page.goto(base_url + next_path)
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(base_url + next_path) + "$"))


def test_the_money_trail_fits_a_phone_and_shows_an_overdraft_in_red(browser, server, run_with_a_trail, artifacts):
    run = run_with_a_trail
    errors = []
    for name, device in (("phone", PHONE), ("laptop", LAPTOP)):
        context = browser.new_context(**device)
        page = context.new_page()
        page.on("pageerror", lambda exc, name=name: errors.append(f"{name}: {exc}"))
        page.on(
            "response",
            lambda r, name=name: errors.append(f"{name}: {r.status} {r.url}")
            if r.status >= 400 and not r.url.endswith("/favicon.ico") else None,
        )
        sign_in(page, server.url, f"/runs/{run.pk}/")
        costs = page.locator(f"#run-{run.pk}-costs")
        costs.scroll_into_view_if_needed()
        assert page.evaluate(NO_SIDEWAYS_SCROLL_JS), f"the run page scrolls sideways on a {name}"
        overdraft = costs.locator('li.call.overdraft[data-call="14.0"]')
        assert overdraft.is_visible()
        assert "the agent reported $50.00 against $0.05 reserved" in overdraft.inner_text()
        assert page.evaluate("(el) => getComputedStyle(el).color", overdraft.locator(".overdraft-cause").element_handle()) == RED
        metered = costs.locator('li.call[data-call="14.1"]')
        assert "123,456 in · 7,890 out" in metered.inner_text()
        assert costs.locator("details.cost-iteration").count() == 10
        # Iteration 13 starts closed; a viewer opens it. Older iterations come on demand.
        closed = page.locator(f"#run-{run.pk}-cost-13")
        assert closed.get_attribute("open") is None
        closed.locator("summary").click()
        assert closed.get_attribute("open") is not None
        page.click("text=Show earlier iterations (before 5)")
        page.wait_for_selector(f"#run-{run.pk}-cost-1")
        assert costs.locator("details.cost-iteration").count() == 14
        assert page.evaluate(NO_SIDEWAYS_SCROLL_JS), f"the older iterations scroll sideways on a {name}"
        costs.screenshot(path=str(artifacts / f"{name}-money-trail.png"))
        context.close()
    assert errors == []
