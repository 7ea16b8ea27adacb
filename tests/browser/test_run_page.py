"""The run page keeps up with a person, in headless Chromium against daphne and a real worker.

A waiting run's actions change live (answer / close, then what a finished run offers); a failed
action says why (a server 4xx, offline, no answer in time); Stop asks first and the run then reads
"stopped by ada"; follow-latest keeps the newest event in view and "jump to latest" brings it back;
the receipt reads as a page with its signature checked, and downloads as a file that verifies.
Each runs on a phone and on a laptop (the `device` fixture).
"""

import json
import re
import time

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from loops import services
from loops.models import Event, Run
from tests.browser.conftest import Server, wait_until_shown_finished
from tests.loops.conftest import drive_in_thread
from tests.support.cluster import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw-ada-123"
IN_VIEW_JS = """(sel) => { const r = document.querySelector(sel).getBoundingClientRect();
    return r.bottom > 0 && r.top < window.innerHeight; }"""


@pytest.fixture
def ada(django_user_model):
    return django_user_model.objects.create_user("ada", password=PASSWORD)


def sign_in(page, base_url, next_path):
    page.goto(base_url + next_path)
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(re.escape(base_url + next_path) + "$"))


def keeps_its_page(page):
    """Mark the document; `still_same(page)` then says no reload happened."""
    page.evaluate("() => { window.tetherSamePage = 1; }")


def still_same(page):
    return page.evaluate("() => window.tetherSamePage === 1")


def test_a_waiting_runs_actions_change_live(browser, server, worker, ada, make_instance, script, artifacts, device):
    agent = script(
        """
        instruction = sys.stdin.read()
        for _ in range(300):  # the test opens the page first, then lets the agent go on
            if pathlib.Path('go').exists():
                break
            time.sleep(0.1)
        if 'blue' not in instruction:
            print('TETHER_ESCALATE: Which colour should the button be?', file=sys.stderr)
            sys.exit(3)
        pathlib.Path('colour.txt').write_text('blue')
        print('painted it blue')
        """
    )
    check = script("sys.exit(0 if pathlib.Path('colour.txt').exists() else 1)")
    instance = make_instance(ada, name="painter", command=agent, checks=[{"name": "painted", "command": check}])
    run = services.run_start(instance=instance, user=ada, objective="Paint the button", max_iterations=4)
    errors = []
    name, options = device
    context = browser.new_context(**options)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, server.url, f"/runs/{run.pk}/")
    actions = f"#run-{run.pk}-actions"
    page.wait_for_selector('.live-bar[data-state="live"]')
    keeps_its_page(page)
    page.wait_for_selector(f'#run-{run.pk}-timeline article[data-kind="act.started"]', state="attached", timeout=20_000)
    assert page.locator(f"{actions} >> text=Close without answering").count() == 0
    assert page.locator(f"{actions} button", has_text="Send message").is_visible()
    (instance.workspace_path() / "go").write_text("go")

    # The agent asks: answer and close appear without a reload.
    page.wait_for_selector(f"{actions} >> text=Close without answering", timeout=20_000)
    assert page.locator(f"{actions} button", has_text="Send answer").is_visible()
    assert "Which colour should the button be?" in page.inner_text(f"#run-{run.pk}-summary")
    assert still_same(page)
    page.screenshot(path=str(artifacts / f"{name}-run-waiting.png"), full_page=True)

    page.fill(f"{actions} textarea", "Make it blue")
    page.click(f"{actions} >> text=Send answer")
    # It resumes, finishes, and the actions follow: no answer or close; a way to start another run,
    # and to continue this one (every finished run can be, a verified done as a follow-up).
    page.wait_for_selector(f'#run-{run.pk}-summary[data-status="finished"]', timeout=30_000)
    page.wait_for_selector(f"{actions} >> text=Start another run of painter")
    assert page.locator(f"{actions} >> text=Close without answering").count() == 0
    assert page.locator(f"{actions} button", has_text="Send answer").count() == 0
    assert page.locator(f"{actions} button", has_text="Continue as a new run").count() == 1
    assert still_same(page)
    assert Run.objects.get(pk=run.pk).outcome == "done"
    page.wait_for_selector('.live-bar[data-state="ended"]')
    assert "live" not in page.inner_text(".live-status")
    assert errors == []
    context.close()


@pytest.fixture
def long_runner(ada, make_instance, script):
    agent = script(
        """
        count = pathlib.Path('count')
        n = int(count.read_text()) + 1 if count.exists() else 1
        count.write_text(str(n))
        time.sleep(0.4)
        print(f'step {n}')
        """
    )
    # fails with a new count each time: the next instruction differs, so the run is never "no progress"
    check = script("n = pathlib.Path('count').read_text(); print('only', n, 'steps so far'); sys.exit(1)")
    return make_instance(ada, name="stepper", command=agent, checks=[{"name": "never", "command": check}],
                         max_iterations=200)


