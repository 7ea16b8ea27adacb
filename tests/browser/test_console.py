"""The console in headless Chromium against daphne and a real worker.

A phone signs in, starts a run and closes its page; a laptop (another device) opens the run,
sees iterations arrive live, interjects, loses its socket and gets it back, and stops the run.
Both end up showing the same timeline: every event once, none missing.
"""

import re
import time

import pytest

from loops.models import Event, Interjection, Run
from tests.browser.conftest import LAPTOP, PHONE
from tests.support.cluster import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw-ada-123"
MESSAGE = "Also write a one-line summary at the end"

TIMELINE_JS = """(runId) => Array.from(document.querySelectorAll(`#run-${runId}-timeline article[data-seq]`)).map(
    (a) => [Number(a.dataset.seq), a.dataset.kind, a.textContent.replace(/\\s+/g, " ").trim()])"""
NO_SIDEWAYS_SCROLL_JS = "() => document.documentElement.scrollWidth <= window.innerWidth"


@pytest.fixture
def agent_instance(django_user_model, make_instance, script):
    user = django_user_model.objects.create_user("ada", password=PASSWORD)
    agent = script(
        """
        count = pathlib.Path('count')
        n = int(count.read_text()) + 1 if count.exists() else 1
        count.write_text(str(n))
        instruction = sys.stdin.read()
        pathlib.Path(os.environ['TETHER_USAGE_FILE']).write_text(
            json.dumps({'input_tokens': 400 + 10 * n, 'output_tokens': 50, 'cost_usd': round(0.0004 * n, 6)})
        )
        time.sleep(1.0)
        print(f'pass {n}: drafted section {n} of the report')
        if 'summary' in instruction:
            print('noted: a summary at the end')
        """
    )
    check = script(
        "n = int(pathlib.Path('count').read_text()); print('sections', n); sys.exit(0 if n >= 500 else 1)"
    )
    instance = make_instance(
        user,
        name="report-writer",
        command=agent,
        checks=[{"name": "sections", "command": check, "required": True}],
        max_iterations=60,
        objective_max_chars=300,
    )
    return user, instance


def sign_in(page, base_url, next_path):
    page.goto(base_url + next_path)
    assert "/login/" in page.url
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(base_url + next_path) + "$"))


def timeline(page, run_id):
    return page.evaluate(TIMELINE_JS, run_id)


def assert_whole(rows, what):
    seqs = [row[0] for row in rows]
    assert len(seqs) == len(set(seqs)), f"{what}: an event is shown twice: {seqs}"
    assert sorted(seqs) == list(range(1, max(seqs) + 1)), f"{what}: a gap in the timeline: {sorted(seqs)}"


def count_kind(page, run_id, kind):
    return page.locator(f'#run-{run_id}-timeline article[data-kind="{kind}"]').count()


