"""The policy that sees progress, through the real runner, on the scripted agents of bench.stall_bench.

Each agent is an in-process brain leaving the workspace its script says; one real check (in the
sandbox) prints pytest's summary of what is left. `TETHER_STALL_ITERATIONS=0` is the classic policy.
"""

import pytest

from bench.stall_bench import CHECK
from loops.memory import Memory
from loops.models import Event, Iteration, Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scripted(settings, user, make_instance):
    settings.TETHER_BRAINS = {"scripted": "bench.stall_bench.ScriptedBrain"}

    def build(agent, stale_after=3, max_iterations=12):
        settings.TETHER_STALL_ITERATIONS = stale_after
        return make_instance(
            user,
            name=agent,
            brain="scripted",
            max_iterations=max_iterations,
            checks=[{"name": "tests", "command": CHECK, "required": True}],
        )

    return build


def test_a_churner_is_escalated_sooner_and_for_less_than_the_classic_policy_lets_it_spend(
    scripted, start, drive
):
    classic = drive(start(scripted("churner-7", stale_after=0)))
    assert (classic.outcome, classic.iterations_done) == ("max_iterations", 12)

    run = drive(start(scripted("churner-7")))
    assert (run.status, run.iterations_done) == (Run.Status.WAITING, 7)
    assert run.spent_micros < classic.spent_micros
    assert run.outcome_detail.startswith(
        "stuck: the checks' count of what is left has not improved on 7 (iteration 1)"
    )
    assert "forecast: not likely to converge" in run.outcome_detail
    question = Event.objects.get(run=run, kind="run.waiting").data["question"]
    assert question == run.outcome_detail
    # What repeats was said to the agent first: the nudge is iteration 5's instruction.
    assert Iteration.objects.get(run=run, number=5).instruction.startswith("Progress has stalled:")
    # The count is recorded per iteration: in its stored check results, its event and the run's memory.
    assert Iteration.objects.get(run=run, number=3).checks[0]["progress"] == 7
    finished = Event.objects.filter(run=run, kind="checks.finished").order_by("seq").first()
    assert finished.data["checks"][0]["progress"] == 7
    assert [count for _, count, _ in Memory.of(run.history).track] == [7] * 7


def test_an_answered_escalation_that_stays_stuck_stops_no_progress(scripted, start, drive, user):
    from loops import services

    run = drive(start(scripted("churner-7", max_iterations=20)))
    assert run.status == Run.Status.WAITING
    services.run_interject(run=run, user=user, text="Try the other module.")
    run = drive(run)
    assert (run.outcome, run.iterations_done) == ("no_progress", 10)
    assert "after a nudge and an escalation to a person (iteration 7)" in run.outcome_detail


def test_an_oscillation_between_three_trees_is_detected(scripted, start, drive):
    classic = drive(start(scripted("oscillator-ABC", stale_after=0, max_iterations=8)))
    assert classic.outcome == "max_iterations"
    run = drive(start(scripted("oscillator-ABC", max_iterations=8)))
    assert (run.status, run.iterations_done) == (Run.Status.WAITING, 5)
    assert "the workspace returned in iteration 5 to the state iteration 2 left it in" in run.outcome_detail
    assert "the workspace returned in iteration 4" in Iteration.objects.get(run=run, number=5).instruction


def test_a_steady_fixer_with_long_plateaus_is_nudged_but_never_stopped(scripted, start, drive):
    run = drive(start(scripted("steady-plateaus", max_iterations=30)))
    assert (run.outcome, run.verified, run.iterations_done) == ("done", True, 21)
    assert Iteration.objects.get(run=run, number=5).instruction.startswith("Progress has stalled:")


def test_a_revert_after_a_regression_goes_on_where_the_classic_policy_stopped_it(scripted, start, drive):
    classic = drive(start(scripted("regress-revert", stale_after=0)))
    assert classic.outcome == "no_progress"
    run = drive(start(scripted("regress-revert")))
    assert (run.outcome, run.verified, run.iterations_done) == ("done", True, 6)


def test_the_run_page_shows_the_progress_line_and_its_forecast_to_its_owner_only(
    scripted, start, drive, client, user, django_user_model
):
    run = drive(start(scripted("churner-7")))
    client.force_login(user)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "Left to fix by the checks&#x27; count: 7 after iteration 7 (from 7 after iteration 1)." in html
    assert "Forecast: not likely to converge: the count went from 7 to 7 over iterations 2–7." in html
    assert 'class="chart-progress-line"' in html and "Iteration 3: 7 left by the checks&#x27; count" in html
    client.force_login(django_user_model.objects.create_user("mallory"))
    other = client.get(f"/runs/{run.pk}/")
    assert other.status_code == 404 and b"Left to fix" not in other.content
