"""The policy that sees progress, through the real runner, on the scripted agents of bench.stall_bench.

Each agent is an in-process brain leaving the workspace its script says; one real check (in the
sandbox) prints pytest's summary of what is left. `TETHER_STALL_ITERATIONS=0` is the classic policy.
"""

import pytest

from bench.stall_bench import CHECK
from loops import policy
from loops.memory import Memory
from loops.models import Event, Iteration, Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scripted(settings, user, make_instance):
    settings.TETHER_BRAINS = {"scripted": "bench.stall_bench.ScriptedBrain"}

    def build(agent, stale_after=3, max_iterations=12, **fields):
        settings.TETHER_STALL_ITERATIONS = stale_after
        return make_instance(
            user,
            name=agent,
            brain="scripted",
            max_iterations=max_iterations,
            checks=[{"name": "tests", "command": CHECK, "required": True}],
            **fields,
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


# --- stage 2: the rewind to the best iteration (the instance's rewind_on_stall) -------------------


def _tree(run, ref):
    from reviews import snapshots

    found = snapshots.repository(run.pk).references.get(f"refs/tether/{ref}")
    return str(found.target) if found is not None else ""


def test_a_run_that_makes_things_worse_is_rewound_to_its_best_iteration_and_recovers(scripted, start, drive):
    # 5, 3 (its best, iteration 2), then worse and worse: nudged in 5, rewound in 8, then it recovers.
    run = drive(start(scripted("worse-then-rewound", rewind_on_stall=True)))
    assert (run.outcome, run.verified, run.iterations_done) == ("done", True, 10)
    rewound = Event.objects.get(run=run, kind="stall.rewound").data
    assert (rewound["iteration"], rewound["to"], rewound["exact"]) == (8, 2, True)
    assert "refused" not in rewound
    # The files on disk are the best iteration's: the next act found its tree, and the workspace as
    # iteration 9 found it is the tree iteration 2 left (its snapshot), byte for byte.
    assert Iteration.objects.get(run=run, number=9).response.startswith("found tree 'w1';")
    assert _tree(run, "iteration-9") == _tree(run, "iteration-3") != ""
    # ... and what the rewind replaced is kept: the rollback's undo point is what iteration 8 left.
    assert rewound["undo"] == "rollback-1" and _tree(run, "rollback-1") not in ("", _tree(run, "iteration-3"))
    instruction = Iteration.objects.get(run=run, number=9).instruction
    assert instruction.startswith("The workspace was rewound:")
    assert "restored to the state iteration 2 left it in" in instruction and "different approach" in instruction
    assert Iteration.objects.get(run=run, number=6).instruction.startswith("Progress has stalled:")  # the nudge first
    # Recorded: in the run's memory (the stall stage, and the brief of the iteration it followed) and
    # as the rollback's own event and audit entry, by the run itself.
    memory = Memory.of(run.history)
    assert memory.stall == (policy.STALL_REWIND, 8)
    assert [s.get("rewound_to") for s in memory.snapshot if s.get("iteration") == 8] == [2]
    rolled = Event.objects.get(run=run, kind="workspace.rolled_back").data
    assert (rolled["to"], rolled["via"], rolled["by"]) == ("iteration-2", "system", f"run {run.pk} itself, stalled in iteration 8")
    from audit.models import AuditEntry

    entry = AuditEntry.objects.get(action="workspace.rollback", run_ref=run.pk)
    assert (entry.via, entry.user_id) == ("system", None)


def test_a_run_still_stuck_after_its_rewind_is_escalated_once_rewound(scripted, start, drive):
    run = drive(start(scripted("worse-stuck", rewind_on_stall=True, max_iterations=20)))
    assert (run.status, run.iterations_done) == (Run.Status.WAITING, 11)
    assert run.outcome_detail.startswith("stuck: the checks' count of what is left has not improved on 3 (iteration 2)")
    assert "after a nudge and a rewind in iteration 8 to its best iteration's workspace" in run.outcome_detail
    assert Event.objects.filter(run=run, kind="stall.rewound").count() == 1


def test_without_rewind_on_stall_the_run_is_never_rewound(scripted, start, drive):
    from instances.models import Instance

    assert Instance().rewind_on_stall is False  # off by default
    run = drive(start(scripted("worse-then-rewound")))
    assert (run.status, run.iterations_done) == (Run.Status.WAITING, 8)
    assert "after a nudge in iteration 5" in run.outcome_detail
    assert not Event.objects.filter(run=run, kind__in=["stall.rewound", "workspace.rolled_back"]).exists()
    assert Iteration.objects.get(run=run, number=8).response.startswith("found tree 'w6';")


@pytest.mark.parametrize(("agent", "ends"), [("steady-plateaus", 21), ("regress-revert", 6)])
def test_with_rewind_on_stall_a_steady_fixer_is_never_rewound_nor_stopped(scripted, start, drive, agent, ends):
    run = drive(start(scripted(agent, max_iterations=30, rewind_on_stall=True)))
    assert (run.outcome, run.verified, run.iterations_done) == ("done", True, ends)
    assert not Event.objects.filter(run=run, kind__in=["stall.rewound", "workspace.rolled_back"]).exists()
