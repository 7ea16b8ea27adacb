"""The "since you last looked" page in headless Chromium: one's own runs, what needs one, on a phone and a laptop."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from loops.models import Run
from reviews.models import DigestPreference
from tests.browser.conftest import DEVICES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw-ada-123"
NO_SIDEWAYS_SCROLL_JS = "() => document.documentElement.scrollWidth <= window.innerWidth"


@pytest.fixture
def looked_yesterday(django_user_model, make_instance):
    ada = django_user_model.objects.create_user("ada", password=PASSWORD)
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    DigestPreference.objects.create(user=ada, last_looked_at=timezone.now() - timedelta(days=1))
    mine, theirs = make_instance(ada, name="fixer"), make_instance(bob, name="bobs-secret")
    finished = dict(
        objective="work", max_iterations=3, status=Run.Status.FINISHED, finished_at=timezone.now()
    )
    for verified in (True, True, False):
        Run.objects.create(
            instance=mine, owner=ada, outcome="done", verified=verified, spent_micros=2_000_000, **finished
        )
    Run.objects.create(instance=mine, owner=ada, outcome="budget_exhausted", **finished)
    Run.objects.create(instance=theirs, owner=bob, outcome="done", verified=False, **finished)
    Run.objects.create(
        instance=mine,
        owner=ada,
        objective="ask",
        max_iterations=3,
        status=Run.Status.WAITING,
        outcome_detail="Which branch should I use?",
    )
    return ada


def test_the_since_you_last_looked_page(browser, server, looked_yesterday):
    errors = []
    for name, device in DEVICES.items():  # each device starts from a day ago (the one before marked it seen)
        DigestPreference.objects.filter(user=looked_yesterday).update(
            last_looked_at=timezone.now() - timedelta(days=1)
        )
        context = browser.new_context(**device)
        page = context.new_page()
        page.on("pageerror", lambda exc, name=name: errors.append(f"{name}: {exc}"))
        page.goto(server.url + "/reviews/digest/")
        page.fill("#id_username", "ada")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(re.escape(server.url + "/reviews/digest/") + "$"))
        assert page.locator("h1").inner_text() == "Since you last looked"
        assert page.locator("[data-finished]").inner_text().startswith("4 finished")
        assert page.locator("[data-unverified]").inner_text() == "1"
        needs = page.locator("[data-needs]").inner_text()
        assert "Which branch should I use?" in needs and "budget_exhausted" in needs
        assert page.locator("[data-runs] li").count() == 4
        assert "fixer: $6.00" in page.locator("[data-spenders]").inner_text()
        assert "bobs-secret" not in page.content()
        assert page.evaluate(NO_SIDEWAYS_SCROLL_JS), f"the digest page scrolls sideways on a {name}"
        page.reload()  # reading the page again marks nothing seen
        assert page.locator("[data-runs] li").count() == 4
        page.click("[data-mark-seen] button")
        page.wait_for_selector("text=No run finished since you last looked.")
        assert page.locator("[data-runs] li").count() == 0
        context.close()
    assert errors == []
