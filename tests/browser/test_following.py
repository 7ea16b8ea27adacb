"""Following a live run (issue 26, items 5 and 13), in headless Chromium against daphne and a real worker.

A live run opens following its newest events, with "Now: iteration N — …" at its top; "Jump to latest"
lands on the newest event; the floating "Jump to latest ↓" never covers a control; after a stop the
"Stopped by ada" event is in view, the floating pill is gone and the receipt link is there, without a
reload; no live swap breaks the CSP. Each runs on a phone and on a laptop (the `device` fixture).
"""

import re

import pytest
from playwright.sync_api import expect

from loops import services
from loops.models import Run
from tests.browser.conftest import wait_live, wait_until_shown_finished
from tests.browser.test_run_page import ada, keeps_its_page, sign_in, still_same  # noqa: F401 - ada: a fixture
from tests.support.cluster import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

VIOLATIONS_JS = """() => {
  window.tetherViolations = [];
  document.addEventListener("securitypolicyviolation", (e) => window.tetherViolations.push(e.violatedDirective + " " + e.blockedURI));
}"""
IN_VIEW = "(el) => { const r = el.getBoundingClientRect(); return r.height > 0 && r.bottom > 0 && r.top < window.innerHeight; }"
# (An "act started" event hides once its "act finished" follows: the newest that stays is looked for.)
NEWEST = ("(id) => Array.from(document.querySelectorAll('#run-' + id + '-timeline article.ev'))"
          ".filter((a) => a.getClientRects().length && a.dataset.kind !== 'act.started').pop()")
NEWEST_IN_VIEW = f"(id) => {{ const a = ({NEWEST})(id); return !!a && ({IN_VIEW})(a); }}"
# The floating pill, when shown, overlaps no button, summary, field or link of the actions and timeline tools.
PILL_COVERS = """() => {
  const pill = document.querySelector('[data-jump-latest]');
  if (!pill || pill.hidden || !pill.getBoundingClientRect().height) return [];
  const p = pill.getBoundingClientRect();
  return Array.from(document.querySelectorAll('[data-actions] button, [data-actions] summary, [data-actions] textarea, [data-timeline-tools] button, [data-timeline-tools] a'))
    .filter((c) => { const r = c.getBoundingClientRect();
      return r.width > 0 && r.height > 0 && r.left < p.right && r.right > p.left && r.top < p.bottom && r.bottom > p.top; })
    .map((c) => c.textContent.trim());
}"""
CONTROLS = "[data-actions] button:visible, [data-actions] summary:visible, [data-timeline-tools] button:visible"


@pytest.fixture
def long_runner(ada, make_instance, script):  # noqa: F811
    """An agent that steps for ever, each step a small reported spend (the page grows below the timeline too)."""
    agent = script(
        """
        count = pathlib.Path('count')
        n = int(count.read_text()) + 1 if count.exists() else 1
        count.write_text(str(n))
        json.dump({'cost_usd': 0.001}, open(os.environ['TETHER_USAGE_FILE'], 'w'))
        time.sleep(0.4)
        print(f'step {n}')
        """
    )
    check = script("n = pathlib.Path('count').read_text(); print('only', n, 'steps so far'); sys.exit(1)")
    return make_instance(ada, name="stepper", command=agent, checks=[{"name": "never", "command": check}],
                         max_iterations=200)


