"""Live swaps break no Content-Security-Policy rule (issue #26, item 13: "the browser logs a CSP
'inline style blocked' error on every live swap").

A run steps with a real worker while its page and the fleet are open, in headless Chromium against
daphne; its message box has been resized by hand, which gives it an inline style (the browser sets
it through the CSSOM, which the policy allows). Through several live updates (timeline, summary,
actions, chart, fleet rows) and the run's end, the browser logs no "Content Security Policy" message
and fires no securitypolicyviolation event: settling a swap, htmx copied the old element's style
attribute onto the new one with setAttribute, which `style-src 'self'` blocks, on every swap.
"""

import pytest

from loops import services
from loops.models import Run
from tests.browser.conftest import wait_until_shown_finished
from tests.browser.test_run_page import ada, sign_in  # noqa: F401 - ada: a fixture
from tests.support.cluster import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.slow]

VIOLATIONS_JS = """() => {
  window.tetherViolations = [];
  document.addEventListener("securitypolicyviolation", (e) => window.tetherViolations.push(e.violatedDirective + " " + e.blockedURI));
}"""
LAST_SEQ = "() => +document.querySelector('[ws-connect]').dataset.lastSeq"


@pytest.fixture
def stepper(ada, make_instance, script):  # noqa: F811
    agent = script(
        """
        count = pathlib.Path('count')
        n = int(count.read_text()) + 1 if count.exists() else 1
        count.write_text(str(n))
        json.dump({'cost_usd': 0.001}, open(os.environ['TETHER_USAGE_FILE'], 'w'))
        time.sleep(0.3)
        print(f'step {n}')
        """
    )
    check = script("n = pathlib.Path('count').read_text(); print('only', n, 'steps so far'); sys.exit(1)")
    return make_instance(
        ada, name="stepper", command=agent, checks=[{"name": "never", "command": check}], max_iterations=200
    )


def test_live_swaps_raise_no_csp_error(browser, server, worker, ada, stepper, device):  # noqa: F811
    run = services.run_start(
        instance=stepper, user=ada, objective="Keep stepping", max_iterations=200, max_cost_usd="5"
    )
    context = browser.new_context(**device[1])
    context.add_init_script(f"({VIOLATIONS_JS})()")
    reported: list[str] = []
    fleet = context.new_page()
    fleet.on("console", lambda m: "Content Security Policy" in m.text and reported.append(m.text))
    fleet.on("pageerror", lambda exc: reported.append(str(exc)))
    sign_in(fleet, server.url, "/")
    fleet.wait_for_selector('.live-bar[data-state="live"]')
    fleet.wait_for_selector(f'#fleet-active [data-run="{run.pk}"]', state="attached", timeout=30_000)
    page = context.new_page()
    page.on("console", lambda m: "Content Security Policy" in m.text and reported.append(m.text))
    page.on("pageerror", lambda exc: reported.append(str(exc)))
    page.goto(f"{server.url}/runs/{run.pk}/")
    page.wait_for_selector('.live-bar[data-state="live"]')
    # A person resizes the message box by its handle: the browser gives it an inline style (through the
    # CSSOM, which the policy allows). So, here, do the parts that live swaps replace.
    page.evaluate(f"""() => ['run-{run.pk}-summary', 'run-{run.pk}-actions', 'run-{run.pk}-chart']
        .map((id) => document.getElementById(id)).filter(Boolean)
        .concat(Array.from(document.querySelectorAll('[data-actions] textarea[id]')))
        .forEach((el) => {{ el.style.minHeight = '120px'; }})""")
    assert page.locator("[data-actions] textarea[id][style]").count() == 1

    # Several live updates, each waited for: the page's last seq moves on, again and again.
    for _ in range(4):
        seen = page.evaluate(LAST_SEQ)
        page.wait_for_function(f"() => ({LAST_SEQ})() > {seen}", timeout=30_000)
    wait_for(lambda: Run.objects.get(pk=run.pk).iterations_done >= 3, 60, "a few iterations")

    services.run_cancel(run=Run.objects.get(pk=run.pk), user=ada)
    wait_until_shown_finished(page, run.pk, reported)
    fleet.wait_for_function(
        f"() => !document.querySelector('#fleet-active [data-run=\"{run.pk}\"]')", timeout=15_000
    )
    for each in (page, fleet):
        reported += each.evaluate("() => window.tetherViolations")
    assert reported == []
    context.close()