def test_a_failed_action_says_why_and_a_stop_asks_first(browser, server, worker, ada, long_runner, artifacts,
                                                         device):
    run = services.run_start(instance=long_runner, user=ada, objective="Keep stepping", max_iterations=200)
    errors = []
    name, options = device
    context = browser.new_context(**options)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, server.url, f"/runs/{run.pk}/")
    actions = f"#run-{run.pk}-actions"
    page.wait_for_selector('.live-bar[data-state="live"]')
    page.wait_for_selector(f'#run-{run.pk}-timeline article[data-kind="iteration.finished"]', state="attached", timeout=20_000)

    # Stop asks first; "keep it running" changes nothing.
    page.click(f"{actions} .stop-confirm > summary")
    assert page.locator(f"{actions} >> text=Yes, stop it").is_visible()
    page.click(f"{actions} >> text=Keep it running")
    assert not page.locator(f"{actions} >> text=Yes, stop it").is_visible()
    assert Run.objects.get(pk=run.pk).cancel_requested_at is None

    # Offline: the stop is not sent, and the page says so.
    page.click(f"{actions} .stop-confirm > summary")
    context.set_offline(True)
    page.click(f"{actions} >> text=Yes, stop it")
    alert = page.wait_for_selector(f"{actions} [data-action-error]", timeout=10_000)
    assert "offline" in alert.inner_text() and "Not sent" in alert.inner_text()
    page.screenshot(path=str(artifacts / f"{name}-stop-offline.png"), full_page=True)
    time.sleep(0.5)
    assert Run.objects.get(pk=run.pk).cancel_requested_at is None
    context.set_offline(False)
    page.wait_for_selector('.live-bar[data-state="live"]', timeout=20_000)

    # A server refusal (4xx) is shown with the server's words: here the message goes to a run
    # that is not this user's any more (handed to another owner meanwhile).
    from django.contrib.auth import get_user_model

    other = get_user_model().objects.create_user("bo", password="pw-bo-123")
    Run.objects.filter(pk=run.pk).update(owner=other)
    page.fill(f"{actions} textarea", "are you there?")
    page.click(f"{actions} >> text=Send message")
    alert = page.wait_for_selector(f"{actions} [data-action-error]", timeout=10_000)
    assert "HTTP 404" in alert.inner_text() and "Not found" in alert.inner_text()
    assert page.input_value(f"{actions} textarea") == "are you there?"  # what was typed is kept
    Run.objects.filter(pk=run.pk).update(owner=ada)

    # Back online and the run is ada's again: the stop (its confirmation still open) goes through,
    # and reads as hers.
    assert page.locator(f"{actions} >> text=Yes, stop it").is_visible()
    page.click(f"{actions} >> text=Yes, stop it")
    wait_until_shown_finished(page, run.pk, errors)
    assert page.locator(f"{actions} [data-action-error]").count() == 0
    summary = page.inner_text(f"#run-{run.pk}-summary")
    assert "Stopped by ada" in summary
    page.wait_for_selector(f'#run-{run.pk}-timeline article[data-kind="run.finished"]')
    finished = page.inner_text(f'#run-{run.pk}-timeline article[data-kind="run.finished"]')
    assert "Stopped by ada" in finished
    timeline = page.inner_text(f"#run-{run.pk}-timeline")
    assert "Decision: failed" not in timeline
    page.screenshot(path=str(artifacts / f"{name}-stopped-by.png"), full_page=True)
    assert errors == []
    context.close()