def test_phone_starts_a_run_laptop_watches_interjects_and_stops_it(
    browser, server, worker, agent_instance, artifacts
):
    user, instance = agent_instance
    errors = []

    # --- the phone: sign in, start the run, close the page ---------------------------------
    phone = browser.new_context(**PHONE)
    page = phone.new_page()
    page.on("pageerror", lambda exc: errors.append(f"phone: {exc}"))
    sign_in(page, server.url, f"/instances/{instance.pk}/")
    objective = page.locator("#id_objective")
    objective.fill("x" * 301)
    counter = page.locator('[data-count-for="id_objective"]')
    assert "301 / 300" in counter.inner_text() and "too long" in counter.inner_text()
    objective.fill("Write the quarterly report, one section per pass")
    assert counter.inner_text().startswith("48 / 300")
    page.fill("#id_max_iterations", "40")
    page.fill("#id_max_cost_usd", "5")
    assert page.evaluate(NO_SIDEWAYS_SCROLL_JS), "the instance page scrolls sideways on a phone"
    page.screenshot(path=str(artifacts / "phone-instance.png"), full_page=True)
    page.click("text=Start run")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    run_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))
    run = Run.objects.get(pk=run_id)
    assert (run.owner, run.instance, run.max_iterations, run.max_cost_micros) == (
        user,
        instance,
        40,
        5_000_000,
    )
    page.wait_for_selector(f'#run-{run_id}-timeline article[data-kind="iteration.started"]', timeout=15_000)
    page.wait_for_selector('.live-bar[data-state="live"]')
    assert page.evaluate(NO_SIDEWAYS_SCROLL_JS), "the run page scrolls sideways on a phone"
    page.screenshot(path=str(artifacts / "phone-run-started.png"), full_page=True)
    page.close()  # the run goes on without it

    # --- the laptop: another device finds the run and watches it ---------------------------
    laptop = browser.new_context(**LAPTOP)
    view = laptop.new_page()
    view.on("pageerror", lambda exc: errors.append(f"laptop: {exc}"))
    sign_in(view, server.url, "/")
    view.wait_for_selector(f"#active-row-{run_id}")
    view.wait_for_selector('.live-bar[data-state="live"]')
    view.screenshot(path=str(artifacts / "laptop-fleet.png"), full_page=True)
    view.click(f"#active-row-{run_id} a")
    view.wait_for_url(f"{server.url}/runs/{run_id}/")
    view.wait_for_selector('.live-bar[data-state="live"]')
    shown_at_load = count_kind(view, run_id, "iteration.started")
    wait_for(
        lambda: count_kind(view, run_id, "iteration.finished") >= shown_at_load + 1, 15, "a live iteration"
    )
    assert count_kind(view, run_id, "iteration.started") > shown_at_load, "no iteration arrived live"

    # --- interject --------------------------------------------------------------------------
    view.fill(f"#run-{run_id}-actions textarea", MESSAGE)
    view.click(f"#run-{run_id}-actions >> text=Send message")
    view.wait_for_selector(f"#run-{run_id}-actions .notice")
    assert "Sent" in view.inner_text(f"#run-{run_id}-actions .notice")
    assert view.input_value(f"#run-{run_id}-actions textarea") == ""  # a fresh form
    view.wait_for_selector(
        f'#run-{run_id}-timeline article[data-kind="interjection.queued"]:has-text("{MESSAGE}")'
    )
    view.wait_for_selector(
        f'#run-{run_id}-timeline article[data-kind="iteration.started"]:has-text("{MESSAGE}")', timeout=15_000
    )
    assert Interjection.objects.get(run_id=run_id).consumed_in_iteration is not None

    # --- the socket drops; events go on; it comes back and fills in -------------------------
    before_drop = max(row[0] for row in timeline(view, run_id))
    laptop.set_offline(True)
    view.evaluate("() => document.querySelector('[ws-connect]').tetherSocket.close()")
    view.wait_for_selector('.live-bar[data-state="offline"]')
    assert "offline" in view.inner_text(".live-status")
    wait_for(
        lambda: Run.objects.get(pk=run_id).last_seq >= before_drop + 4, 15, "events while the laptop is away"
    )
    laptop.set_offline(False)
    view.wait_for_selector('.live-bar[data-state="live"]', timeout=20_000)
    missed = Run.objects.get(pk=run_id).last_seq
    wait_for(lambda: max(row[0] for row in timeline(view, run_id)) >= missed, 10, "the missed events")
    assert_whole(timeline(view, run_id), "after the reconnect")

    # --- stop -----------------------------------------------------------------------------------
    wait_for(
        lambda: (
            Event.objects.filter(run_id=run_id, kind="act.started").count()
            > Event.objects.filter(run_id=run_id, kind="act.finished").count()
        ),
        10,
        "an act in progress",
    )
    view.click(f"#run-{run_id}-actions .stop-confirm > summary")  # Stop asks first
    clicked = time.monotonic()
    view.click(f"#run-{run_id}-actions >> text=Yes, stop it")
    view.wait_for_selector(f'#run-{run_id}-summary[data-status="finished"]', timeout=10_000)
    shown_after = time.monotonic() - clicked
    run.refresh_from_db()
    assert (run.status, run.outcome) == ("finished", "cancelled")
    assert (run.finished_at - run.cancel_requested_at).total_seconds() < 2, (
        "the stop took 2 s or more to land"
    )
    assert shown_after < 4, f"the page showed the stop {shown_after:.1f}s after the click"
    assert "cancelled" in view.inner_text(f"#run-{run_id}-summary [data-run-status]")
    view.wait_for_selector(f'#run-{run_id}-timeline article[data-kind="run.finished"]')
    assert not view.locator(f"#run-{run_id}-actions form.stop").is_visible()
    assert "Stopped by ada" in view.inner_text(f"#run-{run_id}-summary")

    # --- both devices show the same, whole timeline ----------------------------------------------
    again = phone.new_page()
    again.on("pageerror", lambda exc: errors.append(f"phone again: {exc}"))
    again.goto(f"{server.url}/runs/{run_id}/")
    again.wait_for_selector('.live-bar[data-state="ended"]')  # connected, and says the run will not change
    time.sleep(0.6)  # a socket that had anything to add would have added it by now
    on_phone, on_laptop = timeline(again, run_id), timeline(view, run_id)
    run.refresh_from_db()
    assert_whole(on_laptop, "laptop")
    assert max(row[0] for row in on_laptop) == run.last_seq
    assert sorted(on_laptop) == sorted(on_phone), "the two devices show different timelines"
    for page_ in (again, view):  # times are in the viewer's zone, live-added ones too
        assert page_.locator(f"#run-{run_id}-timeline time:not([data-local])").count() == 0
    first_time = view.locator(f"#run-{run_id}-timeline time").first
    assert first_time.get_attribute("title").endswith(" UTC")
    assert first_time.inner_text() != first_time.get_attribute("title").removesuffix(" UTC")
    assert "cancelled" in again.inner_text(f"#run-{run_id}-summary [data-run-status]")
    assert again.evaluate(NO_SIDEWAYS_SCROLL_JS), "the finished run page scrolls sideways on a phone"
    again.screenshot(path=str(artifacts / "phone-run-finished.png"), full_page=True)
    view.screenshot(path=str(artifacts / "laptop-run-finished.png"), full_page=True)
    assert not errors, errors
    phone.close()
    laptop.close()


def test_static_files_are_served_by_the_asgi_server(server):
    import urllib.request

    for path, marker in [
        ("/static/vendor/htmx.min.js", b"htmx"),
        ("/static/vendor/htmx-ext-ws.min.js", b'defineExtension("ws"'),
        ("/static/console/console.js", b"data-last-seq"),
        ("/static/console/console.css", b".timeline"),
    ]:
        with urllib.request.urlopen(server.url + path, timeout=5) as response:
            assert response.status == 200, path
            assert marker in response.read(), path