def test_a_live_run_is_followed_and_its_stop_is_shown(browser, server, worker, ada, long_runner, device):  # noqa: F811
    run = services.run_start(instance=long_runner, user=ada, objective="Keep stepping", max_iterations=200)
    wait_for(lambda: Run.objects.get(pk=run.pk).iterations_done >= 8, 60, "a few iterations")
    context = browser.new_context(**device[1])
    page = context.new_page()
    page.add_init_script(f"({VIOLATIONS_JS})()")
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: "Content Security Policy" in m.text and errors.append(m.text))
    sign_in(page, server.url, f"/runs/{run.pk}/")
    wait_live(page, errors)
    keeps_its_page(page)

    # It opens following: the newest event in view, and it stays so as events come.
    expect(page.locator("[data-follow]")).to_have_attribute("aria-pressed", "true")
    expect(page.locator(f"#run-{run.pk}-summary [data-now]")).to_have_text(
        re.compile(r"^Now: iteration \d+ — (acting|checking|deciding|starting)$"))
    last = int(page.get_attribute("[ws-connect]", "data-last-seq"))
    page.wait_for_function(f"() => +document.querySelector('[ws-connect]').dataset.lastSeq > {last + 2}", timeout=15_000)
    page.wait_for_function(NEWEST_IN_VIEW, arg=run.pk, timeout=5_000)

    # Read from the top, then "Jump to latest": the event newest at that moment is in view.
    page.evaluate("() => window.scrollTo(0, 0)")
    expect(page.locator("[data-follow]")).to_have_attribute("aria-pressed", "false")
    newest = page.evaluate(f"() => ({NEWEST})({run.pk}).id")
    page.locator(".timeline-tools").get_by_role("link", name="Jump to latest").click()
    page.wait_for_function(f"() => ({IN_VIEW})(document.getElementById('{newest}'))", timeout=3_000)

    # The floating pill covers no control, wherever the page is.
    page.evaluate("() => window.scrollTo(0, 0)")
    page.locator(f"#run-{run.pk}-actions .stop-confirm > summary").click()
    for i in range(page.locator(CONTROLS).count()):
        page.locator(CONTROLS).nth(i).evaluate("(c) => c.scrollIntoView({block: 'end'})")
        page.wait_for_function(f"() => ({PILL_COVERS})().length === 0", timeout=3_000)

    # Stopped from the page: the "Stopped by ada" event comes into view, the pill goes, the receipt link comes.
    page.locator(f"#run-{run.pk}-actions").get_by_role("button", name="Yes, stop it").click()
    wait_for(lambda: Run.objects.get(pk=run.pk).cancel_requested_at, 10, "the stop to be asked")
    wait_until_shown_finished(page, run.pk, errors)
    stopped = page.locator(f'#run-{run.pk}-timeline article[data-kind="run.finished"]')
    expect(stopped).to_contain_text("Stopped by ada", timeout=10_000)
    page.wait_for_function(f"() => ({IN_VIEW})(document.querySelector('#run-{run.pk}-timeline article[data-kind=\"run.finished\"]'))",
                           timeout=5_000)
    expect(page.locator("[data-jump-latest]")).to_be_hidden()
    expect(page.locator(f"#run-{run.pk}-summary [data-now]")).to_have_count(0)
    expect(page.locator(f"#run-{run.pk}-links [data-receipt]")).to_be_visible()
    page.get_by_role("button", name="Continue as a new run").scroll_into_view_if_needed()
    assert page.evaluate(PILL_COVERS) == []
    assert still_same(page)
    assert page.evaluate("() => window.tetherViolations") == []
    assert errors == []
    context.close()


def test_a_finished_run_opens_at_its_top_without_the_pill(browser, server, ada, long_runner, device):  # noqa: F811
    from django.utils import timezone

    from tests.console.conftest import ONE_ITERATION, record

    run = services.run_start(instance=long_runner, user=ada, objective="Keep stepping")
    for _ in range(15):
        record(run, ONE_ITERATION)
    record(run, [("run.finished", {"outcome": "done", "iterations": 15, "spent_usd": "0.018"})])
    Run.objects.filter(pk=run.pk).update(status="finished", outcome="done", finished_at=timezone.now())
    context = browser.new_context(**device[1])
    page = context.new_page()
    sign_in(page, server.url, f"/runs/{run.pk}/")
    page.wait_for_selector('.live-bar[data-state="ended"]')
    expect(page.locator("[data-follow]")).to_have_attribute("aria-pressed", "false")
    assert page.evaluate("() => window.scrollY") == 0
    page.evaluate("() => window.scrollTo(0, 0)")
    expect(page.locator("[data-jump-latest]")).to_be_hidden()
    context.close()