def test_follow_latest_and_jump_to_latest(browser, server, worker, ada, long_runner, artifacts, device):
    run = services.run_start(instance=long_runner, user=ada, objective="Keep stepping", max_iterations=200)
    wait_for(lambda: Run.objects.get(pk=run.pk).iterations_done >= 4, 30, "a few iterations")
    errors = []
    name, options = device
    context = browser.new_context(**options)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, server.url, f"/runs/{run.pk}/")
    page.wait_for_selector('.live-bar[data-state="live"]')
    latest = f"#run-{run.pk}-latest"
    # Older finished iterations fold by themselves; their headers stay.
    folded = page.locator(f"#run-{run.pk}-timeline article.folded")
    assert folded.count() >= 1
    assert not page.locator(f'#run-{run.pk}-timeline article[data-kind="act.finished"][data-iteration="1"]').is_visible()

    # A live run opens following its newest events.
    assert page.get_attribute("[data-follow]", "aria-pressed") == "true"
    for _ in range(3):
        last = int(page.get_attribute("[ws-connect]", "data-last-seq"))
        wait_for(lambda last=last: int(page.get_attribute("[ws-connect]", "data-last-seq")) > last + 2, 15, "new events")
        try:  # following brings each newest event into view (a busy machine may take a moment)
            page.wait_for_function(IN_VIEW_JS, arg=latest, timeout=5_000)
        except PlaywrightTimeout:
            raise AssertionError("following, yet the newest event stayed out of view for 5 s") from None

    # Scrolling up to read stops following; "jump to latest" then says how much is new and goes there.
    # (Read in the timeline: where the floating jump would cover a button, as the actions at the top
    # of a phone's page, it stays hidden.)
    for _ in range(20):
        page.evaluate(f"() => document.querySelector('#run-{run.pk}-timeline article.ev').scrollIntoView()")
        time.sleep(0.25)
        if page.get_attribute("[data-follow]", "aria-pressed") == "false":
            break
    assert page.get_attribute("[data-follow]", "aria-pressed") == "false"
    jump = page.locator("[data-jump-latest]")
    jump.wait_for(state="visible", timeout=15_000)
    page.wait_for_function("() => /\\d+ new/.test(document.querySelector('[data-new-count]').textContent)", timeout=15_000)
    page.screenshot(path=str(artifacts / f"{name}-jump-to-latest.png"))
    jump.click()
    page.wait_for_function(IN_VIEW_JS, arg=latest, timeout=5_000)

    # An iteration folds and unfolds by hand.
    toggle = page.locator(f'#run-{run.pk}-timeline [data-iter-toggle="1"]').first
    body = page.locator(f'#run-{run.pk}-timeline article[data-kind="act.finished"][data-iteration="1"]')
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true" and body.is_visible()
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "false" and not body.is_visible()
    services.run_cancel(run=Run.objects.get(pk=run.pk), user=ada)
    assert errors == []
    context.close()


def test_the_receipt_page(browser, server, ada, make_instance, script, artifacts, tmp_path, device):
    from reviews import receipts

    agent = script("pathlib.Path('done.txt').write_text('ok'); print('all done')")
    check = script("sys.exit(0 if pathlib.Path('done.txt').exists() else 1)")
    instance = make_instance(ada, name="finisher", command=agent, checks=[{"name": "done", "command": check}])
    run = drive_in_thread(services.run_start(instance=instance, user=ada, objective="Finish the job"))
    assert run.outcome == "done"
    errors = []
    name, options = device
    context = browser.new_context(**options, accept_downloads=True)
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, server.url, f"/runs/{run.pk}/")
    page.click("text=signed receipt")
    page.wait_for_url(f"{server.url}/runs/{run.pk}/receipt")
    badge = page.locator('[data-signature="valid"]')
    assert badge.is_visible() and badge.inner_text() == "signature valid"
    body = page.inner_text("main")
    assert "Finish the job" in body and "finisher" in body and '"mac"' not in body
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")
    page.screenshot(path=str(artifacts / f"{name}-receipt.png"), full_page=True)
    with page.expect_download() as download:
        page.click("[data-receipt-download]")
    saved = tmp_path / "receipt.json"
    download.value.save_as(saved)
    assert download.value.suggested_filename == f"tether-run-{run.pk}-receipt.json"
    assert receipts.verify(json.loads(saved.read_text())).ok
    assert errors == []
    context.close()


@pytest.fixture
def impatient_server(tmp_path):
    """A server whose pages give an action 1 s to be answered (TETHER_CONSOLE_TIMEOUT_SECONDS), not 20."""
    started = Server(tmp_path, TETHER_CONSOLE_TIMEOUT_SECONDS="1")
    yield started
    started.stop()


def test_an_action_with_no_answer_in_time_says_so(browser, impatient_server, ada, make_instance, script, device):
    run = services.run_start(instance=make_instance(ada, name="idle", command=script("print('hi')")), user=ada,
                             objective="Wait for a worker")
    errors = []
    context = browser.new_context(**device[1])
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, impatient_server.url, f"/runs/{run.pk}/")
    assert page.get_attribute("body", "data-request-timeout") == "1"
    held = []
    page.route(f"**/runs/{run.pk}/interject", lambda route: held.append(route))  # never reaches the server
    actions = f"#run-{run.pk}-actions"
    page.fill(f"{actions} textarea", "still there?")
    page.click(f"{actions} >> text=Send message")
    alert = page.wait_for_selector(f"{actions} [data-action-error]", timeout=10_000)
    assert "No answer from Tether within 1 s" in alert.inner_text()
    assert len(held) == 1 and page.input_value(f"{actions} textarea") == "still there?"
    assert page.locator(f"{actions} button", has_text="Send message").is_enabled()  # it can be tried again
    assert not Event.objects.filter(run=run, kind="interjection.queued").exists()
    assert errors == []
    context.close()
