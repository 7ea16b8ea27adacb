"""Schedules in a real browser, on a phone and on a laptop: make one (its next firings previewed before
saving), pause it, press "Run now", and read the firing history."""

import pytest

from instances.models import Instance
from triggers.models import Firing, Schedule

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw-ada-123"


def sign_in(page, server):
    page.goto(server.url + "/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/")


def test_make_preview_pause_run_now_and_read_the_firings(
    django_user_model, server, browser, artifacts, device
):
    user = django_user_model.objects.create_user("ada", password=PASSWORD)
    instance = Instance.objects.create(owner=user, name="inbox", command=["true"])
    name, options = device
    context = browser.new_context(**options)
    page = context.new_page()
    sign_in(page, server)
    page.goto(f"{server.url}/instances/{instance.pk}/")
    page.click("a:has-text('Schedules')")
    page.wait_for_url(f"{server.url}/instances/{instance.pk}/schedules/")
    page.fill("#id_name", "weekday triage")
    page.fill("#id_objective_template", "Triage the issues of {date}")
    page.fill("#id_cron", "0 9 * * 1-5")
    page.fill("#id_timezone", "Europe/Paris")
    page.click("button:has-text('Preview the next firings')")
    preview = page.wait_for_selector("[data-preview]")
    assert len(preview.query_selector_all("li time")) == 5
    assert not Schedule.objects.exists()  # previewed, not saved
    page.screenshot(path=str(artifacts / f"schedule-preview-{name}.png"), full_page=True)
    page.click("button:has-text('Make schedule')")
    card = page.wait_for_selector("section.schedule")
    assert "active" in card.query_selector("[data-schedule-state]").inner_text()
    schedule = Schedule.objects.get()
    assert (schedule.cron, schedule.timezone) == ("0 9 * * 1-5", "Europe/Paris")
    page.click(f"#schedule-{schedule.pk} button:has-text('Pause')")
    page.wait_for_selector(f"#schedule-{schedule.pk} [data-schedule-state]:has-text('paused')")
    page.click(f"#schedule-{schedule.pk} button:has-text('Run now')")
    started = page.wait_for_selector(f"#schedule-{schedule.pk} .firing[data-outcome='started']")
    firing = Firing.objects.get()
    assert firing.manual and firing.run_id and f"run {firing.run_id}" in started.inner_text()
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px on the {name}"
    page.screenshot(path=str(artifacts / f"schedule-firings-{name}.png"), full_page=True)
    page.click(f"#schedule-{schedule.pk} .firing a:has-text('run {firing.run_id}')")
    page.wait_for_url(f"{server.url}/runs/{firing.run_id}/")
    assert f"by schedule {schedule.pk} (firing {firing.pk})" in page.inner_text("[data-run-origin]")
    context.close()
