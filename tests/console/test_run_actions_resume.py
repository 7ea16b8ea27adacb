"""Budget exhausted: the run page offers "Resume with a cap of $…", pre-filled within what the pools can grant.

It says what the run used and what is left in each pool above it; a resume that would stop again at once
(no new cap, or one too small for an iteration) is refused and says why, instead of a "Resumed… /
Finished: budget exhausted" pair on every press; a pool that cannot grant an iteration says to raise it.
"""

import re

import pytest

from budgets import limits
from budgets import services as budget_services
from loops import services
from loops.models import Event
from tests.loops.conftest import drive_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

SPENDER = """
p = pathlib.Path('n'); n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n))
json.dump({'cost_usd': 0.03}, open(os.environ['TETHER_USAGE_FILE'], 'w'))
print('step', n)
"""
HX = {"HX-Request": "true"}


@pytest.fixture
def exhausted(user, make_instance, script, settings):
    """A run capped at $0.12 that stopped budget_exhausted after 3 iterations at $0.03 ($0.05 reserved each)."""
    settings.TETHER_COMMAND_ITERATION_RESERVE_USD = "0.05"
    check = script("print('n is', pathlib.Path('n').read_text()); sys.exit(1)\n")
    instance = make_instance(
        user, name="spender", command=script(SPENDER), checks=[{"name": "never", "command": check}],
        max_iterations=20,
    )
    run = services.run_start(instance=instance, user=user, objective="spend", max_cost_usd="0.12")
    run = drive_in_thread(run)
    assert (run.outcome, run.spent_micros) == ("budget_exhausted", 90_000)
    return run


def cap_field(html: str) -> re.Match | None:
    return re.search(r'<input[^>]*name="max_cost_usd"[^>]*id="run-\d+-resume-cap"[^>]*>|'
                     r'<input[^>]*id="run-\d+-resume-cap"[^>]*name="max_cost_usd"[^>]*>', html)


def resumed(run) -> int:
    return Event.objects.filter(run=run, kind="run.resumed").count()


def test_the_page_offers_a_cap_prefilled_and_says_what_is_left(signed_in, exhausted):
    html = signed_in.get(f"/runs/{exhausted.pk}/").content.decode()
    field = cap_field(html)
    assert field, "no field for a new cap"
    assert 'value="0.24"' in field.group(0)  # as much again as it had
    assert "Resume with a cap of $" in html and "Resume (budget raised)" not in html
    assert "It has used $0.09 of its $0.12 cap." in html
    assert "Left in the pools above it:" in html and "no limit" in html and "An iteration reserves $0.05 up front." in html


def test_a_resume_that_would_stop_at_once_is_refused_and_says_why(signed_in, exhausted):
    same = signed_in.post(f"/runs/{exhausted.pk}/resume", {"max_cost_usd": ""}, headers=HX)
    assert "resuming would stop it again at once" in same.content.decode()
    small = signed_in.post(f"/runs/{exhausted.pk}/resume", {"max_cost_usd": "0.13"}, headers=HX)
    text = small.content.decode()
    assert "it would stop again at once" in text and "Give at least $0.14" in text
    assert 'value="0.13"' in cap_field(text).group(0)  # what was typed stays
    lower = signed_in.post(f"/runs/{exhausted.pk}/resume", {"max_cost_usd": "0.10"}, headers=HX)
    assert "must be above its current cap of $0.12" in lower.content.decode()
    exhausted.refresh_from_db()
    assert (exhausted.status, exhausted.outcome, exhausted.max_cost_micros) == ("finished", "budget_exhausted", 120_000)
    assert resumed(exhausted) == 0


def test_resume_with_a_new_cap_raises_it_and_queues_the_run(signed_in, exhausted):
    answer = signed_in.post(f"/runs/{exhausted.pk}/resume", {"max_cost_usd": "0.24"}, headers=HX)
    assert "Resumed from its next iteration with a cap of $0.24." in answer.content.decode()
    exhausted.refresh_from_db()
    assert (exhausted.status, exhausted.max_cost_micros, exhausted.next_iteration) == ("queued", 240_000, 4)
    assert resumed(exhausted) == 1


def test_the_cap_is_bounded_by_the_pools(signed_in, exhausted, user):
    pool = budget_services.instance_pool(exhausted.instance)
    limits.set_limit(pool, pool.spent + pool.reserved + 100_000, user)  # $0.10 left above the run
    html = signed_in.get(f"/runs/{exhausted.pk}/").content.decode()
    assert 'value="0.19"' in cap_field(html).group(0)  # $0.09 used + the $0.10 the pools can grant
    assert "From $0.14 to $0.19 (what the pools can grant)" in html
    assert re.search(r"Left in the pools above it: .*“instance spender[^”]*” \$0\.10", html)
    over = signed_in.post(f"/runs/{exhausted.pk}/resume", {"max_cost_usd": "0.50"}, headers=HX)
    assert "is more than the pools allow" in over.content.decode() and "the most is $0.19" in over.content.decode()
    assert resumed(exhausted) == 0

    limits.set_limit(pool, pool.spent + pool.reserved + 10_000, user)  # $0.01: not one iteration
    html = signed_in.get(f"/runs/{exhausted.pk}/").content.decode()
    assert "has $0.01 left, and an iteration reserves $0.05: raise that pool" in html
    assert cap_field(html) is None
    refused = signed_in.post(f"/runs/{exhausted.pk}/resume", {"max_cost_usd": "1.00"}, headers=HX)
    assert "raise that pool" in refused.content.decode()
    exhausted.refresh_from_db()
    assert exhausted.outcome == "budget_exhausted" and resumed(exhausted) == 0
